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
"""

from __future__ import annotations

import random
from dataclasses import dataclass

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


@dataclass(frozen=True)
class Value:
    name: str
    shape: tuple[str, ...]
    dtype: str
    is_input: bool


class ProgramGenerator:
    """Builds one program; `generate(seed)` is the entry point."""

    def __init__(self, seed: int, max_steps: int = 10) -> None:
        self.rng = random.Random(seed)
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

    def broadcastable_shape(self, shape: tuple[str, ...]) -> tuple[str, ...]:
        """A shape that broadcasts with `shape`: some dims become 1, leading ones may go."""
        drop = self.rng.randint(0, max(0, len(shape) - 1)) if self.rng.random() < 0.3 else 0
        return tuple("1" if self.rng.random() < 0.3 else k for k in shape[drop:])

    # -- ops ----------------------------------------------------------------------

    def step(self) -> None:
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
        return program.live()


_ORDER = ("bool", "int32", "int64", "float16", "bfloat16", "float32", "float64")


def promote(a: str, b: str) -> str:
    """torch's type promotion for the dtypes the generator uses (tensor-tensor)."""
    if {a, b} == {"float16", "bfloat16"}:
        return "float32"
    return max(a, b, key=_ORDER.index)


def generate(seed: int, max_steps: int = 10) -> Program:
    """The random program for `seed` (the same program for the same seed, always)."""
    return ProgramGenerator(seed, max_steps).generate()
