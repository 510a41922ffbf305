#!/usr/bin/env bash
# launch.sh eval|canary NAME [probes|budget]: one kvprobe command in the background (setsid), from /tmp/w/proj,
# into /tmp/w/run-NAME; its output in /tmp/w/NAME.txt, its exit code in /tmp/w/NAME.rc when it ends.
set -euo pipefail
W=/tmp/w; cd $W/proj; . .gpu/bin/env.sh
what=$1 name=$2 arg=${3:-}
if [ "$what" = eval ]; then args="eval --servers benchmarks/gpu/speed.toml --probes $arg -v"
else args="canary --servers benchmarks/gpu/canary.toml --budget ${arg:-5m} -v"; fi
rm -rf "$W/run-$name" "$W/$name.rc"
setsid nohup ${CLIENT_CPUS:+taskset -c $CLIENT_CPUS} bash -c "cd $W/proj; . .gpu/bin/env.sh; export COLUMNS=160; start=\$(date +%s);
  python3 -c 'import sys; from kvprobe.cli import main; sys.argv[0] = \"kvprobe\"; main()' $args --out $W/run-$name;
  rc=\$?; echo \"wall \$(( \$(date +%s) - start )) s\"; echo \$rc > $W/$name.rc" >"$W/$name.txt" 2>&1 </dev/null &
echo "started $what $name"
