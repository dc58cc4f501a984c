#!/usr/bin/env bash
# A/B of resnet50 inference step time: current tree, no compile workers, session 4's tree.
NEW=$(printf '%s:' "$PWD"/packages/*/src); OLD=$(printf '%s:' "$PWD"/old4e5/packages/*/src)
run() { tag=$1; shift; env "$@" python3 -m ember.runtime.cli bench --device cuda --models resnet50 --modes inference --backends eager,ember --no-warm --no-prefetch --json $OUT/ab-$tag.json > $OUT/ab-$tag.log 2>&1; echo "$tag: $(grep -E '^resnet50' $OUT/ab-$tag.log | awk '{print $3, $6}' | tr '\n' ' ')"; }
run new PYTHONPATH=$NEW
run new0 PYTHONPATH=$NEW EMBER_COMPILE_WORKERS=0
run old PYTHONPATH=$OLD
