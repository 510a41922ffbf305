"""The core against real vLLM CPU servers (needle-llama; the reference and a 2x candidate differ only in KV
dtype; which servers those are depends on the CPU, see kvprobe.testbed.scenarios)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner
from faultproxy import Fault, FaultProxy
from replay import capture

from kvprobe.cli import main
from kvprobe.testbed import LocalServer, Testbed, start
from kvprobe.testbed.launcher import free_port

pytestmark = [pytest.mark.integration, pytest.mark.serves_tokens(60_000)]  # logged in conftest


def servers_toml(tmp_path: Path, servers: list[tuple[str, str]], extra: str = "") -> Path:
    text = "[bars]\ncapacity_gain_min = 0.05\n"
    for i, (name, url) in enumerate(servers):
        text += f'\n[[server]]\nname = "{name}"\nurl = "{url}"\nrole = "{"reference" if i == 0 else "candidate"}"\n'
        text += extra
    path = tmp_path / "servers.toml"
    path.write_text(text)
    return path


def kvprobe(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def _pair(vllm_servers: dict[str, LocalServer]) -> list[tuple[str, str]]:
    """(name, url) of the reference and the 2x candidate, named by their KV dtype."""
    return [(s.spec.kv_cache_dtype, s.url) for s in (vllm_servers["reference"], vllm_servers["any_2x"])]


def test_audit_json_reports_real_capacity(vllm_servers: dict[str, LocalServer], bed: Testbed) -> None:
    ref, cand = vllm_servers["reference"], vllm_servers["any_2x"]
    result = kvprobe("audit", "--json", ref.url, cand.url)
    assert result.exit_code == 0, result.stderr
    rows = json.loads(result.stdout)["servers"]
    assert [r["cache_dtype"] for r in rows] == [ref.spec.kv_cache_dtype, cand.spec.kv_cache_dtype]
    expected = [bed["reference"].kv_tokens, 2 * bed["reference"].kv_tokens]  # what the startup log says
    assert [r["kv_cache_tokens"] for r in rows] == expected
    for row in rows:
        assert row["kv_cache_tokens_estimate"] is False
        assert row["version"] == "0.32.0" and row["max_model_len"] == 8192 and row["model"] == "needle-llama"
        assert row["healthy"] and row["smoke_ok"]
        assert {"url", "max_concurrency"} <= set(row)
        assert "avx2" in row["platform"]["isa"] and row["platform"]["cpu_model"]  # dev mode shows the platform
    assert rows[1]["max_concurrency"] == 2 * rows[0]["max_concurrency"]


def test_eval_capacity_ratio_and_valid_pin(vllm_servers: dict[str, LocalServer], bed: Testbed,
                                           tmp_path: Path) -> None:
    (ref, _), (cand, cand_url) = pairs = _pair(vllm_servers)
    cfg = servers_toml(tmp_path, pairs)
    out = tmp_path / "run"
    result = kvprobe("eval", "--servers", str(cfg), "--probes", "capacity", "--out", str(out))
    assert result.exit_code == 0, result.stderr
    assert "2.00x" in result.stdout and "valid" in result.stdout
    cap = json.loads((out / "capacity.json").read_text())
    tokens = bed["reference"].kv_tokens
    assert cap["reference"] == ref
    assert cap["servers"][cand] == {**cap["servers"][cand], "kv_cache_tokens": 2 * tokens, "ratio": 2.0}
    assert cap["servers"][ref]["kv_cache_tokens"] == tokens
    assert cap["pin"]["valid"] is True and cap["pin"]["differences"] == []
    run = json.loads((out / "run.json").read_text())
    assert run["config"]["server"][1]["url"] == cand_url
    for name in (ref, cand):
        inv = json.loads((out / "inventory" / f"{name}.json").read_text())
        assert inv["smoke"]["ok"] and inv["smoke"]["prompt_tokens"] == 4096
        assert "vllm:cache_config_info" in (out / "inventory" / f"{name}.metrics.txt").read_text()
    kinds = [json.loads(line)["kind"] for line in (out / "events.jsonl").read_text().splitlines()]
    assert kinds.count("inventory") == 2 and "pin" in kinds


@pytest.fixture(scope="module")
def short_server(bed: Testbed) -> LocalServer:
    """A third real server, same model and dtype as the reference, but --max-model-len 4096."""
    server = start(replace(bed["reference"].spec, port=free_port(), max_model_len=4096), reuse=False)
    yield server
    server.stop()


def test_max_model_len_mismatch_is_invalid(vllm_servers: dict[str, LocalServer], short_server: LocalServer,
                                           tmp_path: Path) -> None:
    (ref, _), (cand, _) = pairs = _pair(vllm_servers)
    cfg = servers_toml(tmp_path, [*pairs, ("short", short_server.url)])
    out = tmp_path / "run"
    result = kvprobe("eval", "--servers", str(cfg), "--probes", "capacity", "--out", str(out))
    assert result.exit_code == 3, result.stderr
    assert f"max_model_len: {ref}=8192 short=4096" in result.stderr
    pin = json.loads((out / "capacity.json").read_text())["pin"]
    assert pin["valid"] is False
    assert pin["by_candidate"][cand] == []
    assert [d["field"] for d in pin["by_candidate"]["short"]] == ["max_model_len"]
    # The launcher's servers run in dev mode: the whole engine config was compared, not just /metrics.
    assert not any("server_info" in note for note in pin["unchecked"])


def test_unreachable_server_exits_2_naming_it(vllm_servers: dict[str, LocalServer], bed: Testbed,
                                             tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    cfg = servers_toml(tmp_path, [("auto", vllm_servers["reference"].url), ("gone", dead)])
    out = tmp_path / "run"
    result = kvprobe("eval", "--servers", str(cfg), "--probes", "capacity", "--out", str(out))
    assert result.exit_code == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "gone" in errors[0] and f"cannot reach {dead}" in errors[0]
    assert json.loads((out / "inventory" / "auto.json").read_text())["capacity"]["kv_cache_tokens"] \
        == bed["reference"].kv_tokens


def test_healthy_server_failing_the_smoke_exits_4(vllm_servers: dict[str, LocalServer], tmp_path: Path) -> None:
    crash = capture("crash-seed-chunked-prefill", "response")
    with FaultProxy(vllm_servers["any_2x"].url, {"/v1/completions": Fault(status=500, body=crash)}) as url:
        cfg = servers_toml(tmp_path, [("auto", vllm_servers["reference"].url), ("fp8", url)])
        out = tmp_path / "run"
        result = kvprobe("eval", "--servers", str(cfg), "--probes", "capacity", "--out", str(out))
    assert result.exit_code == 4, result.stderr
    assert "fp8" in result.stderr and "EngineCore encountered an issue" in result.stderr
    fp8 = json.loads((out / "inventory" / "fp8.json").read_text())
    assert fp8["healthy"] is True and fp8["status"] == "broken" and fp8["smoke"]["ok"] is False
    assert json.loads((out / "inventory" / "auto.json").read_text())["status"] == "ok"
    assert (out / "capacity.json").exists()


def test_api_key_is_sent_but_never_recorded(vllm_servers: dict[str, LocalServer], tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "sk-kvprobe-test-7f3a9c21e5"
    monkeypatch.setenv("KVPROBE_TEST_API_KEY", secret)
    proxy = FaultProxy(vllm_servers["any_2x"].url)
    with proxy as url:
        cfg = servers_toml(tmp_path, [("auto", vllm_servers["reference"].url), ("fp8", url)],
                           extra='api_key_env = "KVPROBE_TEST_API_KEY"\n')
        out = tmp_path / "run"
        result = kvprobe("eval", "--servers", str(cfg), "--probes", "capacity", "--out", str(out))
    assert result.exit_code == 0, result.stderr
    assert proxy.authorization and set(proxy.authorization) == {f"Bearer {secret}"}  # the key was sent
    assert secret not in result.stdout + result.stderr
    for path in out.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), f"API key leaked into {path}"
    assert "KVPROBE_TEST_API_KEY" in (out / "run.json").read_text()  # the env var's name is recorded
