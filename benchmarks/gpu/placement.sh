#!/usr/bin/env bash
# placement.sh: after `PIN=1 start.sh placement` has the servers up, two evals of placement.toml one after the other in
# the background: `pinned` as started, then `unpinned` with every server process (all threads) and the client
# allowed onto all cores. Same card, same servers, same session: what pinning alone does to the block spread.
# Poll each with poll.sh pinned / poll.sh unpinned.
set -euo pipefail
W=/tmp/w; cd $W/proj
all=0-$(( $(nproc) - 1 ))
run() {  # NAME [taskset cpus]
  rm -rf "$W/run-$1" "$W/$1.rc"
  local start; start=$(date +%s)
  ${2:+taskset -c $2} python3 -c 'import sys; from kvprobe.cli import main; sys.argv[0] = "kvprobe"; main()' \
    eval --servers benchmarks/gpu/placement.toml --probes capacity,load -v --out "$W/run-$1" >"$W/$1.txt" 2>&1
  local rc=$?; echo "wall $(( $(date +%s) - start )) s" >>"$W/$1.txt"; echo $rc >"$W/$1.rc"
}
unpin() {  # every thread of every process in each server's session (serve.sh's setsid: API server, engine core)
  for leader in $(pgrep -f "vllm.entrypoints.cli.main serve"); do
    for p in $(pgrep -s "$(ps -o sid= -p "$leader" | tr -d ' ')"); do taskset -a -cp "$all" "$p" >/dev/null || true; done
  done
  ps -eo pid,sid,psr,comm | grep -iE "python|vllm|engine" | while read -r pid rest; do
    echo "$pid $rest $(taskset -cp "$pid" 2>/dev/null | sed 's/.*: //')"; done
}
export -f run unpin; export W all
setsid nohup bash -c ". .gpu/bin/env.sh; export COLUMNS=160; set +e; run pinned 13-15; unpin >$W/unpin.txt 2>&1; run unpinned" \
  >$W/placement.txt 2>&1 </dev/null &
echo "started pinned then unpinned"
