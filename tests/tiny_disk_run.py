"""`kvprobe eval` of the replayed needle trio into OUT, for test_disk_full's run on a real tiny
filesystem (it runs in its own mount namespace, so it is a process of its own). Prints the exit
code, the error lines, the decisions and whether every events line is whole, as JSON.

    python tests/tiny_disk_run.py SERVERS_TOML OUT fresh|resume
"""

from __future__ import annotations

import sys
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).parent))

from click.testing import CliRunner
from test_disk_full import trio

from kvprobe import cli
from kvprobe.evaluate import orchestrate as evaluation


def main(servers: str, out: str, mode: str) -> None:
    transport = trio().transport()
    real = evaluation.make_clients
    evaluation.make_clients = lambda config, _=None: real(config, transport)  # type: ignore[assignment]
    where = ["--resume", out] if mode == "resume" else ["--out", out, "--probes", "capacity,needle"]
    result = CliRunner().invoke(cli.main, ["eval", "--servers", servers, *where])
    events = Path(out) / "events.jsonl"
    data = events.read_bytes() if events.exists() else b""
    whole = data.endswith(b"\n") or not data
    try:
        for line in data.splitlines():
            orjson.loads(line)
    except orjson.JSONDecodeError:
        whole = False
    verdict = Path(out) / "verdict.json"
    print(orjson.dumps({
        "exit": result.exit_code, "errors": [x for x in result.stderr.splitlines() if x.startswith("error:")],
        "traceback": "Traceback" in result.output, "events_whole": whole, "events": len(data.splitlines()),
        "decisions": orjson.loads(verdict.read_bytes())["decisions"] if verdict.exists() else None,
    }).decode())


if __name__ == "__main__":
    main(*sys.argv[1:4])
