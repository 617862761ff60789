#!/usr/bin/env bash
# Runs every libFuzzer target of a build-fuzz/ tree for SECONDS each, JOBS targets at a time.
#   run-fuzzers.sh FUZZ_DIR SOURCE_DIR SECONDS JOBS
#
# Each tests/fuzz/<name>_fuzz.cc runs on the corpus FUZZ_DIR/corpus/<name>_fuzz, seeded from
# tests/fuzz/corpus/<name>_fuzz (or tests/fuzz/corpus/<name>) when that exists. Crashes land in
# FUZZ_DIR/artifacts/<name>_fuzz/, the full output in FUZZ_DIR/logs/<name>_fuzz.log. Every target
# runs to its end even when another fails; the script then prints each target's runs and coverage
# (or the tail of a failing log) in the order of the sources, and exits 1 if any failed.
set -euo pipefail

usage() { echo "usage: run-fuzzers.sh FUZZ_DIR SOURCE_DIR SECONDS JOBS" >&2; exit 2; }
(($# == 4)) || usage
fuzz_dir=$1 root=$2 seconds=$3 jobs=$4
[[ $seconds =~ ^[0-9]+$ ]] || { echo "run-fuzzers: SECONDS must be a whole number, not '$seconds'" >&2; exit 2; }
[[ $jobs =~ ^[1-9][0-9]*$ ]] || { echo "run-fuzzers: JOBS must be a positive number, not '$jobs'" >&2; exit 2; }

shopt -s nullglob
sources=("$root"/tests/fuzz/*_fuzz.cc)
if ((${#sources[@]} == 0)); then echo "fuzz: no targets in $root/tests/fuzz"; exit 0; fi
if ((seconds == 0)); then echo "fuzz: FUZZ_SECONDS=0, not running"; exit 0; fi

names=()
for src in "${sources[@]}"; do
  name=$(basename "$src" .cc)
  [[ -x $fuzz_dir/tests/$name ]] || { echo "fuzz: $fuzz_dir/tests/$name was not built" >&2; exit 1; }
  names+=("$name")
done

# One target: its corpus, seeds and artifact folder; the exit status goes to logs/<name>.rc.
run_one() {
  local name=$1 corpus=$fuzz_dir/corpus/$1 artifacts=$fuzz_dir/artifacts/$1 log=$fuzz_dir/logs/$1.log
  local -a dirs=("$corpus")
  local seeds rc=0
  mkdir -p "$corpus" "$artifacts" "$(dirname "$log")"
  for seeds in "$root"/tests/fuzz/corpus/{"$name","${name%_fuzz}"}; do
    if [[ -d $seeds ]]; then dirs+=("$seeds"); break; fi
  done
  "$fuzz_dir/tests/$name" -max_total_time="$seconds" -print_final_stats=1 \
    -artifact_prefix="$artifacts/" "${dirs[@]}" >"$log" 2>&1 || rc=$?
  echo "$rc" >"$fuzz_dir/logs/$name.rc"
}

echo "fuzz: ${#names[@]} targets, ${seconds}s each, $jobs at a time (logs in $fuzz_dir/logs/)"
running=0
for name in "${names[@]}"; do
  if ((running >= jobs)); then wait -n || true; running=$((running - 1)); fi
  rm -f "$fuzz_dir/logs/$name.rc"
  run_one "$name" &
  running=$((running + 1))
done
wait

failed=()
for name in "${names[@]}"; do
  log=$fuzz_dir/logs/$name.log
  rc=$(cat "$fuzz_dir/logs/$name.rc" 2>/dev/null || echo "none")
  if [[ $rc != 0 ]]; then
    tail -n 80 "$log" 2>/dev/null || true
    echo "fuzz: $name FAILED (exit $rc; log $log, inputs in $fuzz_dir/artifacts/$name/)" >&2
    failed+=("$name")
    continue
  fi
  runs=$(grep -oE 'Done [0-9]+ runs in [0-9]+ second\(s\)' "$log" | tail -1 || true)
  cov=$(grep -oE 'cov: [0-9]+ ft: [0-9]+' "$log" | tail -1 || true)
  echo "fuzz: $name: ${runs:-no run count}; coverage at the end: ${cov:-not reported} (edges, features)"
done
if ((${#failed[@]})); then echo "fuzz: ${#failed[@]} of ${#names[@]} targets failed: ${failed[*]}" >&2; exit 1; fi
echo "fuzz: all ${#names[@]} targets ran clean"
