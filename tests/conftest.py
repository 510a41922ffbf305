"""Shared fixtures. Integration tests run against real vLLM CPU servers serving needle-llama,
started by kvprobe's own launcher and reused across modules and sessions while they are fit.

Tests ask for scenarios, not dtypes (kvprobe.testbed.scenarios): "reference", "lossy_2x" (2x the tokens,
wrecks quality), "lossless_2x" (2x, holds quality: AVX-512 only), "no_start", "no_gain". Which real
server plays each depends on the CPU; `KVPROBE_VLLM_NO_AVX512=1` gives the AVX2 testbed anywhere."""

from __future__ import annotations

import os
import sys
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from kvprobe.testbed import LaunchError, LocalServer, ServerSpec, Testbed, start_each, stop, testbed
from kvprobe.testbed.launcher import MODULE_TOKENS, home, overruns, tokens_served

TRIO = ("reference", "lossless_2x", "lossy_2x")


class _Prestart:
    thread: ClassVar[threading.Thread | None] = None
    ports: ClassVar[set[int]] = set()  # started by the background start (not reused): stopped at the end


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the trio in the background while the first tests (the fuzz tests, which time nothing)
    run: ~70 s of startup the first module asking for the trio would otherwise wait out. That
    module's own start blocks on each port's lock until then, and reuses what came up; what could
    not start, it starts (or fails to) itself, with its own error."""
    if os.environ.get("KVPROBE_SKIP_INTEGRATION") == "1" or session.config.option.collectonly:
        return
    if not any("vllm_servers" in getattr(item, "fixturenames", ()) for item in session.items):
        return

    def go() -> None:
        bed = testbed()
        try:
            results = start_each([bed[k].spec for k in TRIO if bed.available(k)])
        except Exception:  # the fixture's own start reports it
            return
        _Prestart.ports.update(r.spec.port for r in results if isinstance(r, LocalServer) and not r.reused)

    _Prestart.thread = threading.Thread(target=go, name="kvprobe-trio-prestart", daemon=True)
    _Prestart.thread.start()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Stop what the background start started, also when no test got as far as asking for it."""
    if _Prestart.thread is not None:
        _Prestart.thread.join(600)  # a session that ended early: its servers may still be coming up
    if os.environ.get("KVPROBE_KEEP_SERVERS") != "1":
        for port in sorted(_Prestart.ports):
            stop(port)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("KVPROBE_SKIP_INTEGRATION") == "1":
        skip = pytest.mark.skip(reason="KVPROBE_SKIP_INTEGRATION=1")
        for item in items:
            if "integration" in item.keywords:
                item.add_marker(skip)


@pytest.fixture
def terminal_sigint() -> Iterator[None]:
    """SIGINT handled as a terminal starts a program: a suite run in the background (nohup, `&`) inherits it
    ignored, and so would every child a test starts, so a Ctrl-C test could never land."""
    import signal

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # a handled signal is SIG_DFL after exec
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.fixture(scope="session")
def _started_ports() -> Iterator[set[int]]:
    """Ports of the servers this session started: stopped at the end unless KVPROBE_KEEP_SERVERS=1
    (servers that were already running, like the demo's, are left alone)."""
    ports: set[int] = set()
    yield ports
    if os.environ.get("KVPROBE_KEEP_SERVERS") != "1":
        for port in sorted(ports):
            stop(port)


@pytest.fixture(scope="session")
def bed() -> Testbed:
    return testbed()


@pytest.fixture(scope="session")
def start_servers(_started_ports: set[int]):
    """start_servers(specs) -> servers, all or none; every server it started is stopped at the end of
    the session, also those started before another one failed."""

    def go(specs: list[ServerSpec], tokens_needed: int = MODULE_TOKENS) -> list[LocalServer]:
        results = start_each(specs, tokens_needed=tokens_needed)
        _started_ports.update(r.spec.port for r in results if isinstance(r, LocalServer) and not r.reused)
        for r in results:
            if isinstance(r, LaunchError):
                raise r
        return [r for r in results if isinstance(r, LocalServer)]

    return go


@pytest.fixture(scope="module")
def vllm_servers(request: pytest.FixtureRequest, bed: Testbed, start_servers) -> Iterator[dict[str, LocalServer]]:
    """The trio, by scenario: "reference", "lossy_2x" and, where this CPU runs one, "lossless_2x";
    "any_2x" is a 2x candidate that serves (the lossless one where there is one).

    Same model, same flags; only the KV dtype differs. Checked per module, not once per session: the
    launcher recycles a server whose kernel overruns its pool (launcher.overruns) unless half its pool
    still holds what the module will serve. A module declares that with `pytest.mark.serves_tokens(n)`
    (else MODULE_TOKENS, enough for a 40-needle run), and what it really served is logged at its end
    (logs/tokens-by-module.log under the launcher's home), with a warning when it served more than it
    declared. Restarting the lossy server for every module cost ~50 s each, 4-5 times a CI run."""
    marker = request.node.get_closest_marker("serves_tokens")
    declared = int(marker.args[0]) if marker else None
    keys = [k for k in TRIO if bed.available(k)]
    servers = dict(zip(keys, start_servers([bed[k].spec for k in keys], declared or MODULE_TOKENS), strict=True))
    servers["any_2x"] = servers.get("lossless_2x") or servers["lossy_2x"]
    watched = {k: s for k, s in servers.items() if k in TRIO and overruns(s.spec)}
    before = {k: tokens_served(s.url) for k, s in watched.items()}
    yield servers
    for key, server in watched.items():
        start, end = before[key], tokens_served(server.url)
        if start is None or end is None or end[0] < start[0]:  # unreadable, or restarted within the module
            continue
        served = end[0] - start[0]
        (home() / "logs").mkdir(parents=True, exist_ok=True)
        with open(home() / "logs" / "tokens-by-module.log", "a") as log:
            log.write(f"{request.node.nodeid} {key} {server.spec.kv_cache_dtype}: served {served:,} "
                      f"(declared {declared if declared is not None else 'none'}), now {end[0]:,} of {end[1]:,}\n")
        if declared is not None and served > declared:
            # Not a failure: the launcher reads what a server has really served before it reuses it, so a later
            # module is safe either way; this module only risked crossing the line itself. Raise the declaration.
            warnings.warn(f"{request.node.nodeid} served {served:,} tokens to {key} ({server.spec.kv_cache_dtype}) "
                          f"but declares serves_tokens({declared:,}): raise the declaration", stacklevel=1)


@pytest.fixture(autouse=True, scope="session")
def _private_config_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """`eval` signs its verdict: no test creates or uses a key in the user's real config directory."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("xdg-config")))
        mp.delenv("KVPROBE_SIGNING_KEY", raising=False)
        mp.delenv("KVPROBE_ALLOWED_SIGNERS", raising=False)
        yield
