#!/usr/bin/env bash
# Ember's correctness evidence on the GPU machine (torch and triton installed, no uv):
# the CUDA tests, the differential fuzzer on CUDA and on the CPU (all cores, crash-
# isolated workers), and the strict OpInfo sweep on CUDA. Each stage writes its logs
# and JSON under OUT (default bench_out/) and prints one summary line; pick stages
# with the first argument (default: all). The summary lines are printed again last.
#
#   benchmarks/reliability_gpu.sh tests,fuzz-gpu,fuzz-cpu,opinfo
#
# Sizes come from the environment: FUZZ_GPU_SEEDS (0:1000), FUZZ_CPU_SEEDS (0:10000),
# FUZZ_BUDGET (seconds per fuzz stage, 480), WORKERS (cores - 1), OPINFO_SHARDS (8).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$(printf '%s:' "$PWD"/packages/*/src)${PYTHONPATH:-}
export PYTHONUNBUFFERED=1
OUT=${OUT:-bench_out}
mkdir -p "$OUT"
STAGES=${1:-tests,fuzz-gpu,fuzz-cpu,opinfo}
WORKERS=${WORKERS:-$(( $(nproc) - 1 ))}
BUDGET=${FUZZ_BUDGET:-480}
has() { [[ ",$STAGES," == *",$1,"* ]]; }
say() { echo "$1" | tee -a "$OUT/summary.txt"; }

if has tests; then
    python3 -m pytest -m cuda -q -p no:cacheprovider packages tests >"$OUT/cuda_tests.log" 2>&1
    say "cuda tests: $(tail -n 1 "$OUT/cuda_tests.log")"
fi
if has fuzz-gpu; then
    python3 -m ember.runtime.fuzz --device cuda --seeds "${FUZZ_GPU_SEEDS:-0:1000}" \
        --workers "$(( WORKERS < 8 ? WORKERS : 8 ))" --time-budget "$BUDGET" \
        --out "$OUT/fuzz_cuda" --json "$OUT/fuzz_cuda.json" >"$OUT/fuzz_cuda.log" 2>&1
    say "cuda $(tail -n 1 "$OUT/fuzz_cuda.log")"
fi
if has fuzz-cpu; then
    python3 -m ember.runtime.fuzz --device cpu --seeds "${FUZZ_CPU_SEEDS:-0:10000}" \
        --workers "$WORKERS" --time-budget "$BUDGET" \
        --out "$OUT/fuzz_cpu" --json "$OUT/fuzz_cpu.json" >"$OUT/fuzz_cpu.log" 2>&1
    say "cpu $(tail -n 1 "$OUT/fuzz_cpu.log")"
fi
if has opinfo; then
    shards=${OPINFO_SHARDS:-8}
    for k in $(seq 0 $((shards - 1))); do
        OMP_NUM_THREADS=1 EMBER_COMPILE_WORKERS=0 python3 -m ember.runtime.opinfo --device cuda \
            --no-fallback --dtypes float32,bfloat16 --shard "$k/$shards" --show mismatch,error \
            --json "$OUT/opinfo_cuda_$k.json" >"$OUT/opinfo_cuda_$k.log" 2>&1 &
    done
    wait
    cat "$OUT"/opinfo_cuda_*.log | grep -E '^(mismatch|error) ' >"$OUT/opinfo_cuda_findings.txt"
    python3 - "$OUT" <<'EOF' | tee -a "$OUT/summary.txt"
import collections, glob, json, sys
out = sys.argv[1]
shards = sorted(glob.glob(f"{out}/opinfo_cuda_[0-9]*.json"))
rows = [r for f in shards for r in json.load(open(f))]
json.dump(rows, open(f"{out}/opinfo_cuda.json", "w"), indent=1)
for dtype in sorted({r["dtype"] for r in rows}):
    counts = collections.Counter(r["outcome"] for r in rows if r["dtype"] == dtype)
    print(f"opinfo cuda {dtype} fallback=off: {sum(counts.values())} ops: "
          + ", ".join(f"{counts[o]} {o}" for o in ("pass", "mismatch", "error", "skip")))
lowering = sum("LoweringError" in r["detail"] for r in rows if r["outcome"] == "error")
print(f"opinfo cuda: {lowering} of the errors are ops without a lowering (fallbacks off)")
EOF
    rm -f "$OUT"/opinfo_cuda_[0-9]*.json "$OUT"/opinfo_cuda_[0-9]*.log
fi
echo "== summary"
cat "$OUT/summary.txt"
