#!/usr/bin/env bash
# CI smoke of the main job: scripts/demo_run.sh end to end on a short
# configuration (a real gacd on OS-chosen ports, seven gac_grpo runs, the
# report), then checks what it left behind:
#   - demo_run.sh succeeded: every trainer exited 0 with all its telemetry
#     acknowledged, and gacd's /metrics counted every step of every run;
#   - the summary table has the seven runs, the remote run used gacd, the
#     windowed run decided in the trainer, and the controls used the
#     windowed run's skip rate (random skips; lr x (1 - rate));
#   - the figure exists when matplotlib is importable;
#   - the Prometheus config it wrote passes promtool;
#   - it printed the address of gacd's page.
# Usage: demo_smoke.sh BUILD_DIR OUT_DIR
set -euo pipefail
build=$1
out=$2
repo="$(cd "$(dirname "$0")/../.." && pwd)"
rm -rf "$out"
GAC_DEMO_OUT="$out" GAC_DEMO_STEPS=40 GAC_DEMO_SFT_STEPS=50 GAC_DEMO_STALENESS=4 GAC_DEMO_CALIB_SKIP=5 \
  GAC_DEMO_METRICS=127.0.0.1:0 bash "$repo/scripts/demo_run.sh" "$build" | tee "$out.log"

fail() { echo "demo_smoke: $*" >&2; exit 1; }
rows=$(grep -c '^| \(synchronous\|stale\)' "$out/summary.md") || true
[ "$rows" = 7 ] || fail "summary.md has $rows run rows, want 7"
grep -q '^| stale + GAC in gacd | 40 |.*| remote |' "$out/summary.md" || fail "no 40-step remote GAC row"
grep -q '^| stale + GAC window | 40 |.*| local (window) |' "$out/summary.md" || fail "no windowed GAC row"
skipped=$(sed -n 's/.* skipped=\([0-9]*\) .*/\1/p' "$out/runs/gacwin.log")
rate=$(awk -v n="$skipped" 'BEGIN { printf "%.4f", n / 40 }')
used=$(sed -n 's/.*, random skip \([0-9.e+-]*\)$/\1/p' "$out/runs/rskip.log")
awk -v a="$used" -v b="$rate" 'BEGIN { exit !(a != "" && a - b < 1e-6 && b - a < 1e-6) }' ||
  fail "the control skipped with probability '$used', not at the windowed run's rate $rate"
lr=$(sed -n 's/.*, lr \([0-9.e+-]*\), c_low.*/\1/p' "$out/runs/lrs.log")
awk -v a="$lr" -v b="$rate" 'BEGIN { want = 3e-4 * (1 - b); exit !(a != "" && a - want < 1e-9 && want - a < 1e-9) }' ||
  fail "the lr-scaled control used lr '$lr', not 3e-4 x (1 - $rate)"
for run in sync stale gac gacwin is rskip lrs; do
  grep -q '^telemetry: 40 records sent, 40 acknowledged, 0 dropped' "$out/runs/$run.log" ||
    fail "run $run: not every record acknowledged"
done
python=${PYTHON:-$(dirname "$0")/../../.venv/bin/python}
if "$python" -c 'import matplotlib' 2>/dev/null; then
  [ -s "$out/demo.png" ] || fail "no figure although matplotlib is present"
fi
if command -v promtool >/dev/null; then
  promtool check config "$out/prometheus.yml" || fail "the Prometheus config does not pass promtool"
fi
grep -q '^demo: watch the runs live in a browser: http://127\.0\.0\.1:[0-9]*/$' "$out.log" ||
  fail "the address of gacd's page was not printed"
echo "demo_smoke: ok"
