"""`python -m kvprobe.testbed setup|start|demo|stop|stop-all|status`: manage local real vLLM servers."""

from __future__ import annotations

import argparse
import json
import sys

from kvprobe.testbed import (
    LaunchError,
    ServerSpec,
    demo_specs,
    ensure_venv,
    start,
    start_many,
    status,
    stop,
    stop_all,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvprobe.testbed", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("setup", help="install the vLLM CPU venv (cached)")
    sub.add_parser("demo", help="start the demo trio: auto :8101, fp8 :8102, int8_per_token_head :8103")
    p_start = sub.add_parser("start", help="start one server")
    p_start.add_argument("port", type=int)
    p_start.add_argument("kv_cache_dtype")
    p_start.add_argument("--max-model-len", type=int, default=8192)
    p_stop = sub.add_parser("stop")
    p_stop.add_argument("port", type=int)
    sub.add_parser("stop-all")
    sub.add_parser("status")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "setup":
            print(ensure_venv())
        elif args.cmd == "demo":
            for server in start_many(demo_specs()):
                print(server.url)
        elif args.cmd == "start":
            print(start(ServerSpec(port=args.port, kv_cache_dtype=args.kv_cache_dtype,
                                   max_model_len=args.max_model_len)).url)
        elif args.cmd == "stop":
            stop(args.port)
        elif args.cmd == "stop-all":
            stop_all()
        else:
            print(json.dumps(status(), indent=2))
    except LaunchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
