#!/usr/bin/env bash
# poll.sh NAME [WAIT_S]: wait up to WAIT_S (default 0) for /tmp/w/NAME.rc, print where the run stands and
# pack its directory into $OUT (so a lease that ends mid-run still brings back every finished block).
W=/tmp/w; name=$1; wait_s=${2:-0}; t=0
while [ ! -e "$W/$name.rc" ] && [ "$t" -lt "$wait_s" ]; do sleep 10; t=$((t + 10)); done
grep -v "━" "$W/$name.txt" | tail -40
[ -e "$W/$name.rc" ] && echo "rc $(cat $W/$name.rc)" || echo "still running"
nvidia-smi --query-gpu=name,driver_version,memory.used,utilization.gpu --format=csv,noheader
if [ -n "${OUT:-}" ] && [ -d "$W/run-$name" ]; then
  tar -C $W -czf "$OUT/run-$name.tgz" "run-$name" "$name.txt" proxy.log 2>/dev/null
  for p in 8101 8102 8103 8104; do tail -c 20000 $W/../vx/srv-$p.log > "$OUT/srv-$p.log" 2>/dev/null; done
fi
