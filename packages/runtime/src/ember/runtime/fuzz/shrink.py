"""Shrink a failing fuzzer program and write it out as a standalone reproducer script.

Shrinking is greedy and keeps a candidate only if it still fails the same way (same
finding kind) and eager still runs it: keep one failing output; bypass each step (its
uses read one of its operands instead, which eager rejects when shapes no longer fit);
make the program static; set every dimension to a small size; turn inputs into float32.
It repeats until nothing shrinks, within a budget of candidate runs.

The reproducer is a plain Python script: the program as a function, its inputs from a
seeded generator, `torch.compile(backend="ember")`, and the accuracy rule. It exits 1
while the bug is there, so it can go into an issue and, once fixed, into a test.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

from ember.runtime.fuzz.program import Program, render_function, render_inputs
from ember.runtime.fuzz.run import INVALID, Finding

Judge = Callable[[Program], Finding | None]


def _bypass(program: Program, index: int, operand: str) -> Program:
    """Drop step `index`; whatever read its result reads `operand` instead."""
    gone = program.steps[index].out

    def swap(names: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(operand if n == gone else n for n in names)

    steps = tuple(replace(s, args=swap(s.args)) for i, s in enumerate(program.steps) if i != index)
    outputs = tuple(dict.fromkeys(swap(program.outputs)))
    return program.with_steps(steps, outputs).live()


def _candidates(program: Program, finding: Finding) -> Iterator[Program]:
    if len(program.outputs) > 1:
        for out in program.outputs:
            if f"({out})" in finding.detail:
                yield program.with_steps(program.steps, (out,)).live()
        for out in program.outputs:
            yield program.with_steps(program.steps, (out,)).live()
    for index in reversed(range(len(program.steps))):
        for operand in dict.fromkeys(program.steps[index].args):
            yield _bypass(program, index, operand)
    if program.dynamic:
        yield replace(program, dynamic_sizes=())
    for dim, size in program.sizes:
        for smaller in (1, 2, 3):
            if smaller < size:
                sizes = tuple((d, smaller if d == dim else s) for d, s in program.sizes)
                yield replace(program, sizes=sizes)
    for i, inp in enumerate(program.inputs):
        simpler = []
        if inp.offset or inp.shares is not None:
            simpler.append(replace(inp, offset=0, shares=None))
        shared = any(other.shares == inp.name for other in program.inputs)
        if inp.dtype not in ("float32", "bool") and inp.index_of is None and not shared:
            simpler.append(replace(inp, dtype="float32", shares=None))
        for candidate in simpler:
            inputs = list(program.inputs)
            inputs[i] = candidate
            yield replace(program, inputs=tuple(inputs))


def shrink(
    program: Program, finding: Finding, judge: Judge, budget: int = 150
) -> tuple[Program, Finding]:
    """A smaller program that fails with the same kind of finding (greedy, bounded)."""
    runs = 0
    progress = True
    while progress and runs < budget:
        progress = False
        for candidate in _candidates(program, finding):
            if runs >= budget:
                break
            if candidate == program or not candidate.steps:
                continue
            runs += 1
            result = judge(candidate)
            if result is not None and result.kind == finding.kind and result.kind != INVALID:
                program, finding, progress = candidate, result, True
                break
    return program, finding


def reproducer_source(program: Program, finding: Finding, device: str = "cpu") -> str:
    """A standalone script that replays the failing program and exits 1 while it fails."""
    size_sets = [dict(program.sizes)] + ([dict(program.dynamic_sizes)] if program.dynamic else [])
    names = ", ".join(i.name for i in program.inputs)
    input_fns = []
    for number, sizes in enumerate(size_sets):
        body = "".join(f"    {line}\n" for line in render_inputs(program, sizes).splitlines())
        input_fns.append(f"def inputs_{number}(seed):\n{body}    return [{names}]\n")
    makers = ", ".join(f"inputs_{n}" for n in range(len(size_sets)))
    header = (
        f'"""Ember fuzzer reproducer (seed {program.seed}, {len(program.steps)} steps).\n\n'
        f"Found: {finding.kind}: {finding.detail}\n\n"
        "Run it with ember importable (PYTHONPATH over packages/*/src, or ember-runtime\n"
        'installed); it exits 1 while ember disagrees with eager."""\n\n'
    )
    main = f"""def main():
    compiled = torch.compile(program, backend="ember", dynamic={program.dynamic or None})
    failed = False
    for make in ({makers},):
        inputs = [t.to(DEVICE) for t in make(SEED)]  # never written: no copies needed
        try:
            expected = program(*inputs)
        except Exception as exc:  # bad input: ember must raise too
            try:
                compiled(*inputs)
                problem = f"eager raised {{exc}}, ember returned values"
            except Exception:
                problem = "OK"
            print(make.__name__, problem)
            failed = failed or problem != "OK"
            continue
        upcast = [t.double() if t.is_floating_point() else t for t in inputs]
        reference = program_float64(*upcast)
        actual = compiled(*inputs)
        verdict = compare_outputs(actual, expected, reference=reference)
        problem = "OK" if verdict is None else f"output{{verdict[1]}}: {{verdict[0].describe()}}"
        for index, (a, e) in enumerate(zip(actual, expected)):
            meta = metadata_mismatch(a, e)  # dtype, sizes, strides
            if verdict is None and meta is not None:
                problem = f"output {{index}}: {{meta}}"
                break
        print(make.__name__, problem)
        failed = failed or problem != "OK"
    return 1 if failed else 0
"""
    return (
        header
        + "import sys\n\nimport torch\n\nimport ember.runtime  # registers backend='ember'\n"
        + "from ember.runtime.accuracy import compare_outputs\n"
        + "from ember.runtime.check import metadata_mismatch\n"
        + "from ember.runtime.fuzz.program import make_index, make_input, place_views\n\n"
        + f"SEED = {program.seed}\nDEVICE = {device!r}\n\n\n"
        + render_function(program)
        + "\n\n"
        + render_function(program, float64=True, name="program_float64")
        + "\n\n"
        + "\n\n".join(input_fns)
        + "\n\n"
        + main
        + '\n\nif __name__ == "__main__":\n    sys.exit(main())\n'
    )


def write_reproducer(
    program: Program, finding: Finding, directory: Path, device: str = "cpu"
) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"repro_seed{program.seed}.py"
    path.write_text(reproducer_source(program, finding, device))
    return path
