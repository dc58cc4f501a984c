"""Generate random valid programs for the fuzzer, deterministically from a seed.

The generator tracks each value's shape (dimension keys) and dtype, and picks only ops
that are valid for them: pointwise ops with broadcasting against fresh inputs whose
dimensions are 1 or shared, reductions over a random axis (with or without keepdim),
softmax-like ops, cumulative sums, views (permute, transpose, unsqueeze, squeeze,
select, strided slices, flatten), casts between dtypes, and small matrix products.
Sizes include 1 and odd sizes. A dynamic program also runs at a second set of sizes.

Discontinuous ops (comparisons feeding `where`, argmax) only read inputs, never values
computed in between: a compiler may legally round intermediates differently, and a
flipped comparison would be noise, not a bug.

`Hazards` adds what a user's program can also bring: inputs at storage offsets and
overlapping views, indexing ops (embedding, gather, index_select, advanced indexing,
index_put, scatter_add) whose index inputs may hold an index out of range, and integer
division and remainder whose divisors may be 0. Where eager raises on such a program,
ember must raise too (run.py). Their choices come from a random stream of their own,
so a program that draws none is the program its seed made before they existed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from ember.runtime.fuzz.program import FLOAT_DTYPES, Input, Program, Step

SIZES = (1, 2, 3, 5, 7, 8, 16, 17, 33)
INPUT_DTYPES = ("float32",) * 6 + ("bfloat16", "float16", "float64", "int64", "int32")
UNARY_FLOAT = (
    "-{0}",
    "{0}.abs()",
    "torch.exp({0}.clamp(max=8))",
    "torch.log({0}.abs() + 1)",
    "torch.sqrt({0}.abs())",
    "torch.sin({0})",
    "torch.cos({0})",
    "torch.tanh({0})",
    "torch.sigmoid({0})",
    "torch.relu({0})",
    "torch.nn.functional.gelu({0})",
    "torch.nn.functional.silu({0})",
    "1 / ({0}.abs() + 1)",
    "torch.rsqrt({0}.abs() + 1)",
    "{0} * {0}",
    "{0}.clamp(-0.5, 0.5)",
    "torch.erf({0})",
    "{0} * 3 - 0.5",
)
UNARY_INT = ("-{0}", "{0}.abs()", "{0} * 3", "{0} % 7", "{0} + 2")
BINARY = (
    "{0} + {1}",
    "{0} - {1}",
    "{0} * {1}",
    "torch.maximum({0}, {1})",
    "torch.minimum({0}, {1})",
)
BINARY_FLOAT = ("{0} / ({1}.abs() + 1)", "torch.where({0} > {1}, {0}, {1})")
REDUCTIONS = (
    "{0}.sum({d}, keepdim={k})",
    "{0}.mean({d}, keepdim={k})",
    "{0}.amax({d}, keepdim={k})",
    "{0}.amin({d}, keepdim={k})",
    "{0}.var({d}, keepdim={k}, correction=0)",
    "torch.logsumexp({0}, {d}, keepdim={k})",
    "torch.linalg.vector_norm({0}, dim={d}, keepdim={k})",
)
NORMALISING = ("torch.softmax({0}, {d})", "torch.log_softmax({0}, {d})", "torch.cumsum({0}, {d})")


INT_DIVISION = (
    "{0} // {1}",
    "torch.remainder({0}, {1})",
    "torch.fmod({0}, {1})",
    "torch.div({0}, {1}, rounding_mode='trunc')",
    "torch.div({0}, {1}, rounding_mode='floor')",
)
BAD_INDICES = ("n", "-n - 1", "n + 7", "2**40", "-1")  # -1: bad where negatives do not wrap


@dataclass(frozen=True)
class Hazards:
    """What a program may hold besides valid arithmetic on fresh inputs (see the module
    docstring). On a GPU, eager's own out-of-range index is a device-side assert that
    ends the process's CUDA context, and integer division by zero does not raise:
    `CUDA_HAZARDS` leaves both out."""

    views: bool = True
    indexing: bool = True
    bad_indices: bool = True
    zero_division: bool = True


CPU_HAZARDS = Hazards()
CUDA_HAZARDS = Hazards(bad_indices=False, zero_division=False)
NO_HAZARDS = Hazards(views=False, indexing=False, bad_indices=False, zero_division=False)


def hazards_for(device: str) -> Hazards:
    return CUDA_HAZARDS if device.startswith("cuda") else CPU_HAZARDS


@dataclass(frozen=True)
class Value:
    name: str
    shape: tuple[str, ...]
    dtype: str
    is_input: bool


class ProgramGenerator:
    """Builds one program; `generate(seed)` is the entry point."""

    def __init__(self, seed: int, max_steps: int = 10, hazards: Hazards = NO_HAZARDS) -> None:
        self.rng = random.Random(seed)
        self.hazard_rng = random.Random(seed * 7919 + 17)
        self.hazards = hazards
        self.seed = seed
        self.max_steps = max_steps
        self.dims = {f"d{i}": self.rng.choice(SIZES) for i in range(4)}
        self.values: list[Value] = []
        self.inputs: list[Input] = []
        self.steps: list[Step] = []

    # -- helpers ------------------------------------------------------------------

    def new_input(self, shape: tuple[str, ...], dtype: str) -> Value:
        value = Value(f"x{len(self.inputs)}", shape, dtype, True)
        self.inputs.append(Input(value.name, shape, dtype))
        self.values.append(value)
        return value

    def emit(
        self, template: str, args: tuple[Value, ...], shape: tuple[str, ...], dtype: str
    ) -> Value:
        value = Value(f"v{len(self.steps)}", shape, dtype, False)
        self.steps.append(Step(value.name, template, tuple(a.name for a in args)))
        self.values.append(value)
        return value

    def random_shape(self) -> tuple[str, ...]:
        rank = self.rng.choice((1, 2, 2, 3, 3, 4))
        return tuple(self.rng.choice((*self.dims, "1")) for _ in range(rank))

    def broadcastable_shape(
        self, shape: tuple[str, ...], rng: random.Random | None = None
    ) -> tuple[str, ...]:
        """A shape that broadcasts with `shape`: some dims become 1, leading ones may go."""
        r = rng or self.rng
        drop = r.randint(0, max(0, len(shape) - 1)) if r.random() < 0.3 else 0
        return tuple("1" if r.random() < 0.3 else k for k in shape[drop:])

    # -- ops ----------------------------------------------------------------------

    def step(self) -> None:
        h = self.hazards
        if h.indexing and self.hazard_rng.random() < 0.08:
            self.index_op()
            return
        if h.zero_division or h.indexing:  # integer division (divisors kept nonzero or not)
            ints = [v for v in self.values[-4:] if v.dtype in ("int32", "int64")]
            if ints and self.hazard_rng.random() < 0.1:
                self.int_division(self.hazard_rng.choice(ints))
                return
        pick = self.rng.random()  # mostly chain on the newest value: longer live programs
        x = (
            self.values[-1]
            if pick < 0.5
            else self.rng.choice(self.values[-4:] if pick < 0.85 else self.values)
        )
        is_float = x.dtype in FLOAT_DTYPES
        rank = len(x.shape)
        roll = self.rng.random()
        if roll < 0.25:
            unary = UNARY_FLOAT if is_float else UNARY_INT
            self.emit(self.rng.choice(unary), (x,), x.shape, x.dtype)
        elif roll < 0.5:
            self.binary(x)
        elif roll < 0.65 and rank >= 1 and is_float:
            d = self.rng.randrange(rank) - (rank if self.rng.random() < 0.3 else 0)
            keep = self.rng.random() < 0.4
            template = self.rng.choice(REDUCTIONS).replace("{d}", str(d)).replace("{k}", str(keep))
            shape = list(x.shape)
            shape[d] = "1"
            if not keep:
                del shape[d]
            self.emit(template, (x,), tuple(shape), x.dtype)
        elif roll < 0.72 and rank >= 1 and is_float:
            d = self.rng.randrange(rank)
            self.emit(self.rng.choice(NORMALISING).replace("{d}", str(d)), (x,), x.shape, x.dtype)
        elif roll < 0.88 and rank >= 1:
            self.view(x)
        elif roll < 0.94:
            self.cast(x)
        elif roll < 0.97 and rank >= 1 and is_float:
            w = self.new_input((x.shape[-1], self.rng.choice(list(self.dims))), x.dtype)
            self.emit("{0} @ {1}", (x, w), (*x.shape[:-1], w.shape[-1]), x.dtype)
        else:
            self.input_only_op()

    def binary(self, x: Value) -> None:
        if self.rng.random() < 0.5:
            others = [v for v in self.values if v.shape == x.shape and v is not x]
            y = self.rng.choice(others) if others else None
        else:
            y = None
        if y is None:
            dtype = x.dtype if self.rng.random() < 0.7 else self.rng.choice(INPUT_DTYPES)
            y = self.new_input(self.broadcastable_shape(x.shape), dtype)
        a, b = (x, y) if self.rng.random() < 0.7 else (y, x)
        both_float = a.dtype in FLOAT_DTYPES and b.dtype in FLOAT_DTYPES
        template = self.rng.choice(BINARY + (BINARY_FLOAT if both_float else ()))
        rank = max(len(a.shape), len(b.shape))
        pa = ("1",) * (rank - len(a.shape)) + a.shape
        pb = ("1",) * (rank - len(b.shape)) + b.shape
        shape = tuple(q if p == "1" else p for p, q in zip(pa, pb, strict=True))
        self.emit(template, (a, b), shape, promote(a.dtype, b.dtype))

    def view(self, x: Value) -> None:
        rank = len(x.shape)
        kind = self.rng.choice(
            ("permute", "transpose", "unsqueeze", "squeeze", "select", "slice", "flatten")
        )
        if kind == "permute" and rank >= 2:
            perm = list(range(rank))
            self.rng.shuffle(perm)
            self.emit(f"{{0}}.permute({perm})", (x,), tuple(x.shape[p] for p in perm), x.dtype)
        elif kind == "transpose" and rank >= 2:
            i, j = self.rng.sample(range(rank), 2)
            shape = list(x.shape)
            shape[i], shape[j] = shape[j], shape[i]
            self.emit(f"{{0}}.transpose({i}, {j})", (x,), tuple(shape), x.dtype)
        elif kind == "squeeze" and "1" in x.shape:
            d = x.shape.index("1")
            self.emit(f"{{0}}.squeeze({d})", (x,), x.shape[:d] + x.shape[d + 1 :], x.dtype)
        elif kind == "select":
            d = self.rng.randrange(rank)
            self.emit(f"{{0}}.select({d}, 0)", (x,), x.shape[:d] + x.shape[d + 1 :], x.dtype)
        elif kind == "slice":
            d = self.rng.randrange(rank)
            index = ", ".join([":"] * d + ["::2"])
            shape = list(x.shape)
            shape[d] = "1" if x.shape[d] == "1" else f"(({x.shape[d]}) + 1) // 2"
            self.emit(f"{{0}}[{index}]", (x,), tuple(shape), x.dtype)
        elif kind == "flatten" and rank >= 2:
            merged = "*".join(f"({k})" for k in x.shape[1:])
            self.emit("{0}.flatten(1)", (x,), (x.shape[0], merged), x.dtype)
        else:
            d = self.rng.randint(0, rank)
            self.emit(f"{{0}}.unsqueeze({d})", (x,), (*x.shape[:d], "1", *x.shape[d:]), x.dtype)

    def cast(self, x: Value) -> None:
        if x.dtype in FLOAT_DTYPES:
            target = self.rng.choice(FLOAT_DTYPES)
        else:
            target = self.rng.choice(("float32", "int64", "bfloat16"))
        self.emit(f"{{0}}.to(torch.{target})", (x,), x.shape, target)

    def input_only_op(self) -> None:
        """Discontinuous ops, on fresh inputs only (see the module docstring)."""
        shape = self.random_shape()
        cond, a = self.new_input(shape, "float32"), self.new_input(shape, "float32")
        if self.rng.random() < 0.5 and len(shape) >= 1:
            d = self.rng.randrange(len(shape))
            self.emit(f"{{0}}.argmax({d})", (cond,), shape[:d] + shape[d + 1 :], "int64")
        else:
            self.emit("torch.where({0} > 0, {1}, {0})", (cond, a), shape, "float32")

    def new_index(self, shape: tuple[str, ...], bound: str, *, wraps: bool = False) -> Value:
        """A fresh index input into a dimension of key `bound` (see `Input.wraps`)."""
        r = self.hazard_rng
        bad = r.choice(BAD_INDICES) if self.hazards.bad_indices and r.random() < 0.3 else None
        value = Value(f"x{len(self.inputs)}", shape, "int64", True)
        self.inputs.append(
            Input(value.name, shape, "int64", index_of=bound, wraps=wraps, bad_index=bad)
        )
        self.values.append(value)
        return value

    def index_op(self) -> None:
        """One indexing op over a recent value (or a fresh table), by a fresh index."""
        r = self.hazard_rng
        x = r.choice(self.values[-4:])
        rank = len(x.shape)
        kind = r.choice(("gather", "index_select", "index", "index_put", "scatter_add"))
        if rank == 0 or r.random() < 0.25:
            keys = list(self.dims)
            table = self.new_input((r.choice(keys), r.choice(keys)), r.choice(FLOAT_DTYPES))
            ids = self.new_index(
                tuple(r.choice(keys) for _ in range(r.randint(1, 2))), table.shape[0]
            )
            template = "torch.nn.functional.embedding({0}, {1})"
            self.emit(template, (ids, table), (*ids.shape, table.shape[1]), table.dtype)
        elif kind == "gather":
            d = r.randrange(rank)
            ids = self.new_index(x.shape, x.shape[d])
            self.emit(f"torch.gather({{0}}, {d}, {{1}})", (x, ids), x.shape, x.dtype)
        elif kind == "index_select":
            d = r.randrange(rank)
            ids = self.new_index((r.choice(list(self.dims)),), x.shape[d])
            shape = (*x.shape[:d], ids.shape[0], *x.shape[d + 1 :])
            self.emit(f"{{0}}.index_select({d}, {{1}})", (x, ids), shape, x.dtype)
        elif kind == "index":
            shape = tuple(r.choice(list(self.dims)) for _ in range(r.randint(1, 2)))
            ids = self.new_index(shape, x.shape[0], wraps=True)
            self.emit("{0}[{1}]", (x, ids), (*ids.shape, *x.shape[1:]), x.dtype)
        elif kind == "index_put":
            ids = self.new_index((r.choice(list(self.dims)),), x.shape[0], wraps=True)
            v = self.new_input((ids.shape[0], *x.shape[1:]), x.dtype)
            template = "{0}.index_put(({1},), {2}, accumulate=True)"
            self.emit(template, (x, ids, v), x.shape, x.dtype)
        else:
            d = r.randrange(rank)
            ids = self.new_index(x.shape, x.shape[d])
            src = self.new_input(x.shape, x.dtype)
            self.emit(f"{{0}}.scatter_add({d}, {{1}}, {{2}})", (x, ids, src), x.shape, x.dtype)

    def int_division(self, x: Value) -> None:
        """An integer division or remainder by a fresh integer input: its values are
        small and may be 0, unless zero divisors are off (then 1 to 6 in magnitude)."""
        r = self.hazard_rng
        divisor = self.new_input(self.broadcastable_shape(x.shape, r), r.choice(("int32", "int64")))
        template = r.choice(INT_DIVISION)
        if not self.hazards.zero_division or r.random() < 0.5:
            template = template.replace("{1}", "({1}.abs() + 1)")
        rank = max(len(x.shape), len(divisor.shape))
        pa = ("1",) * (rank - len(x.shape)) + x.shape
        pb = ("1",) * (rank - len(divisor.shape)) + divisor.shape
        shape = tuple(q if p == "1" else p for p, q in zip(pa, pb, strict=True))
        self.emit(template, (x, divisor), shape, promote(x.dtype, divisor.dtype))

    def place_inputs(self, inputs: tuple[Input, ...]) -> tuple[Input, ...]:
        """Some inputs at storage offsets, some overlapping an earlier input of the same
        dtype (never an index input: its values must stay indices)."""
        r = self.hazard_rng
        placed: list[Input] = []
        for inp in inputs:
            roll = r.random()
            earlier = [p for p in placed if p.dtype == inp.dtype and p.index_of is None]
            if roll < 0.15 and earlier and inp.index_of is None:
                inp = replace(inp, shares=r.choice(earlier).name, offset=r.randint(0, 12))
            elif roll < 0.45:
                inp = replace(inp, offset=r.randint(1, 40))
            placed.append(inp)
        return tuple(placed)

    def generate(self) -> Program:
        first = self.new_input(self.random_shape(), self.rng.choice(INPUT_DTYPES))
        del first
        for _ in range(self.rng.randint(1, self.max_steps)):
            self.step()
        computed = [v.name for v in self.values if not v.is_input]
        extra = self.rng.sample(computed[:-1], min(len(computed) - 1, self.rng.randint(0, 2)))
        outputs = (*tuple(sorted(set(extra), key=computed.index)), computed[-1])
        sizes = tuple(sorted(self.dims.items()))
        dynamic: tuple[tuple[str, int], ...] = ()
        if self.rng.random() < 0.3:
            dynamic = tuple((k, v if v == 1 else self.rng.choice(SIZES[1:])) for k, v in sizes)
        program = Program(tuple(self.inputs), tuple(self.steps), outputs, sizes, dynamic, self.seed)
        program = program.live()
        if self.hazards.views:
            program = replace(program, inputs=self.place_inputs(program.inputs))
        return program


_ORDER = ("bool", "int32", "int64", "float16", "bfloat16", "float32", "float64")


def promote(a: str, b: str) -> str:
    """torch's type promotion for the dtypes the generator uses (tensor-tensor)."""
    if {a, b} == {"float16", "bfloat16"}:
        return "float32"
    return max(a, b, key=_ORDER.index)


def generate(seed: int, max_steps: int = 10, hazards: Hazards = CPU_HAZARDS) -> Program:
    """The random program for `seed` (the same program for the same seed and hazards,
    always)."""
    return ProgramGenerator(seed, max_steps, hazards).generate()
