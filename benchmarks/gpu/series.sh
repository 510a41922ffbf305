#!/usr/bin/env bash
# series.sh PROBES NAME=TOML ...: in the background (setsid), one `kvprobe eval` after the other from
# /tmp/w/proj, each into /tmp/w/run-NAME, its output in /tmp/w/NAME.txt and its exit code in /tmp/w/NAME.rc.
# One eval at a time: two evals sharing the GPU would each measure the other's load as noise.
set -euo pipefail
W=/tmp/w; probes=$1; shift
script=""
for pair in "$@"; do
  name=${pair%%=*} toml=${pair#*=}
  rm -rf "$W/run-$name" "$W/$name.rc"
  script+="start=\$(date +%s);
  python3 -c 'import sys; from kvprobe.cli import main; sys.argv[0] = \"kvprobe\"; main()' eval --servers $toml \
    --probes $probes -v --out $W/run-$name >$W/$name.txt 2>&1;
  rc=\$?; echo \"wall \$(( \$(date +%s) - start )) s\" >>$W/$name.txt; echo \$rc > $W/$name.rc;
"
done
setsid nohup ${CLIENT_CPUS:+taskset -c $CLIENT_CPUS} bash -c "cd $W/proj; . .gpu/bin/env.sh; export COLUMNS=160; $script" >$W/series.txt 2>&1 </dev/null &
echo "started: $*"
