#!/usr/bin/env bash
# make fuzz: runs every libFuzzer target of test/fuzz/ (built in FUZZ_DIR by the Makefile, under
# ASan + UBSan) for SECONDS each, from its committed seed corpus (test/fuzz/corpus/<target>/; new
# inputs go to FUZZ_DIR/corpus/<target>/), and prints executions and findings per target. A finding
# (crash, sanitizer report, uncaught exception, timeout, an allocation past 1 GiB) leaves its input in
# FUZZ_DIR/findings/ and makes the exit status 1.
#   scripts/fuzz.sh FUZZ_DIR SECONDS
set -uo pipefail
dir=$1
seconds=$2
mkdir -p "$dir/findings"
status=0
printf '%-12s %12s %10s %8s %s\n' target executions "exec/s" corpus findings
for bin in "$dir"/fuzz_*; do
  [ -x "$bin" ] || continue
  target=${bin##*/fuzz_}
  corpus="$dir/corpus/$target"
  mkdir -p "$corpus"
  log="$dir/$target.log"
  "$bin" "$corpus" "test/fuzz/corpus/$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -malloc_limit_mb=1024 -print_final_stats=1 -artifact_prefix="$dir/findings/$target-" > "$log" 2>&1
  rc=$?
  runs=$(sed -nE 's/^stat::number_of_executed_units: *([0-9]+)/\1/p' "$log" | tail -1)
  rate=$(sed -nE 's/^stat::average_exec_per_sec: *([0-9]+)/\1/p' "$log" | tail -1)
  found=$(ls "$dir/findings/$target-"* 2>/dev/null | wc -l)
  printf '%-12s %12s %10s %8s %s\n' "$target" "${runs:-?}" "${rate:-?}" "$(ls "$corpus" | wc -l)" "$found"
  if [ "$rc" -ne 0 ] || [ "$found" -ne 0 ]; then
    status=1
    echo "fuzz: $target: exit status $rc; its log: $log" >&2
    grep -m3 -E "ERROR|SUMMARY|uncaught|deadly" "$log" >&2
  fi
done
exit $status
