#!/usr/bin/env bash
# On the H200 host, in the call that unpacks vLLM (../shared/gpu): copy the project to /tmp/w/proj (the
# tree the device lays anew for every call must not change under a running eval), start the four real
# vLLM servers and the stretching proxy, wait for them, then start the eval in the background.
#   bash benchmarks/gpu/start.sh [probes]                  # default capacity,load: speed.toml
#   bash benchmarks/gpu/start.sh PROBES NAME=TOML ...      # those evals one after the other (series.sh)
#   bash benchmarks/gpu/start.sh placement                 # pinned, then unpinned (placement.sh)
set -euo pipefail
W=/tmp/w; mkdir -p $W; rm -rf $W/proj; mkdir $W/proj
tar --exclude=./.git --exclude='./.gpu/vx.part.*' -cf - . | tar -C $W/proj -xf -
cd $W/proj
M=$W/proj/demo/models/needle-llama
# PIN=1 gives each server its own 3 cores, the proxy one and the client the last 3; PIN=0 (the default) leaves
# placement to the scheduler. On one H200 in one session pinning spread the blocks more, not less (0.056-0.074
# against 0.046-0.050) and slowed the cases by a third (tests/fixtures/runs/h200-placement-*).
lscpu | grep -E "^(Model name|CPU\(s\)|Thread|Core|Socket|NUMA node)" || true
pin() { if [ "${PIN:-0}" = 1 ]; then echo "taskset -c $1"; fi; }
$(pin 0-2) bash .gpu/bin/serve.sh 8101 "$M" needle-llama 8192 --kv-cache-dtype auto
$(pin 3-5) bash .gpu/bin/serve.sh 8102 "$M" needle-llama 8192 --kv-cache-dtype auto
$(pin 6-8) bash .gpu/bin/serve.sh 8103 "$M" needle-llama 8192 --kv-cache-dtype fp8
$(pin 9-11) bash .gpu/bin/serve.sh 8104 "$M" needle-llama 8192 --kv-cache-dtype int8_per_token_head
$(pin 12) setsid nohup python3 tests/faultproxy.py --stretch 1.3 --port 8105 http://127.0.0.1:8102 >$W/proxy.log 2>&1 </dev/null &
if [ "${PIN:-0}" = 1 ]; then export CLIENT_CPUS=13-15; fi
python3 .gpu/bin/wait_ready.py 8101 8102 8103 8104 8105
if [ "${1:-}" = placement ]; then bash benchmarks/gpu/placement.sh
elif [ $# -gt 1 ]; then bash benchmarks/gpu/series.sh "$@"; else bash benchmarks/gpu/launch.sh eval speed "${1:-capacity,load}"; fi
