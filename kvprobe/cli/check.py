"""kvprobe check: validate servers.toml and say what `kvprobe eval` would do with it; nothing is measured."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
import orjson

from kvprobe.cli._common import PROBES_HELP, _fail, print_lines, servers_file_input, warn
from kvprobe.errors import EXIT_CANNOT_RUN, EXIT_OK, ConfigError


def _json(data: dict[str, Any]) -> None:
    sys.stdout.write(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode() + "\n")


@click.command(name="check")
@servers_file_input
@click.option("--probes", default=None, help=PROBES_HELP)
@click.option("--max-model-len", type=click.IntRange(min=1), default=None,
              help="the servers' max_model_len, to check that every probe setting fits it (default: what each "
                   "server reports with --reach, else the model_config's max_position_embeddings)")
@click.option("--reach", is_flag=True, help="also GET /health and /v1/models of every server (nothing measured)")
@click.option("--json", "as_json", is_flag=True, help="print the plan as JSON")
def check_cmd(servers_file: Path, probes: str | None, max_model_len: int | None, reach: bool,
              as_json: bool) -> None:
    """Validate SERVERS_FILE and print what `kvprobe eval` would run: the servers, the knob, the probes
    with their sizes, the bars and a rough time. Nothing is measured.

    Exit 0 fine (warnings, one line each, on stderr: an API key variable not set, a knob kvprobe does
    not know, a plan that cannot reach adopt), 2 a problem (one line each)."""
    from kvprobe.cli.crash import note_secrets
    from kvprobe.config import load_config
    from kvprobe.evaluate.plan import build_plan, describe
    from kvprobe.evaluate.plan import reach as reach_servers

    try:
        config = load_config(servers_file)
    except ConfigError as exc:
        if as_json:
            _json({"servers_file": str(servers_file), "valid": False, "problems": exc.problems})
        _fail(exc.problems)
    note_secrets([server.api_key_env for server in config.servers])
    reached = reach_servers(config) if reach else None
    plan = build_plan(config, str(servers_file), probes, max_model_len, reached)
    warn(plan.warnings)
    if as_json:
        _json(plan.data)
    elif plan.ok:
        print_lines(describe(plan.data))
    if not plan.ok:
        _fail(plan.problems, EXIT_CANNOT_RUN)
    sys.exit(EXIT_OK)
