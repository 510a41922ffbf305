"""`run_eval` writes and signs the verdict from what it measured, and its exit code follows it
(replayed real captures; the real-server version is test_eval_verdict_integration.py)."""

from __future__ import annotations

import httpx
import orjson
import pytest
from replay import MultiReplay, Replay
from rich.console import Console

from kvprobe.config import parse_config
from kvprobe.evaluate.orchestrate import check_resume, run_eval
from kvprobe.run.store import RunDir
from kvprobe.verdict.sign import load_allowed_signers, load_signing_key, verify

CONFIG = {"server": [{"name": "auto", "url": "http://127.0.0.1:8101", "role": "reference"},
                     {"name": "fp8", "url": "http://127.0.0.1:8102"}]}


@pytest.fixture(autouse=True)
def _own_config_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("KVPROBE_SIGNING_KEY", raising=False)


async def _eval(tmp_path, replay: MultiReplay, name: str = "run", resume: bool = False):
    config = parse_config(CONFIG)
    run = RunDir.open(tmp_path / name) if resume else RunDir.create(tmp_path / name)
    key = load_signing_key()
    outcome = await run_eval(config, run, ["capacity"], Console(quiet=True), transport=replay.transport(),
                             signing_key=key, resume=resume)
    return outcome, run, key


def _fleet() -> MultiReplay:
    return MultiReplay({"127.0.0.1:8101": Replay("auto-8101"), "127.0.0.1:8102": Replay("fp8-8102")})


async def test_eval_writes_a_verdict_signed_over_its_exact_bytes(tmp_path):
    outcome, run, key = await _eval(tmp_path, _fleet())
    data = (run.path / "verdict.json").read_bytes()
    verdict = orjson.loads(data)
    assert outcome.ctx.results["verdict"] == verdict
    assert verdict["decisions"]["fp8"]["capacity_ratio"] == 2.0
    assert verdict["decisions"]["fp8"]["decision"] == "inconclusive"  # quality was not measured
    assert outcome.exit_code == 0 == verdict["exit_code"]
    allowed, _ = load_allowed_signers()
    signer = verify(data, (run.path / "verdict.json.sig").read_text(), allowed)
    assert signer.fingerprint == key.fingerprint


async def test_a_server_that_fails_the_smoke_is_broken_in_the_verdict_and_exit_4(tmp_path):
    fp8 = Replay("fp8-8102")
    fp8.routes[("POST", "/v1/completions")] = lambda r: httpx.Response(500, json={"error": {"message": "boom"}})
    outcome, run, _ = await _eval(tmp_path, MultiReplay({"127.0.0.1:8101": Replay("auto-8101"),
                                                         "127.0.0.1:8102": fp8}))
    verdict = run.read_json("verdict.json")
    assert verdict["decisions"]["fp8"]["decision"] == "broken"
    assert "smoke" in verdict["decisions"]["fp8"]["reasons"][0]
    assert outcome.exit_code == 4 == verdict["exit_code"]


async def test_resume_keeps_the_start_and_records_the_resume(tmp_path):
    _, run, _ = await _eval(tmp_path, _fleet())
    started = run.read_json("run.json")["started"]
    check_resume(parse_config(CONFIG), run)
    outcome, run, _ = await _eval(tmp_path, _fleet(), resume=True)
    meta = run.read_json("run.json")
    assert meta["started"] == started and len(meta["resumed"]) == 1
    assert outcome.ctx.results["verdict"]["run"]["resumed"] == meta["resumed"]


@pytest.mark.serial  # signal handlers live in the main thread, which an xdist worker does not run tests in
def test_a_ctrl_c_whose_cancellation_a_probe_swallows_still_stops_the_run_unsigned(tmp_path, monkeypatch,
                                                                                    terminal_sigint):
    """asyncio.run turns Ctrl-C into a cancellation; a probe (or a library under it) that catches it must not
    let the run go on to sign a verdict the operator stopped."""
    import asyncio
    import os
    import signal
    import threading

    assert threading.current_thread() is threading.main_thread(), "run this test outside xdist (-m serial)"

    from kvprobe.evaluate.orchestrate import run_eval_sync
    from kvprobe.probes import capacity

    real = capacity.run
    swallowed = []

    async def stubborn(ctx):
        os.kill(os.getpid(), signal.SIGINT)  # the operator's Ctrl-C, mid-probe
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            swallowed.append(True)  # ... caught and dropped, as a careless library would
        return await real(ctx)

    monkeypatch.setattr(capacity, "run", stubborn)
    run = RunDir.create(tmp_path / "run")
    with pytest.raises(KeyboardInterrupt):
        run_eval_sync(parse_config(CONFIG), run, ["capacity"], Console(quiet=True),
                      transport=_fleet().transport(), signing_key=load_signing_key())
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handlers are put back
    assert swallowed == [True]
    assert not (run.path / "verdict.json").exists()
