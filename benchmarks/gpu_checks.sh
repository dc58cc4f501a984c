#!/usr/bin/env bash
# GPU checks in one run: the CUDA tests, then whichever measurements are named.
#   bash benchmarks/gpu_checks.sh [tests] [demo] [kernels] [launch] [profile:MODELS] [bench:MODELS:SECONDS[:MODES]]
# Logs go to $OUT (or ./gpu_out); a short summary of each part is printed last.
set -u
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
export PYTHONPATH=$(printf '%s:' "$PWD"/packages/*/src)
summary=()
for part in "$@"; do
  start=$(date +%s)
  case "$part" in
    tests) # four pytest processes at once, the test files dealt out largest first: one
           # process took over 8 minutes on an H100, four took 4.4 (2026-11-25)
           mapfile -t files < <(grep -l "mark.cuda" packages/*/tests/*.py tests/*/*.py | xargs ls -S)
           pids=()
           for g in 0 1 2 3; do
             mine=(); for i in "${!files[@]}"; do (( i % 4 == g )) && mine+=("${files[$i]}"); done
             python3 -m pytest -m cuda -q -p no:cacheprovider "${mine[@]}" >"$OUT/tests-$g.log" 2>&1 &
             pids+=($!)
           done
           wait "${pids[@]}"
           for g in 0 1 2 3; do summary+=("tests $g: $(tail -1 "$OUT/tests-$g.log")"); done ;;
    demo) python3 -m ember.runtime.cli demo --device cuda >"$OUT/demo.log" 2>&1
          summary+=("demo: rc=$?") ;;
    kernels) python3 benchmarks/triton_kernels.py >"$OUT/kernels.log" 2>&1
             summary+=("kernels: rc=$?") ;;
    launch) python3 benchmarks/launch_overhead.py >"$OUT/launch.log" 2>&1
            summary+=("launch: rc=$?") ;;
    profile:*) python3 benchmarks/compile_profile.py --device cuda --models "${part#profile:}" \
                 >"$OUT/profile.log" 2>&1
               summary+=("profile: rc=$?") ;;
    bench:*) IFS=: read -r _ models limit modes <<<"$part"
             # file names without commas: plain names are the easiest to copy back
             tag=${models//,/_}
             python3 -m ember.runtime.cli bench --device cuda --models "$models" --no-warm \
               --modes "${modes:-inference,train}" --time-limit "$limit" \
               --json "$OUT/bench-$tag.json" >"$OUT/bench-$tag.log" 2>&1
             summary+=("bench $models: rc=$?") ;;
    *) echo "unknown part $part"; exit 2 ;;
  esac
  summary[-1]+=" ($(( $(date +%s) - start )) s)"
done
for f in "$OUT"/demo.log "$OUT"/kernels.log "$OUT"/launch.log "$OUT"/profile.log "$OUT"/bench-*.log; do
  [ -f "$f" ] && { echo "== $f"; tail -30 "$f"; }
done
grep -h -E "^(FAILED|ERROR)" "$OUT"/tests-*.log 2>/dev/null | head -20
printf '%s\n' "${summary[@]}"
