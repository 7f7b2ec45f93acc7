#!/usr/bin/env bash
# Fuzzes the targets of tests/fuzz with libFuzzer (AddressSanitizer and
# UndefinedBehaviorSanitizer on), starting from their seed corpora in
# tests/fuzz/corpus/<target>/, and prints per target the executions, their
# rate, the coverage reached (libFuzzer's edges "cov" and features "ft")
# and what was found.
#
#   bash scripts/fuzz.sh [SECONDS per target, default 600] [TARGET ...]
#
# GAC_FUZZ_JOBS targets run at once (default 1, niced); the tree is
# ${GAC_ASAN_DIR:-build-asan} (built by scripts/sanitize.sh asan, or here
# when missing). New inputs collect in ${GAC_FUZZ_WORK:-<tree>/fuzz-work}/
# <target>/ (not in the repository); a crash leaves crash-* there, which
# becomes a regression input once copied into tests/fuzz/corpus/<target>/
# (ctest replays the corpus: fuzz_<target>_corpus).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-600}
shift || true
dir=${GAC_ASAN_DIR:-build-asan}
work=${GAC_FUZZ_WORK:-$dir/fuzz-work}
jobs=${GAC_FUZZ_JOBS:-1}
targets=("$@")
if ((${#targets[@]} == 0)); then
  targets=(ingest_request decide_request decide_response admin_request query_request page_token spool config_file
           token_file http_api)
fi
if [ ! -x "$dir/tests/fuzz/fuzz_${targets[0]}" ]; then
  GAC_SANITIZE_TEST=0 bash scripts/sanitize.sh asan
fi
export ASAN_OPTIONS="detect_leaks=1:strict_string_checks=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"

run_one() {
  local t=$1 out=$work/$1
  mkdir -p "$out/corpus"
  nice -n 10 "$dir/tests/fuzz/fuzz_$t" -max_total_time="$seconds" -print_final_stats=1 -timeout=10 \
    -rss_limit_mb=2048 -artifact_prefix="$out/" "$out/corpus" "tests/fuzz/corpus/$t" >"$out/log" 2>&1
}

status=0
pids=()
names=()
for t in "${targets[@]}"; do
  run_one "$t" &
  pids+=($!)
  names+=("$t")
  if ((${#pids[@]} >= jobs)); then
    wait "${pids[0]}" || true
    pids=("${pids[@]:1}")
  fi
done
for p in "${pids[@]}"; do wait "$p" || true; done

printf '%-16s %12s %9s %7s %7s %7s %s\n' target executions exec/s cov ft corpus found
for t in "${names[@]}"; do
  log=$work/$t/log
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  last=$(grep -E '^#[0-9]+' "$log" | grep -E 'cov: ' | tail -1 || true)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
  corp=$(sed -n 's/.* corp: \([0-9]*\).*/\1/p' <<<"$last")
  found=none
  if compgen -G "$work/$t/crash-*" >/dev/null || compgen -G "$work/$t/leak-*" >/dev/null ||
     compgen -G "$work/$t/timeout-*" >/dev/null || compgen -G "$work/$t/oom-*" >/dev/null ||
     grep -aq "ERROR: libFuzzer\|ERROR: AddressSanitizer\|runtime error\|property broken" "$log"; then
    found="see $log"
    status=1
  fi
  printf '%-16s %12s %9s %7s %7s %7s %s\n' "$t" "${execs:-?}" "${rate:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}" "$found"
done
exit $status
