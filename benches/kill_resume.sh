#!/usr/bin/env bash
# Kills the training worker (the child process `vramfit train` starts) with SIGKILL at 20 random
# moments (2-6 s apart: mid-step and mid-save), resumes the run after each, then checks that
# metrics.csv lists every step exactly once.
#
#   cargo build --release && bash benches/kill_resume.sh [RUN_DIR]
#
# Quickstart on the bundled data, burn flex, 4 epochs of 94 steps, a checkpoint every 10 steps.
set -u
V=${VRAMFIT:-target/release/vramfit}
R=${1:-/tmp/vramfit-kill-resume}
rm -rf "$R"
ARGS=(--device cpu --epochs 4 --batch-size 64 --set train.checkpoint_every_steps=10 --out "$R")
"$V" train "${ARGS[@]}" >"$R.log" 2>&1 &
pid=$!
for i in $(seq 1 20); do
  sleep $((RANDOM % 4 + 2)).$((RANDOM % 10))
  worker=$(pgrep -P $pid 2>/dev/null | head -1)
  if [ -n "$worker" ]; then kill -9 "$worker"; wait $pid 2>/dev/null; state="worker killed"; else wait $pid 2>/dev/null; state="had ended"; fi
  last=$(tail -n 1 "$R/metrics.csv" 2>/dev/null | cut -d, -f1)
  ck=$(sed -E 's/.*"(step-[0-9]+)".*/\1/' "$R/checkpoints/latest.json" 2>/dev/null || echo none)
  echo "kill $i ($state): last metrics step ${last:-none}, latest.json -> $ck, temporary files $(find "$R" -name '.*.tmp' | wc -l)"
  "$V" train "${ARGS[@]}" --resume >>"$R.log" 2>&1 &
  pid=$!
done
wait $pid
echo "final resume exit status $?"
python3 - "$R/metrics.csv" <<'PY'
import csv, sys
steps = [int(r["step"]) for r in csv.DictReader(open(sys.argv[1]))]
ok = steps == list(range(1, 4 * 94 + 1))
print(f"metrics.csv: {len(steps)} rows, {len(set(steps))} distinct; every step 1..376 exactly once: {ok}")
sys.exit(0 if ok else 1)
PY
