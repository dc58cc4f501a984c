#!/usr/bin/env bash
# A/B of two source trees in one run on the GPU machine: this checkout and an older one,
# same machine, same run (rows move between machines by more than most changes).
#
#   git archive <rev> packages | (mkdir -p ab_old && tar -x -C ab_old)   # here, once
#   bash benchmarks/ab_trees.sh ab_old MODELS [MODES] [BACKENDS]           # on the GPU machine
#
# ab_old is untracked: copy it to the GPU machine along with the checkout (or keep it unignored).
# Each tree runs `ember bench --no-warm` with PYTHONPATH over its own packages, twice
# in alternation (old, new, old, new), so that a drift of the machine shows; then the
# backends named in BACKENDS (default none; e.g. inductor) once, as the yardstick.
# Prints one line per model and mode: cold seconds and step ms of every run.
# DEVICE=cpu runs it on the CPU (a check of the script itself).
set -u
OLD_TREE=${1:?old tree directory}; MODELS=${2:?models}; MODES=${3:-inference}; OTHERS=${4:-}
R=${OUT:-ab_out}/ab; mkdir -p "$R"
NEW=$(printf '%s:' "$PWD"/packages/*/src); OLD=$(printf '%s:' "$PWD/$OLD_TREE"/packages/*/src)
bench() {  # tag pythonpath backends
  PYTHONPATH=$2 python3 -m ember.runtime.cli bench --device "${DEVICE:-cuda}" --models "$MODELS" --no-warm \
    --modes "$MODES" --backends "$3" --json "$R/$1.json" >"$R/$1.log" 2>&1
}
for round in 1 2; do
  bench "old$round" "$OLD" ember
  bench "new$round" "$NEW" ember
done
[ -n "$OTHERS" ] && bench others "$NEW" "$OTHERS"
python3 - "$R" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
rows: dict = {}
for tag in ["old1", "new1", "old2", "new2", "others"]:
    path = out / f"{tag}.json"
    if not path.exists():
        continue
    for r in json.loads(path.read_text()):
        if r.get("backend") == "eager":
            continue
        name = tag if tag != "others" else r["backend"]
        cold, ms = r.get("compile_cold_s"), r.get("ms")
        cell = f"{name}: cold {cold:.2f} s, {ms:.3f} ms" if cold and ms else f"{name}: -"
        if r.get("matches_eager") is False:
            cell += " (differs from eager)"
        rows.setdefault((r["model"], r["mode"]), []).append(cell)
for (model, mode), cells in rows.items():
    print(f"{model} {mode} | " + " | ".join(cells))
PY
