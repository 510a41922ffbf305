"""`kvprobe memmap`: JSON shape, table and chart output, and one clear line for bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvprobe.cli import main

HYBRID = Path(__file__).parents[1] / "fixtures" / "vllm-cpu" / "hybrid-nemotronh" / "config.json"
LLAMA = Path(__file__).parents[1] / "fixtures" / "configs" / "llama-3.1-8b.json"


def run(*args: str) -> tuple[int, str, str]:
    # wide enough that the lever grid's cells are not folded: these tests read its figures whole
    result = CliRunner(env={"COLUMNS": "200"}).invoke(main, ["memmap", *args])
    return result.exit_code, result.stdout, result.stderr


def test_json_is_exactly_the_issue_shape() -> None:
    code, out, _ = run(str(HYBRID), "--max-model-len", "512", "--json")
    assert code == 0
    data = json.loads(out)
    assert list(data) == ["platform", "dtypes", "lever"] and data["platform"] == "cpu"
    assert list(data["dtypes"]) == ["auto", "fp8"]
    for row in data["dtypes"].values():
        assert set(row) == {"kv_cache_tokens", "max_concurrency", "ratio", "bytes_per_sequence"}
        assert isinstance(row["kv_cache_tokens"], int)
        assert all(isinstance(v, int) for v in row["bytes_per_sequence"].values())
    assert data["dtypes"]["auto"]["kv_cache_tokens"] == data["dtypes"]["fp8"]["kv_cache_tokens"] == 80_659
    assert data["dtypes"]["fp8"]["ratio"] == 1.0
    # MLP blocks are listed, and hold nothing.
    assert data["dtypes"]["auto"]["bytes_per_sequence"]["mlp"] == 0
    assert data["dtypes"]["auto"]["bytes_per_sequence"]["mamba2"] > data["dtypes"]["auto"]["bytes_per_sequence"][
        "full_attention"]


def test_json_writes_no_chart_unless_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert run(str(HYBRID), "--json")[0] == 0
    assert list(tmp_path.iterdir()) == []
    assert run(str(HYBRID), "--json", "--chart", "c.png")[0] == 0
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "c-lever.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # named after --chart


def test_table_conclusion_and_chart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = run(str(HYBRID), "--max-model-len", "512")
    assert code == 0 and list(tmp_path.iterdir()) == []  # no chart unless told where
    code, out, err = run(str(HYBRID), "--max-model-len", "512", "--chart", "memmap.png")
    assert code == 0
    assert "80,659" in out and "157.54x" in out
    assert "Mamba2 state" in out and "MLP (no KV)" in out
    assert ("Mamba2 state is 92% of each sequence's bytes at 512 tokens: fp8 changes capacity by 1.00x, "
            "and no KV dtype can raise capacity by more than 1.22x.") in " ".join(out.split())
    chart = tmp_path / "memmap.png"
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and chart.stat().st_size > 10_000
    assert "chart: memmap.png" in err


def test_json_lever_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, _ = run(str(HYBRID), "--max-model-len", "512", "--json")
    assert code == 0
    lever = json.loads(out)["lever"]
    assert lever["knob"] == "mamba_ssm_cache_dtype"
    assert "the Mamba SSM state dtype is the lever: float16 is predicted to give 1.86x" in lever["sentence"]
    cells = {(c["kv_dtype"], c["ssm_dtype"]): c["kv_cache_tokens"] for c in lever["grid"]}
    assert cells[("auto", "float32")] == 80_659 and cells[("auto", "float16")] == 149_796
    assert list(tmp_path.iterdir()) == []  # --json alone writes neither chart
    # The CLI's settings reach the grid: prefix caching off.
    off = json.loads(run(str(HYBRID), "--max-model-len", "512", "--mamba-cache-mode", "none", "--json")[1])["lever"]
    assert off["mamba_cache_mode"] == "none"
    assert {(c["kv_dtype"], c["ssm_dtype"]): c["kv_cache_tokens"] for c in off["grid"]}[("auto", "float16")] == 349_525


def test_table_prints_the_grid_and_the_lever(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = run(str(HYBRID), "--max-model-len", "8192", "--lever-chart", "grid.png")
    assert code == 0
    flat = " ".join(out.split())
    assert "--kv-cache-dtype x --mamba-ssm-cache-dtype" in flat
    assert "599,186 (1.00x) ref" in flat and "762,600 (1.27x)" in flat and "1,198,372 (2.00x)" in flat
    assert ("lever: At 8,192 tokens with prefix caching on, both knobs move capacity and KV dtype is the larger "
            "lever: fp8 is predicted to give 1.40x") in flat
    assert "With prefix caching off (`--no-enable-prefix-caching`, mamba_cache_mode none)" in flat
    grid = tmp_path / "grid.png"
    assert grid.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and grid.stat().st_size > 10_000
    assert "lever chart: grid.png" in err and "chart: memmap.png" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["grid.png"]


def test_a_dense_model_has_no_grid_and_no_lever_chart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = run(str(LLAMA), "--max-model-len", "8192", "--chart", "memmap.png")
    assert code == 0
    assert "mamba-ssm-cache-dtype" not in out and "lever:" not in out
    assert "lever chart" not in err
    assert [p.name for p in tmp_path.iterdir()] == ["memmap.png"]
    lever = json.loads(run(str(LLAMA), "--max-model-len", "8192", "--json")[1])["lever"]
    assert lever["ssm_dtypes"] == [] and lever["knob"] == "kv_cache_dtype"
    assert "KV dtype is the whole lever" in lever["sentence"]


def test_an_unwritable_lever_chart_is_one_clear_line(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    code, _, err = run(str(HYBRID), "--json", "--lever-chart", str(blocker / "x.png"))
    assert code == 2
    assert err.strip().startswith(f"error: --lever-chart {blocker / 'x.png'}: cannot write the chart")


def test_kv_memory_accepts_units() -> None:
    one = json.loads(run(str(LLAMA), "--max-model-len", "8192", "--json")[1])
    two = json.loads(run(str(LLAMA), "--max-model-len", "8192", "--kv-memory", "2GiB", "--json")[1])
    raw = json.loads(run(str(LLAMA), "--max-model-len", "8192", "--kv-memory", str(2 << 30), "--json")[1])
    assert two["dtypes"]["auto"]["kv_cache_tokens"] == 2 * one["dtypes"]["auto"]["kv_cache_tokens"]
    assert raw == two


@pytest.mark.parametrize(("args", "message"), [
    (["missing.json"], "missing.json: cannot read the model config"),
    (["{bad}", "--kv-dtype", "auto,bogus"], "--kv-dtype 'bogus': no byte model for it"),
    (["{bad}", "--kv-memory", "lots"], "--kv-memory: 'lots' is not a size"),
    (["{bad}", "--kv-memory", "1KiB"], "--kv-memory 1024: smaller than one block"),
    (["{notjson}"], "not valid JSON"),
    (["{noheads}"], "field num_attention_heads or n_head is missing"),
    (["{nolength}"], "no max_position_embeddings: pass --max-model-len"),
    (["{bad}", "--kv-dtype", "fp8_ds_mla"], "an MLA-only format"),
])
def test_bad_input_is_one_clear_line(tmp_path: Path, args: list[str], message: str) -> None:
    notjson = tmp_path / "notjson.json"
    notjson.write_text("{nope")
    noheads = tmp_path / "noheads.json"
    noheads.write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64}))
    nolength = tmp_path / "nolength.json"
    nolength.write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64,
                                    "num_attention_heads": 4}))
    paths = {"bad": str(LLAMA), "notjson": str(notjson), "noheads": str(noheads), "nolength": str(nolength)}
    args = [a.format(**paths) for a in args]
    code, out, err = run(*args, "--json")
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:")
    assert message in lines[0]


@pytest.mark.parametrize("columns", ["60", "80", "100"])
def test_tables_fold_rather_than_cut_a_number(columns: str) -> None:
    result = CliRunner(env={"COLUMNS": columns}).invoke(main, ["memmap", str(HYBRID), "--max-model-len", "8192"])
    assert result.exit_code == 0, result.output
    assert "…" not in result.stdout and all(len(line) <= int(columns) for line in result.stdout.splitlines())
    assert "599,186" in result.stdout and "838,860" in result.stdout


@pytest.mark.parametrize("columns", [80, 120])
def test_a_title_is_wrapped_at_the_terminal_not_at_its_table_and_the_scaling_is_said(columns: int) -> None:
    """rich wraps a table's title at the table's width: 'memory' fell alone onto a second line at 120 columns."""
    result = CliRunner(env={"COLUMNS": str(columns)}).invoke(main, ["memmap", str(LLAMA), "--max-model-len", "8192"])
    lines = result.stdout.splitlines()
    title = "Predicted KV capacity: configs at max_model_len 8,192, 1.00 GiB KV memory"
    if columns >= len(title):
        assert title in lines
    assert " ".join(" ".join(lines).split()).count(title) == 1 and all(len(line) <= columns for line in lines)
    assert all(line == line.rstrip() for line in lines[:3])  # the answer: wrapped between words, not padded
    said = " ".join(" ".join(lines).split())
    assert "KV tokens scale with --kv-memory and the ratios hold at any size" in said


@pytest.mark.parametrize("config", [HYBRID, LLAMA], ids=["hybrid", "dense"])
def test_the_answer_comes_before_the_tables(config: Path) -> None:
    """KV tokens per dtype, what binds the pool and (a hybrid) the lever are the first lines; every table after."""
    code, out, _ = run(str(config), "--max-model-len", "512" if config == HYBRID else "8192")
    assert code == 0
    answer, _, details = out.partition("\n\n")
    lines = answer.splitlines()
    name = "hybrid-nemotronh" if config == HYBRID else "configs"
    expected: list[str]
    if config == HYBRID:
        expected = [
            f"{name} at max_model_len 512, 1.00 GiB KV memory (cpu): auto 80,659 KV tokens (reference) · fp8 80,659 "
            "KV tokens (1.00x)",
            "Mamba2 state is 92% of each sequence's bytes at 512 tokens: fp8 changes capacity by 1.00x, and no KV "
            "dtype can raise capacity by more than 1.22x.",
            "lever: At 512 tokens with prefix caching on, KV dtype changes capacity by 1.00x (fp8) and the Mamba SSM "
            "state dtype is the lever: float16 is predicted to give 1.86x (`--mamba-ssm-cache-dtype float16`), as "
            "Mamba2 state is 92% of each sequence's bytes."]
    else:  # a dense model: no lever line
        expected = [
            f"{name} at max_model_len 8,192, 1.00 GiB KV memory (cpu): auto 8,192 KV tokens (reference) · fp8 16,384 "
            "KV tokens (2.00x)",
            "Full-attention KV is all of each sequence's bytes at 8,192 tokens: KV dtype is the whole lever (fp8 gives "
            "2.00x the auto capacity)."]
    assert " ".join(answer.split()) == " ".join(expected)  # the console folds a long sentence; the words stand
    assert all(any(line.startswith(e[:40]) for line in lines) for e in expected)  # each on a line of its own
    assert not any(c in answer for c in "┏┃│")  # no table in the answer
    assert details.lstrip().startswith("Predicted KV capacity:") and "lever:" not in details


def _config(tmp_path: Path, **fields: object) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**json.loads(LLAMA.read_text()), **fields}))
    return path


def test_a_length_past_the_models_own_is_refused_naming_the_limit_and_the_fix(tmp_path: Path) -> None:
    config = _config(tmp_path, max_position_embeddings=8192)
    for args in ([], ["--json"]):
        code, out, err = run(str(config), "--max-model-len", "16384", *args)
        assert (code, out) == (2, "")
        assert err.splitlines() == [
            f"error: --max-model-len 16384 is past {config.parent.name}'s 8,192 tokens (max_position_embeddings 8,192 "
            f"in {config}): vLLM refuses a longer one; give --max-model-len 8192 or less"]
    assert run(str(config), "--max-model-len", "8192", "--json")[0] == 0  # the model's own length is fine


@pytest.mark.parametrize(("rope", "longest"), [
    ({"rope_type": "linear", "factor": 4.0}, 32768),  # vLLM stretches the length by the factor
    ({"type": "dynamic", "factor": 2}, 16384),  # the older spelling of the key
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048}, 8192),  # already scaled
    ({"rope_type": "llama3", "factor": 8.0}, 8192),
])
def test_a_rope_factor_vllm_applies_moves_the_limit(tmp_path: Path, rope: dict, longest: int) -> None:
    config = _config(tmp_path, max_position_embeddings=8192, rope_scaling=rope)
    assert run(str(config), "--max-model-len", str(longest), "--json")[0] == 0
    code, _, err = run(str(config), "--max-model-len", str(longest + 1), "--json")
    assert code == 2 and f"give --max-model-len {longest} or less" in err
    if longest != 8192:
        assert f"max_position_embeddings 8,192 x rope scaling factor {rope['factor']:g} in" in err
