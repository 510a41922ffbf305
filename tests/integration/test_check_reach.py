"""`kvprobe check servers.toml --reach` against the real vLLM CPU trio: every server answers /health and
/v1/models, the plan is sized from the max_model_len each reports, and nothing is measured (the servers'
token counters do not move). A server nobody listens on is one line and exit 2."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from scenarios import trio

from kvprobe.testbed.launcher import tokens_served

# It serves no token (/health and /v1/models only); a small declaration keeps the trio from being recycled.
pytestmark = [pytest.mark.integration, pytest.mark.serves_tokens(1_000)]  # logged in conftest


def _servers_toml(servers: list[dict[str, str]]) -> str:
    return "".join(f'[[server]]\nname = "{s["name"]}"\nurl = "{s["url"]}"\nrole = "{s["role"]}"\n\n' for s in servers)


def kvprobe(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvprobe.cli", *args], capture_output=True, text=True, timeout=300)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_check_reach_reads_the_real_trio_and_measures_nothing(vllm_servers, tmp_path: Path) -> None:
    servers = trio(vllm_servers)
    path = tmp_path / "servers.toml"
    path.write_text(_servers_toml(servers))
    before = {s["name"]: tokens_served(s["url"]) for s in servers}
    result = kvprobe("check", str(path), "--reach")
    assert result.returncode == 0, result.stderr
    lengths = {vllm_servers[k].spec.kv_cache_dtype: vllm_servers[k].spec.max_model_len
               for k in ("reference", "lossless_2x", "lossy_2x") if k in vllm_servers}
    said = " ".join(result.stdout.split())  # the plan wraps at the terminal's width (120 in a pipe)
    for name, length in lengths.items():
        assert f"reach: {name}: /health ok; /v1/models " in said
        assert f"(max_model_len {length:,})" in said
    assert "from /v1/models (--reach): the probe settings were checked against it" in said

    data = json.loads(kvprobe("check", str(path), "--reach", "--json").stdout)
    assert data["valid"] is True and [r["ok"] for r in data["reach"]] == [True] * len(servers)
    assert data["max_model_len"]["source"] == "/v1/models (--reach)"
    assert data["max_model_len"]["per_server"] == lengths
    assert data["settings"]["needle"]["lengths"][-1] == min(lengths.values()) - data["settings"]["needle"]["max_tokens"]
    after = {s["name"]: tokens_served(s["url"]) for s in servers}
    assert after == before, "check --reach served tokens: it must measure nothing"


def test_check_reach_names_a_server_nobody_listens_on(vllm_servers, tmp_path: Path) -> None:
    servers = trio(vllm_servers)
    dead = {"name": "gone", "url": f"http://127.0.0.1:{_free_port()}", "role": "candidate"}
    path = tmp_path / "servers.toml"
    path.write_text(_servers_toml([*servers, dead]))
    result = kvprobe("check", str(path), "--reach")
    assert result.returncode == 2 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"error: gone: cannot reach {dead['url']}/health")
