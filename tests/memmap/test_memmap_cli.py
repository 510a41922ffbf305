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
    result = CliRunner().invoke(main, ["memmap", *args])
    return result.exit_code, result.stdout, result.stderr


def test_json_is_exactly_the_issue_shape() -> None:
    code, out, _ = run(str(HYBRID), "--max-model-len", "512", "--json")
    assert code == 0
    data = json.loads(out)
    assert list(data) == ["dtypes"]
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


def test_table_conclusion_and_chart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = run(str(HYBRID), "--max-model-len", "512")
    assert code == 0
    assert "80,659" in out and "157.54x" in out
    assert "Mamba2 state" in out and "MLP (no KV)" in out
    assert ("Mamba2 state is 92% of each sequence's bytes at 512 tokens: fp8 changes capacity by 1.00x, "
            "and no KV dtype can raise capacity by more than 1.22x.") in " ".join(out.split())
    chart = tmp_path / "memmap.png"
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and chart.stat().st_size > 10_000
    assert "memmap.png" in err


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
