#!/usr/bin/env bash
# CI smoke of the main job: scripts/demo_run.sh end to end on a short
# configuration (a real gacd on OS-chosen ports, eight gac_grpo runs, the
# report), then checks what it left behind:
#   - demo_run.sh succeeded: every trainer exited 0 with all its telemetry
#     acknowledged, and gacd's /metrics counted every step of every run;
#   - the summary table has the seven test-seed runs, the remote run used
#     gacd, the windowed run decided in the trainer, the thresholds came from
#     the calibration seed, and the controls are the remote GAC run's: its
#     skipped steps replayed exactly, and lr x its mean gradient scale;
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
grep -q '^seeds=101$' "$out/calibration.txt" || fail "the thresholds did not come from the calibration seed 101"
# The replayed skips: exactly the steps the GAC run did not step.
want=$(awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "stepped") c = i; next } $c == 0 { print $1 }' "$out/runs/gac.csv")
got=$(awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "stepped") c = i; next } $c == 0 { print $1 }' "$out/runs/mskip.csv")
[ "$want" = "$(cat "$out/gac-skipped.txt")" ] || fail "the mask is not the GAC run's skipped steps"
[ "$want" = "$got" ] || fail "the control skipped steps '$got', not the GAC run's '$want'"
scale=$(awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "grad_scale") c = i; next } { s += $c; n++ }
                 END { printf "%.9g", s / n }' "$out/runs/gac.csv")
lr=$(sed -n 's/.*, lr \([0-9.e+-]*\), c_low.*/\1/p' "$out/runs/lrs.log")
awk -v a="$lr" -v b="$scale" 'BEGIN { want = 3e-4 * b; exit !(a != "" && a - want < 1e-8 && want - a < 1e-8) }' ||
  fail "the lr-scaled control used lr '$lr', not 3e-4 x $scale"
for run in calib sync stale gac gacwin is mskip lrs; do
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
