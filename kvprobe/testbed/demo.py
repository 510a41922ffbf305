"""`kvprobe demo`: start the trio this CPU can run and write the servers.toml that evaluates it.

A server the engine refuses to start (fp8 KV on an AVX2-only CPU) is a result, not a crash: it is left
out of the comparison with the engine's own error line, and the run records what was left out and why.
"""

from __future__ import annotations

from pathlib import Path

from kvprobe.testbed import LaunchError, LocalServer, Scenario, StartRefused, Testbed, start_each, testbed
from kvprobe.testbed.launcher import MODULE_TOKENS, PROJECT_ROOT, home

# The bars and comments of the repository's servers.toml are the demo's too.
TEMPLATE = PROJECT_ROOT / "servers.toml"


# Tokens a capacity-only demo serves a server: the first-prefill smoke (half of 8,192) and the warm-up.
CAPACITY_ONLY_TOKENS = 20_000


def start_demo(tokens_needed: int = MODULE_TOKENS) -> tuple[Testbed, list[tuple[Scenario, LocalServer]],
                                                           list[dict[str, str]]]:
    """(testbed, started servers, left-out servers with their reasons). Raises LaunchError when a
    server fails that was expected to start. `tokens_needed`: what the run will serve each server (a
    server whose kernel overruns its pool is restarted unless half of it still holds that)."""
    bed = testbed()
    scenarios = bed.demo()
    results = start_each([sc.spec for sc in scenarios if sc.spec is not None], tokens_needed=tokens_needed)
    started: list[tuple[Scenario, LocalServer]] = []
    left_out: list[dict[str, str]] = []
    for sc, result in zip(scenarios, results, strict=True):
        if isinstance(result, StartRefused) and sc.key == "no_start":
            left_out.append({"name": sc.name, "scenario": sc.key,
                             "reason": f"{sc.name} KV does not start on this CPU: {result.reason}"})
        elif isinstance(result, LaunchError):
            raise result
        else:
            started.append((sc, result))
    return bed, started, left_out


def write_servers_toml(started: list[tuple[Scenario, LocalServer]], path: Path | None = None) -> Path:
    """The repository's servers.toml with its [[server]] tables replaced by the servers that started."""
    text = TEMPLATE.read_text()
    head = text[: text.index("[[server]]")] if "[[server]]" in text else text
    tables = [f'[[server]]\nname = "{sc.name}"\nurl = "{server.url}"\n'
              f'role = "{"reference" if sc.reference is None else "candidate"}"  # {sc.shows}\n'
              for sc, server in started]
    path = path or home() / "demo" / "servers.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(head.rstrip() + "\n\n" + "\n".join(tables))
    return path
