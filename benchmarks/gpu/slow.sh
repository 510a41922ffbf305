#!/usr/bin/env bash
# On the H200 host, in the call that unpacks vLLM: auto :8101, its twin :8102, the stretching proxy :8105 in
# front of the twin, then `kvprobe eval --servers benchmarks/gpu/slow.toml --probes load` in the foreground,
# its run directory packed into $OUT however it ends.
set -uo pipefail
W=/tmp/w; mkdir -p $W; rm -rf $W/proj; mkdir $W/proj
tar --exclude=./.git --exclude='./.gpu/vx.part.*' -cf - . | tar -C $W/proj -xf -
cd $W/proj
trap 'tar -C $W -czf "$OUT/run-slow.tgz" run-slow slow.txt proxy.log 2>/dev/null' EXIT
M=$W/proj/demo/models/needle-llama
bash .gpu/bin/serve.sh 8101 "$M" needle-llama 8192 --kv-cache-dtype auto
bash .gpu/bin/serve.sh 8102 "$M" needle-llama 8192 --kv-cache-dtype auto
setsid nohup python3 tests/faultproxy.py --stretch 1.3 --port 8105 http://127.0.0.1:8102 >$W/proxy.log 2>&1 </dev/null &
python3 .gpu/bin/wait_ready.py 8101 8102 8105 || exit 1
. .gpu/bin/env.sh
export COLUMNS=160
python3 -c 'import sys; from kvprobe.cli import main; sys.argv[0] = "kvprobe"; main()' eval \
  --servers benchmarks/gpu/slow.toml --probes load -v --out $W/run-slow 2>&1 | grep --line-buffered -v "━" | tee $W/slow.txt
