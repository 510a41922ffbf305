"""`kvprobe check servers.toml`: the plan of a good config, one line per problem of a bad one (exit 2), and
`--reach` against replayed real captures. Nothing is measured: no test here starts a server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner, Result
from replay import FIXTURES, MultiReplay, Replay

from kvprobe.cli import main
from kvprobe.evaluate import plan as plan_mod

LLAMA_CONFIG = Path(__file__).parents[2] / "demo" / "models" / "needle-llama" / "config.json"
SECRET = "sk-check-never-printed-0451"

SERVERS = """
[[server]]
name = "auto"
url = "http://127.0.0.1:8101"
role = "reference"
api_key_env = "KVPROBE_CHECK_KEY"

[[server]]
name = "fp8"
url = "http://127.0.0.1:8102/v1"
role = "candidate"
"""
SHIPPED_LOAD = "[load]\nmax_blocks = 64\nbudget_s = 2400\n"


def write(tmp_path: Path, text: str, name: str = "servers.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def check(*args: str, columns: int = 1000) -> Result:
    """A plan line per line (wide enough that none wraps), unless `columns` says the width."""
    return CliRunner(env={"COLUMNS": str(columns)}).invoke(main, ["check", *args], catch_exceptions=False)


def error_lines(result: Result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.strip()]


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVPROBE_CHECK_KEY", SECRET)


def test_the_servers_file_is_an_argument_or_servers_on_every_command_that_reads_it(tmp_path: Path) -> None:
    """A user who ran `eval --servers F` types `check --servers F`, and the other way round: both work, each
    command names what is missing or doubled in one line, exit 2."""
    path = str(write(tmp_path, SERVERS))
    assert check(path).stdout == check("--servers", path).stdout
    assert check(path, "--servers", path).exit_code == 0  # the same file twice is one file
    missing = tmp_path / "none.toml"
    for command in ("check", "eval", "canary"):
        for args in ([str(missing)], ["--servers", str(missing)]):
            result = CliRunner().invoke(main, [command, *args])
            assert result.exit_code == 2 and error_lines(result) == [f"error: {missing}: cannot read: No such "
                                                                     "file or directory"], result.output
        result = CliRunner().invoke(main, [command])
        assert result.exit_code == 2
        assert error_lines(result) == [f"error: no servers file: kvprobe {command} --servers servers.toml"]
        result = CliRunner().invoke(main, [command, "a.toml", "--servers", "b.toml"])
        assert error_lines(result) == ["error: two servers files, a.toml and --servers b.toml: give one"]


def test_a_good_config_prints_the_plan_and_exits_0(tmp_path: Path) -> None:
    result = check(str(write(tmp_path, SERVERS)), "--max-model-len", "8192")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "servers.toml: valid; nothing was measured" in out
    assert "knob: kv_cache_dtype" in out
    auto = next(line for line in out.splitlines() if line.strip().startswith("auto "))
    assert "127.0.0.1:8101" in auto and "reference" in auto and "API key from $KVPROBE_CHECK_KEY (set)" in auto
    fp8 = next(line for line in out.splitlines() if line.strip().startswith("fp8 "))
    assert "127.0.0.1:8102" in fp8 and "candidate" in fp8 and "no API key" in fp8
    assert "probes (the default set): capacity, perplexity, agreement, needle, load" in out
    # the sizes eval would plan at this context: the needle grid as the recorded AVX2 demo run placed it
    assert "180 needles over 36 length(s) (1,024-7,168 tokens) x 5 depth(s), answer cap 1,024 tokens" in out
    assert "17 passages (shipped kvprobe_ppl)" in out
    assert "looks at 8, 12, 16, 20" in out
    assert "bars: perplexity_delta_max 0.01" in out
    assert "estimate (rough):" in out and "assumed: no server was measured" in out
    assert SECRET not in result.output


@pytest.mark.parametrize("columns", [80, 100])
def test_the_plan_takes_the_terminal_width(tmp_path: Path, columns: int) -> None:
    """COLUMNS is the plan's width: each line wraps between words, its continuation indented under it, and says
    word for word what the unwrapped plan says; the servers' aligned columns stay aligned."""
    deep = tmp_path / "a-directory-whose-name-alone-makes-the-path-wider-than-eighty-columns"
    deep.mkdir()
    servers = write(deep, SERVERS)
    wide = check(str(servers), "--max-model-len", "8192").stdout.splitlines()
    narrow = check(str(servers), "--max-model-len", "8192", columns=columns).stdout.splitlines()
    assert max(len(line) for line in wide) > 200  # the estimate line, unwrapped
    long_words = [line for line in narrow if len(line) > columns]
    assert all(len(line.split()) == 1 for line in long_words), long_words  # only a path wider than the line
    assert " ".join(narrow).split() == " ".join(wide).split()
    assert [line for line in narrow if line.startswith("  auto ")] == [line for line in wide
                                                                       if line.startswith("  auto ")]
    estimate = next(i for i, line in enumerate(narrow) if line.startswith("estimate (rough): "))
    assert narrow[estimate + 1].startswith("    ") and not narrow[estimate + 1].startswith("     ")


def test_the_plan_as_json(tmp_path: Path) -> None:
    result = check(str(write(tmp_path, SERVERS)), "--max-model-len", "8192", "--json",
                   "--probes", "needle,capacity,load")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert SECRET not in result.stdout
    assert data["valid"] is True and data["problems"] == []
    assert data["knob"] == "kv_cache_dtype" and data["reference"] == "auto"
    assert data["servers"][0] == {"name": "auto", "url": "http://127.0.0.1:8101", "host_port": "127.0.0.1:8101",
                                  "role": "reference", "api_key_env": "KVPROBE_CHECK_KEY", "api_key_set": True,
                                  "model": None, "headers": [], "timeout_s": 600.0}
    assert data["servers"][1]["url"] == "http://127.0.0.1:8102" and data["servers"][1]["api_key_set"] is None
    assert data["probes"] == ["capacity", "needle", "load"] and data["probes_chosen_by"] == "--probes"
    needle = data["settings"]["needle"]
    assert needle["count"] == 180 and len(needle["lengths"]) == 36
    assert needle["lengths"][0] == 1024 and needle["lengths"][-1] == 7168
    assert needle["depths"] == [0.0, 0.25, 0.5, 0.75, 1.0] and needle["max_tokens"] == 1024
    load = data["settings"]["load"]
    assert load["design"] == "sequential" and load["looks"] == [8, 12, 16, 20]
    assert load["shapes"][0]["agents"] == [1, 2, 4, 8, 16] and load["shapes"][0]["last_turn_tokens"] > 1024
    assert data["max_model_len"] == {"value": 8192, "source": "--max-model-len",
                                     "per_server": {"auto": 8192, "fp8": 8192}}
    est = data["estimate"]
    assert est["rough"] is True and 0 < est["low_s"] <= est["high_s"]
    assert set(est["by_probe"]) == {"inventory", "needle", "load"}
    assert data["not_measured"] == {} and data["reach"] is None and data["sizing"] == []
    assert set(data["bars"]) >= {"perplexity_delta_max", "needle_recall_drop_max", "capacity_gain_min"}


def test_the_plan_says_its_power_and_the_shipped_sizes_reach_0_8(tmp_path: Path) -> None:
    """The default probes on two servers: perplexity, the two needle checks and the speed endpoint gate;
    each figure is the project's own function's, and their product reaches 0.8 at the shipped sizes (the
    shipped servers.toml's 64 blocks: the config's own default of 20 does not at the CPU demos' spread)."""
    from kvprobe.evaluate.power_plan import binary_pass, perplexity_pass

    result = check(str(write(tmp_path, SHIPPED_LOAD + SERVERS)), "--max-model-len", "8192", "--json")
    assert result.exit_code == 0, result.output
    power = json.loads(result.stdout)["power"]
    p = {c["id"]: c["p_pass"] for c in power["checks"]}
    assert list(p) == ["perplexity.delta", "needle.recall_drop", "needle.truncation_rise",
                       "load.endpoint.throughput_drop"]
    assert p["needle.recall_drop"] == p["needle.truncation_rise"] == binary_pass(180, 0.10, 0.05)
    assert p["perplexity.delta"] == perplexity_pass(17, 0.01)
    assert power["p_adopt_equal"] == pytest.approx(p["perplexity.delta"] * p["needle.recall_drop"] ** 2
                                                   * p["load.endpoint.throughput_drop"])
    assert power["p_adopt_equal"] >= 0.8 and power["reaches_target"] is True and power["independent"] is True
    assert power["assumed"]["disagreement"] == 0.05 and power["assumed"]["block_spread"] == 0.049
    assert power["would_reach"] is None
    text = check(str(write(tmp_path, SHIPPED_LOAD + SERVERS)), "--max-model-len", "8192").stdout
    assert f"power: P(adopt | equal) = {power['p_adopt_equal']:.3f}" in text and "cannot reach" not in text


def test_a_plan_under_0_8_says_the_sizes_that_would_reach_it(tmp_path: Path) -> None:
    config = write(tmp_path, SHIPPED_LOAD + "[needle]\ncount = 40\n" + SERVERS)
    result = check(str(config), "--max-model-len", "8192", "--json")
    assert result.exit_code == 0, result.output
    power = json.loads(result.stdout)["power"]
    assert power["p_adopt_equal"] < 0.8 and power["reaches_target"] is False
    would = power["would_reach"]
    assert would["p_adopt_equal"] >= 0.8 and would["why_not"] is None
    needle = next(s for s in would["sizes"] if s["setting"] == "needle.count")
    assert needle["have"] == 40 and needle["need"] > 40
    assert len(needle["seconds_need"]) == 2 and needle["seconds_need"][1] > needle["seconds_have"][1] > 0
    text = check(str(config), "--max-model-len", "8192").stdout
    assert f"power: P(adopt | equal) = {power['p_adopt_equal']:.3f}" in text
    assert "power: cannot reach 0.8: " in text and f"needle.count 40 -> {needle['need']}" in text


def test_sizes_that_cannot_pass_a_bar_are_said_as_eval_says_them(tmp_path: Path) -> None:
    result = check(str(write(tmp_path, "[needle]\ncount = 20\n" + SERVERS)), "--max-model-len", "8192")
    assert result.exit_code == 0, result.output
    assert "sizing: needle.count = 20 cannot pass needle_recall_drop_max = 0.1" in result.stdout


def test_without_a_context_the_fit_is_not_checked_and_it_says_so(tmp_path: Path) -> None:
    result = check(str(write(tmp_path, SERVERS)), "--json")
    data = json.loads(result.stdout)
    assert result.exit_code == 0
    assert data["max_model_len"]["source"] is None and data["settings"]["needle"]["lengths"] is None
    assert data["estimate"]["assumed"]["max_model_len"] == 8192
    text = check(str(write(tmp_path, SERVERS))).stdout
    assert "max_model_len: not known, so whether the probe settings fit the servers is not checked" in text


def test_a_default_that_cannot_fit_is_not_measured_as_eval_would_say(tmp_path: Path) -> None:
    result = check(str(write(tmp_path, SERVERS)), "--max-model-len", "512")
    assert result.exit_code == 0, result.output
    assert ("needle      not measured: its default answer cap (max_tokens 1024) leaves 0 tokens for a prompt "
            "within max_model_len 512") in result.stdout
    assert "load        not measured: its default shape needs about" in result.stdout


def test_the_model_configs_context_bounds_what_a_server_of_it_can_serve(tmp_path: Path) -> None:
    text = f'model_config = "{LLAMA_CONFIG}"\n[needle]\nmax_tokens = 8190\n' + SERVERS
    result = check(str(write(tmp_path, text)))
    assert result.exit_code == 2
    assert error_lines(result) == [
        "error: needle.max_tokens = 8190 leaves 2 tokens for the prompt within max_model_len 8192 of server "
        "'auto': lower needle.max_tokens"]
    fine = check(str(write(tmp_path, f'model_config = "{LLAMA_CONFIG}"\n' + SERVERS)), "--json")
    data = json.loads(fine.stdout)
    assert fine.exit_code == 0 and data["model_config"]["max_position_embeddings"] == 8192
    assert data["max_model_len"]["value"] == 8192 and "max_position_embeddings" in data["max_model_len"]["source"]


@pytest.mark.parametrize(("text", "args", "expected"), [
    ("knob = \n" + SERVERS, [], ["not valid TOML"]),
    ("[bars]\nperplexity_delta_mx = 0.01\n" + SERVERS, [],
     ["bars.perplexity_delta_mx: unknown key: did you mean 'perplexity_delta_max'?"]),
    ('model_config = "no/such/config.json"\n' + SERVERS, [],
     ["no/such/config.json: no such file: give the model's Hugging Face config.json"]),
    # said once: the tasks probe's fit check, which loads the task again, is not asked
    ('[tasks]\nnames = ["no_such_task"]\n' + SERVERS, ["--max-model-len", "8192"],
     ["tasks: 'no_such_task': no such lm-eval task"]),
    ("[needle]\nmax_tokens = 1024\n[load]\nturns = 8\n" + SERVERS, ["--max-model-len", "512"],
     ["needle.max_tokens = 1024 leaves 0 tokens for the prompt within max_model_len 512",
      "load: shape 'default': the last turn needs about"]),
    ("[needle]\nlengths = [4000]\n" + SERVERS, ["--max-model-len", "4096"],
     ["needle.lengths: 4000 tokens + max_tokens 1024 = 5024 is over max_model_len 4096"]),
    (SERVERS, ["--probes", "capacity,needles"], ["--probes: unknown probe(s) needles"]),
])
def test_each_problem_is_one_line_and_exit_2(tmp_path: Path, text: str, args: list[str],
                                             expected: list[str]) -> None:
    result = check(str(write(tmp_path, text)), *args)
    assert result.exit_code == 2, result.output
    lines = error_lines(result)
    assert len(lines) == len(expected), lines
    for line, part in zip(lines, expected, strict=True):
        assert line.startswith("error: ") and part in line, (line, part)
    assert result.stdout == ""
    assert SECRET not in result.output


# -- files that cannot answer: refused (exit 2) or warned about, one line each ----------------------

def _refused(result: Result) -> str:
    assert result.exit_code == 2, result.output
    (line,) = error_lines(result)
    assert result.stdout == ""
    return line.removeprefix("error: ")


def test_no_candidate_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, SERVERS.split("[[server]]\nname = \"fp8\"")[0])
    assert _refused(check(str(path))) == (f"{path}: server: no candidate to compare with the reference auto: add a "
                                          "[[server]] with role = \"candidate\" (the default)")


def test_the_reference_and_a_candidate_at_one_url_are_refused(tmp_path: Path) -> None:
    path = write(tmp_path, SERVERS.replace("8102/v1", "8101"))
    assert _refused(check(str(path))) == (
        f"{path}: server[1].url: fp8 and auto are the same server (http://127.0.0.1:8101): a server compared with "
        "itself measures only noise; point each [[server]] at its own server")


@pytest.mark.parametrize(("bar", "said"), [
    ("1", "= 1 reads as +100%: write 0.01 for 1%, or set allow_large_bars = true"),
    ("5", "= 5 reads as +500%: write 0.05 for 5%, or set allow_large_bars = true"),
])
def test_a_perplexity_bar_read_as_hundreds_of_percent_is_refused(tmp_path: Path, bar: str, said: str) -> None:
    path = write(tmp_path, f"[bars]\nperplexity_delta_max = {bar}\n" + SERVERS)
    assert _refused(check(str(path))) == f"{path}: bars.perplexity_delta_max {said}"
    fine = check(str(write(tmp_path, f"[bars]\nperplexity_delta_max = {bar}\nallow_large_bars = true\n" + SERVERS)))
    assert fine.exit_code == 0, fine.output


def test_a_mistyped_knob_is_refused_with_the_knob_it_is_a_slip_of(tmp_path: Path) -> None:
    path = write(tmp_path, 'knob = "kv_cache_dtyp"\n' + SERVERS)
    assert _refused(check(str(path))) == f"{path}: knob: 'kv_cache_dtyp' is not a knob: did you mean kv_cache_dtype?"


def test_a_knob_kvprobe_does_not_know_is_a_warning(tmp_path: Path) -> None:
    path = write(tmp_path, 'knob = "attention_sink_dtype"\n' + SERVERS)
    result = check(str(path), "--max-model-len", "8192")
    assert result.exit_code == 0, result.output
    assert error_lines(result) == [
        f"warning: {path}: knob: 'attention_sink_dtype' is not a setting kvprobe knows (kv_cache_dtype, "
        "mamba_ssm_cache_dtype, mamba_cache_dtype, or a vllm:cache_config_info label such as cache_dtype): eval "
        "reads it as a label of that name, and says so when a server has none"]
    assert f"{path}: valid, with 1 warning(s) (on stderr); nothing was measured" in result.stdout


def test_a_url_with_an_api_path_is_refused_naming_the_path(tmp_path: Path) -> None:
    path = write(tmp_path, SERVERS.replace("http://127.0.0.1:8102/v1", "http://127.0.0.1:8102/v1/chat/completions"))
    assert _refused(check(str(path))) == (
        f"{path}: server[1].url: the path /v1/chat/completions is not part of a server's address: give "
        "http://127.0.0.1:8102 (with or without /v1): kvprobe adds the API paths itself")


def test_a_plan_that_leaves_declared_bars_unmeasured_says_it_cannot_reach_adopt(tmp_path: Path) -> None:
    result = check(str(write(tmp_path, "[tasks]\n" + SERVERS)), "--max-model-len", "512")
    assert result.exit_code == 0, result.output
    lines = error_lines(result)
    assert [line.split(", not measured here: ")[0] for line in lines] == [
        "warning: this plan cannot reach adopt: needle_recall_drop_max and truncation_rise_max need the needle probe",
        "warning: this plan cannot reach adopt: task_accuracy_drop_max and truncation_rise_max need the tasks probe",
        "warning: this plan cannot reach adopt: throughput_drop_max needs the load probe"]
    assert lines[0].endswith("set [needle] max_tokens (e.g. 128) to measure it")
    assert "valid, with 3 warning(s)" in result.stdout
    data = json.loads(check(str(write(tmp_path, "[tasks]\n" + SERVERS)), "--max-model-len", "512", "--json").stdout)
    assert data["warnings"] == [line.removeprefix("warning: ") for line in lines]
    first_look = check(str(write(tmp_path, SERVERS)), "--probes", "capacity,perplexity", "--max-model-len", "8192")
    assert first_look.exit_code == 0
    assert error_lines(first_look)[0] == ("warning: this plan cannot reach adopt: needle_recall_drop_max and "
                                          "truncation_rise_max need the needle probe, which --probes leaves out: "
                                          "add it, or read the run as a first look")


def test_an_unset_key_variable_is_a_warning_naming_it(tmp_path: Path) -> None:
    path = write(tmp_path, SERVERS.replace("KVPROBE_CHECK_KEY", "KVPROBE_CHECK_UNSET"))
    result = check(str(path), "--max-model-len", "8192")
    assert result.exit_code == 0, result.output
    assert error_lines(result) == [f"warning: {path}: server[0].api_key_env: KVPROBE_CHECK_UNSET is not set, so auto "
                                   "is sent no API key: export it if auto needs one"]
    assert "API key from $KVPROBE_CHECK_UNSET (not set)" in result.stdout


def _port_80000(tmp_path: Path) -> Path:
    return write(tmp_path, SERVERS.replace("http://127.0.0.1:8102/v1", "http://10.0.0.6:80000"))


def test_a_port_out_of_range_is_one_line_in_check(tmp_path: Path) -> None:
    path = _port_80000(tmp_path)
    assert _refused(check(str(path))) == f"{path}: server[1].url: port 80000 is out of range: a port is 1-65535"


def test_a_port_out_of_range_stops_eval_before_any_server_is_asked(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from kvprobe.server import client

    def no_server(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("eval made a client for a servers.toml it should have refused")

    monkeypatch.setattr(client.Client, "__init__", no_server)
    path, out = _port_80000(tmp_path), tmp_path / "run"
    result = CliRunner().invoke(main, ["eval", "--servers", str(path), "--out", str(out)], catch_exceptions=False)
    assert result.exit_code == 2, result.output
    assert error_lines(result) == [f"error: {path}: server[1].url: port 80000 is out of range: a port is 1-65535"]
    assert not out.exists()


def test_problems_as_json(tmp_path: Path) -> None:
    bad = check(str(write(tmp_path, "[bars]\nbogus = 1\n" + SERVERS)), "--json")
    assert bad.exit_code == 2
    assert json.loads(bad.stdout) == {"servers_file": str(tmp_path / "servers.toml"), "valid": False,
                                      "problems": [f"{tmp_path / 'servers.toml'}: bars.bogus: unknown key: remove "
                                                   "it ([bars] takes allow_large_bars, perplexity_delta_max, "
                                                   "needle_recall_drop_max, truncation_rise_max, capacity_gain_min, "
                                                   "throughput_drop_max, p99_latency_rise_max, kl_mean_max, "
                                                   "task_accuracy_drop_max, top1_agreement_min)"]}
    late = check(str(write(tmp_path, "[needle]\nmax_tokens = 1024\n" + SERVERS)), "--json", "--max-model-len", "512")
    data = json.loads(late.stdout)
    assert late.exit_code == 2 and data["valid"] is False and data["estimate"] is None
    assert data["problems"] == [line.removeprefix("error: ") for line in error_lines(late)]


# -- --reach, against replayed captures of real vLLM servers ---------------------------------------

def _hybrid_models(request: httpx.Request) -> httpx.Response:
    body = (FIXTURES / "hybrid-nemotronh" / "models-auto-maxlen512.json").read_bytes()
    return httpx.Response(200, content=body, headers={"content-type": "application/json"})


def _reach_through(monkeypatch: pytest.MonkeyPatch, servers: dict[str, Any]) -> list[tuple[str, str]]:
    multi = MultiReplay(servers)
    seen: list[tuple[str, str]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.method, request.url.path))
        return multi(request)

    real = plan_mod.reach
    monkeypatch.setattr(plan_mod, "reach", lambda config: real(config, httpx.MockTransport(handler)))
    return seen


def test_reach_reads_health_and_models_and_fits_the_probes_to_what_the_servers_serve(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    auto, fp8 = Replay("auto-8101"), Replay("fp8-8102")
    fp8.routes[("GET", "/v1/models")] = _hybrid_models  # a 512-token server: the default needle cap cannot fit
    seen = _reach_through(monkeypatch, {"127.0.0.1:8101": auto, "127.0.0.1:8102": fp8})
    result = check(str(write(tmp_path, SERVERS)), "--reach")
    assert result.exit_code == 0, result.output
    assert {path for _, path in seen} == {"/health", "/v1/models"}  # nothing measured: no prompt, no /metrics
    assert "reach: auto: /health ok; /v1/models" in result.stdout
    assert "reach: fp8: /health ok; /v1/models tiny-hybrid (max_model_len 512)" in result.stdout
    assert "needle      not measured: its default answer cap (max_tokens 1024) leaves 0 tokens for a prompt " \
           "within max_model_len 512 of server 'fp8'" in result.stdout
    data = json.loads(check(str(write(tmp_path, SERVERS)), "--reach", "--json").stdout)
    assert data["max_model_len"]["source"] == "/v1/models (--reach)"
    assert [r["ok"] for r in data["reach"]] == [True, True] and data["reach"][1]["max_model_len"] == 512


def test_reach_says_each_unreachable_or_refusing_server_in_one_line(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    auto = Replay("auto-8101")
    auto.routes[("GET", "/health")] = lambda r: httpx.Response(401, json={"error": "invalid api key"})
    _reach_through(monkeypatch, {"127.0.0.1:8101": auto})  # nothing listens on 8102
    result = check(str(write(tmp_path, SERVERS)), "--reach")
    assert result.exit_code == 2 and result.stdout == ""
    lines = error_lines(result)
    assert len(lines) == 2, lines
    assert lines[0].startswith("error: auto: HTTP 401 /health") and "check the API key" in lines[0]
    assert lines[1].startswith("error: fp8: cannot reach http://127.0.0.1:8102/health")
    assert SECRET not in result.output


def test_reach_names_an_unset_key_variable_when_a_server_refuses_without_a_key(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    auto = Replay("auto-8101")
    auto.routes[("GET", "/health")] = lambda r: httpx.Response(401, json={"error": "invalid api key"})
    _reach_through(monkeypatch, {"127.0.0.1:8101": auto, "127.0.0.1:8102": Replay("fp8-8102")})
    result = check(str(write(tmp_path, SERVERS.replace("KVPROBE_CHECK_KEY", "KVPROBE_CHECK_UNSET"))), "--reach")
    assert result.exit_code == 2
    (line,) = [line for line in error_lines(result) if line.startswith("error: ")]
    assert line.startswith("error: auto: HTTP 401 /health") and line.endswith(
        "KVPROBE_CHECK_UNSET (api_key_env) is not set: export it with auto's API key")


def test_reach_refuses_a_model_the_server_does_not_serve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _reach_through(monkeypatch, {"127.0.0.1:8101": Replay("auto-8101"), "127.0.0.1:8102": Replay("fp8-8102")})
    text = SERVERS.replace('role = "candidate"', 'role = "candidate"\nmodel = "not-served"')
    result = check(str(write(tmp_path, text)), "--reach")
    assert result.exit_code == 2
    (line,) = error_lines(result)
    assert line.startswith("error: fp8: model 'not-served' (servers.toml) is not among /v1/models")


def test_every_registered_probe_is_planned_worded_costed_and_powered(tmp_path: Path) -> None:
    """The plan's per-probe switches (settings, their line, the rough time, the power of each gating bar)
    follow kvprobe.probes.PROBES: a probe added to the registry and missed in one of them fails here."""
    from kvprobe.config import parse_config
    from kvprobe.probes import PROBES

    servers = write(tmp_path, SERVERS + '\n[tasks]\nnames = ["kvprobe_qa"]\n')
    every = ",".join(PROBES)
    text = check(str(servers), "--max-model-len", "8192", "--probes", every)
    data = json.loads(check(str(servers), "--max-model-len", "8192", "--probes", every, "--json").stdout)
    assert text.exit_code == 0, text.output
    assert list(data["settings"]) == list(PROBES)
    lines = text.stdout.splitlines()
    est, power = data["estimate"], data["power"]
    config = parse_config({"server": [{"name": "a", "url": "http://127.0.0.1:1", "role": "reference"},
                                      {"name": "b", "url": "http://127.0.0.1:2"}]})
    for name, probe in PROBES.items():
        said = next((line for line in lines if line.startswith(f"  {name} ")), "")
        assert said[len(name) + 2:].strip(), f"{name}: no settings line in the plan"
        assert name in est["by_probe"] or name in est["not_costed"] or probe.budget == "free", name
        for bar in plan_mod.gating_bars(config, name):
            assert (any(c["probe"] == name and c["bar"] == bar for c in power["checks"])
                    or any(line.startswith(f"{bar} ") for line in power["not_in_product"])), (name, bar)
