"""The needle probe through `run_eval` against replayed servers (real capture shapes, a toy
tokenizer, a fake model that retrieves or not): output files, same cases everywhere, resume,
streaming, a server dying mid-probe, refusals up front, no tokenizer anywhere."""

from __future__ import annotations

import io

import orjson
import pytest
import tiktoken
from needle_fakes import NeedleModel, ToyTokenizer, fake_server
from replay import MultiReplay
from rich.console import Console

from kvprobe.config import parse_config
from kvprobe.errors import EXIT_BAR_FAILED, EXIT_BROKEN, ConfigError, TokenizerUnavailable
from kvprobe.evaluate.orchestrate import run_eval
from kvprobe.needle.tokens import TiktokenEncoder
from kvprobe.run.store import RunDir

PNG = b"\x89PNG\r\n\x1a\n"
CASE_KEYS = {"id", "length_tokens", "depth_tokens", "server", "status", "found_in"}


def _config(**needle) -> object:
    settings = {"count": 6, "lengths": [600, 1500], "depths": [0.0, 0.5, 1.0], **needle}
    return parse_config({
        "bars": {"needle_recall_drop_max": 0.0},
        "server": [
            {"name": "auto", "url": "http://127.0.0.1:8101", "role": "reference"},
            {"name": "fp8", "url": "http://127.0.0.1:8102"},
            {"name": "int8", "url": "http://127.0.0.1:8103"},
        ],
        "needle": settings,
    })


class Trio:
    def __init__(self, tokenize: bool = True):
        self.tok = ToyTokenizer()
        self.models = {"auto": NeedleModel(self.tok), "fp8": NeedleModel(self.tok),
                       "int8": NeedleModel(self.tok, "lost")}
        tokenizer = self.tok if tokenize else None
        self.transport = MultiReplay({
            f"127.0.0.1:{port}": fake_server(self.models[name], tokenizer)
            for name, port in (("auto", 8101), ("fp8", 8102), ("int8", 8103))
        }).transport()

    def chats(self) -> dict[str, int]:
        return {name: len(model.bodies) for name, model in self.models.items()}


async def _run(config, path, trio: Trio):
    console = Console(file=io.StringIO(), width=120)
    run = RunDir.create(path)
    outcome = await run_eval(config, run, ["needle"], console, transport=trio.transport)
    return outcome, run, console.file.getvalue()


async def test_needle_json_events_and_heatmaps(tmp_path) -> None:
    trio = Trio()
    outcome, run, printed = await _run(_config(), tmp_path / "run", trio)
    # int8 loses every needle: the verdict rejects it, and with no candidate adopted the run exits 1
    assert outcome.exit_code == EXIT_BAR_FAILED, outcome.messages
    assert run.read_json("verdict.json")["decisions"]["int8"]["decision"] == "reject"
    data = run.read_json("needle.json")
    assert data["reference"] == "auto"
    assert set(data["servers"]) == {"auto", "fp8", "int8"}
    for row in data["servers"].values():
        assert {"hit", "miss", "truncated", "error", "recall"} <= set(row)
    assert data["servers"]["auto"] == {**data["servers"]["auto"], "hit": 6, "miss": 0, "recall": 1.0}
    assert data["servers"]["int8"]["hit"] == 0 and data["servers"]["int8"]["miss"] == 6
    assert len(data["cases"]) == 18
    for case in data["cases"]:
        assert set(case) >= CASE_KEYS
        assert case["length_tokens"] == case["target_length"]  # exact with the server's tokenizer
        assert case["found_in"] == (["content", "reasoning"] if case["server"] != "int8" else [])
    depths = {c["id"]: c["depth_tokens"] for c in data["cases"] if c["server"] == "auto"}
    assert {c["id"]: c["depth_tokens"] for c in data["cases"] if c["server"] == "int8"} == depths
    checks = {n: {c["id"]: c for c in d["checks"]} for n, d in run.read_json("verdict.json")["decisions"].items()}
    assert checks["int8"]["needle.recall_drop"]["outcome"] == "fail"
    # 6 matching needles cannot show the 0.0 bar (nothing can): the probe judges nothing, the check says so
    assert checks["fp8"]["needle.recall_drop"]["outcome"] == "inconclusive"
    assert "outcome" not in data["paired"]["int8"]
    assert len(data["paired"]["int8"]["reference_hit_candidate_miss"]) == 6
    # every case is in the events log, with the full answer
    events = list(run.events("needle_case"))
    assert len(events) == 18 and all(e["plan"] == data["plan"] for e in events)
    assert all(e["reasoning"] for e in events if e["server"] == "auto")
    for name in ("auto", "fp8", "int8"):
        assert (run.path / data["heatmaps"][name]).read_bytes().startswith(PNG)
    assert (run.path / data["heatmaps"]["int8 vs auto"]).read_bytes().startswith(PNG)
    assert run.read_json("needle/cases.json")["plan"] == data["plan"]
    assert "needle: int8 needle recall drop" in printed and "fail" in printed  # the line the probe ends with


async def test_same_prompts_to_every_server_with_the_asked_budget(tmp_path) -> None:
    trio = Trio()
    await _run(_config(max_tokens=256), tmp_path / "run", trio)
    prompts = {name: sorted(b["messages"][0]["content"] for b in m.bodies) for name, m in trio.models.items()}
    assert prompts["auto"] == prompts["fp8"] == prompts["int8"] and len(prompts["auto"]) == 6
    for model in trio.models.values():
        for body in model.bodies:
            assert body["max_tokens"] == 256 and body["temperature"] == 0
            assert "seed" not in body  # seed + sampling + long prompt kills vLLM CPU engines
            assert [m["role"] for m in body["messages"]] == ["user"]
            content = body["messages"][0]["content"]
            assert content.endswith("mentioned in the provided text?") and "\n\nWhat is the special" in content


async def test_resume_skips_finished_pairs_and_reasks_the_rest(tmp_path) -> None:
    trio = Trio()
    _, run, _ = await _run(_config(), tmp_path / "run", trio)
    first = run.read_json("needle.json")
    before = trio.chats()
    await _run(_config(), tmp_path / "run", trio)
    assert trio.chats() == before  # nothing asked twice
    assert run.read_json("needle.json")["cases"] == first["cases"]

    # a crash: the last four answers never reached the disk, and the last line is torn
    lines = (run.path / "events.jsonl").read_bytes().splitlines(keepends=True)
    case_lines = [i for i, line in enumerate(lines) if b'"needle_case"' in line]
    dropped = set(case_lines[-4:])
    kept = [line for i, line in enumerate(lines) if i not in dropped]
    (run.path / "events.jsonl").write_bytes(b"".join(kept) + b'{"kind": "needle_case", "ser')
    await _run(_config(), tmp_path / "run", trio)
    assert sum(trio.chats().values()) - sum(before.values()) == 4
    again = run.read_json("needle.json")
    assert again["servers"] == first["servers"] and len(again["cases"]) == 18


async def test_changed_settings_start_a_new_plan(tmp_path) -> None:
    trio = Trio()
    _, run, _ = await _run(_config(), tmp_path / "run", trio)
    before = sum(trio.chats().values())
    await _run(_config(seed=5), tmp_path / "run", trio)
    assert sum(trio.chats().values()) - before == 18
    data = run.read_json("needle.json")
    assert len(data["cases"]) == 18 and data["settings"]["seed"] == 5


async def test_streamed_answers_score_the_same(tmp_path) -> None:
    trio = Trio()
    outcome, run, _ = await _run(_config(stream=True), tmp_path / "run", trio)
    assert outcome.exit_code == EXIT_BAR_FAILED  # int8 rejected, nothing adopted
    assert all(b.get("stream") for m in trio.models.values() for b in m.bodies)
    data = run.read_json("needle.json")
    assert [data["servers"][n]["hit"] for n in ("auto", "fp8", "int8")] == [6, 6, 0]
    assert all(c["length_tokens"] == c["target_length"] for c in data["cases"])  # usage chunk read


async def test_answers_at_the_cap_are_truncated(tmp_path) -> None:
    trio = Trio()
    trio.models["int8"].mode = "rambles"
    # 12 pairs, not 6: every answer cut is a fail only where the exact test at the bar (0.1) agrees, and 6
    # of 6 cut can still come from a candidate at the bar (0.55^6 = 2.8% > 2.5%), 12 of 12 cannot.
    _, run, _ = await _run(_config(max_tokens=64, count=12), tmp_path / "run", trio)
    data = run.read_json("needle.json")
    assert data["servers"]["int8"]["truncated"] == 12 and data["servers"]["int8"]["recall"] is None
    assert len(data["paired"]["int8"]["reference_hit_candidate_truncated"]) == 12
    checks = {c["id"]: c for c in run.read_json("verdict.json")["decisions"]["int8"]["checks"]}
    assert checks["needle.truncation_rise"]["value"] == 1.0 and checks["needle.truncation_rise"]["outcome"] == "fail"
    assert checks["needle.recall_drop"]["outcome"] == "fail"  # cut where the reference answered: lost
    assert all(e["completion_tokens"] == 64 for e in run.events("needle_case", server="int8"))


async def test_server_dying_mid_probe_is_marked_broken_and_the_rest_go_on(tmp_path) -> None:
    trio = Trio()
    trio.models["fp8"].fail_after = 2
    outcome, run, _ = await _run(_config(concurrency=1), tmp_path / "run", trio)
    assert outcome.exit_code == EXIT_BROKEN
    assert any("fp8 broke during the run" in m and "EngineCore" in m for m in outcome.messages)
    assert len(trio.models["fp8"].bodies) == 3  # two answers, one 500, then no more requests
    data = run.read_json("needle.json")
    assert data["servers"]["fp8"]["hit"] == 2 and data["servers"]["fp8"]["error"] == 1
    assert data["servers"]["auto"]["hit"] == 6 and data["servers"]["int8"]["cases"] == 6
    assert [e["server"] for e in run.events("broken")] == ["fp8"]


async def test_a_reference_dying_mid_probe_stops_every_request_and_the_probes_left(tmp_path) -> None:
    # Healthy candidates answering on after the reference died measure nothing that can be compared: a demo on an
    # AVX2 EPYC went on asking bfloat16 its 180 needles, and would have gone on to its 180 QA documents, after
    # auto's engine hung (HTTP 500 EngineCore) at needle 101.
    trio = Trio()
    trio.models["auto"].fail_after = 2
    console = Console(file=io.StringIO(), width=200)
    run = RunDir.create(tmp_path / "run")
    outcome = await run_eval(_config(concurrency=1), run, ["needle", "load"], console, transport=trio.transport)
    assert outcome.exit_code == EXIT_BROKEN
    assert [e["server"] for e in run.events("broken")] == ["auto"]
    # every server asked in step, one case at a time: no candidate past the case the reference died on
    assert len(trio.models["auto"].bodies) <= 6 + 3 and all(trio.chats()[c] <= 3 for c in ("fp8", "int8"))
    (stopped,) = run.events("probes_not_run")
    assert stopped["probes"] == ["load"] and stopped["why"] == "the reference auto broke"
    assert "load not run: the reference auto broke, so nothing more can be compared" in console.file.getvalue()
    assert not (run.path / "load.json").exists()
    verdict = outcome.ctx.results["verdict"]
    assert verdict["probes_status"]["load"] == "requested, no results"
    for cand in ("fp8", "int8"):
        assert any("the reference auto is broken" in r for r in verdict["decisions"][cand]["reasons"])


async def test_every_candidate_dying_stops_the_probes_left_for_the_reference_alone(tmp_path) -> None:
    # The AVX2 demo's one candidate died mid-needles (its kernel wrote past its pool): the reference then spent 10
    # of the run's 30 minutes on its own tasks and load, which compare nothing.
    trio = Trio()
    trio.models["fp8"].fail_after = 2
    trio.models["int8"].fail_after = 3
    console = Console(file=io.StringIO(), width=200)
    run = RunDir.create(tmp_path / "run")
    outcome = await run_eval(_config(concurrency=1), run, ["needle", "load"], console, transport=trio.transport)
    assert outcome.exit_code == EXIT_BROKEN
    assert sorted(e["server"] for e in run.events("broken")) == ["fp8", "int8"]
    assert run.read_json("needle.json")["servers"]["auto"]["cases"] == 6  # the probe running finishes
    (stopped,) = run.events("probes_not_run")
    assert stopped["probes"] == ["load"] and stopped["why"] == "every candidate broke (fp8, int8)"
    assert "load not run: every candidate broke (fp8, int8), so nothing is left to compare" in console.file.getvalue()
    assert not list(run.events("load_case")) and not (run.path / "load.json").exists()
    verdict = outcome.ctx.results["verdict"]
    assert {verdict["decisions"][c]["decision"] for c in ("fp8", "int8")} == {"broken"}


@pytest.mark.parametrize("lengths", [[1024, 9000], [7169]])
async def test_length_over_max_model_len_refused_before_any_request(tmp_path, lengths) -> None:
    trio = Trio()
    with pytest.raises(ConfigError) as err:
        await _run(_config(lengths=lengths), tmp_path / "run", trio)
    assert f"needle.lengths: {lengths[-1]} tokens + max_tokens 1024" in str(err.value)
    assert "max_model_len 8192" in str(err.value)
    assert sum(trio.chats().values()) == 0
    assert not (tmp_path / "run" / "needle.json").exists()
    assert (tmp_path / "run" / "run.json").exists()  # what was done before is kept


async def test_no_tokenize_anywhere_and_no_tiktoken_cache_stops_clearly(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "empty"))
    monkeypatch.delitem(tiktoken.registry.ENCODINGS, "cl100k_base", raising=False)
    trio = Trio(tokenize=False)
    with pytest.raises(TokenizerUnavailable, match="no server offers /tokenize"):
        await _run(_config(), tmp_path / "run", trio)
    assert sum(trio.chats().values()) == 0


async def test_no_tokenize_anywhere_uses_a_cached_tiktoken_and_marks_cases_approximate(tmp_path, monkeypatch):
    encoding = tiktoken.Encoding(name="bytes", pat_str=r"\S+|\s+", mergeable_ranks={bytes([i]): i for i in range(256)},
                                 special_tokens={})
    monkeypatch.setattr("kvprobe.probes.needle.load_tiktoken", lambda name: TiktokenEncoder(encoding))
    trio = Trio(tokenize=False)
    _, run, _ = await _run(_config(), tmp_path / "run", trio)
    data = run.read_json("needle.json")
    assert data["settings"]["tokenizer"] == "tiktoken:bytes" and data["settings"]["approximate"] is True
    assert all(c["approximate"] for c in data["cases"])
    plan = run.read_json("needle/cases.json")
    assert all(c["exact"] and c["length_tokens"] == c["target_length"] for c in plan["cases"])  # by the estimate
    # the servers' own counts (usage.prompt_tokens) are what needle.json records
    assert {c["length_tokens"] for c in data["cases"]} != {600, 1500}
    assert data["servers"]["auto"]["hit"] == 6


async def test_events_are_valid_json_lines(tmp_path) -> None:
    trio = Trio()
    _, run, _ = await _run(_config(count=2), tmp_path / "run", trio)
    for line in (run.path / "events.jsonl").read_bytes().splitlines():
        orjson.loads(line)
