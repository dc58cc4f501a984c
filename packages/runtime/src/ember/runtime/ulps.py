"""How far the C++ prelude's float math is from double-precision libm, in ulps.

The prelude (ember.codegen.cpp.prelude) computes float `exp`, `log`, `erf`, `tanh` and
`sigmoid` with its own vectorisable code. This module measures them the way kernels
run them: a small C++ harness, the prelude plus a sweep per function, compiled by the
same compiler with the same flags as generated kernels (ember.runtime.cpp_kernels),
evaluates each function in an `omp simd` loop (the vectorised code, as in a kernel)
and compares every result with the double-precision libm result of the same input.

    python -m ember.runtime.ulps [--stride 1] [--functions exp,erf] [--libm] [--json F]

`--stride 1` is every one of the 2^32 float32 bit patterns (NaNs, infinities, zeros
and subnormals included; 7 to 30 seconds per function on two cores); a larger stride
takes every n-th. `--libm` measures the scalar libm path instead
(`EMBER_LIBM_MATH`), a check of the measure itself.

The error of a result `got` against the reference `want` (a double) is
|got - want| / ulp(want), where ulp(want) is the spacing of float32 values at want:
2^(e - 23) for |want| in [2^e, 2^(e+1)), 2^-149 below 2^-126 (subnormals). It is 0
when got is the float nearest to want (infinities and zeros too, a zero's sign
included) or both are NaN, and infinite when one is NaN and not the other, when got
is infinite and the nearest float to want is not, or when got is a zero of the
wrong sign.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ember.codegen.cpp import PRELUDE, CppSource
from ember.runtime.cpp_kernels import CompiledUnit, compile_cpp_source

# name -> (the prelude's float function of v, the double-precision reference of v)
FUNCTIONS: dict[str, tuple[str, str]] = {
    "exp": ("ember::exp(v)", "std::exp(v)"),
    "log": ("ember::log(v)", "std::log(v)"),
    "erf": ("ember::erf(v)", "std::erf(v)"),
    "tanh": ("ember::tanh(v)", "std::tanh(v)"),
    "sigmoid": ("ember::sigmoid(v)", "1.0 / (1.0 + std::exp(-v))"),
}
ALL_FLOATS = 1 << 32

_HARNESS = r"""
namespace ember_sweep {

inline double ulps(float got, double want) {
  if (std::isnan(got) || std::isnan(want)) {
    return std::isnan(got) && std::isnan(want) ? 0.0 : INFINITY;
  }
  const float nearest = float(want);
  if (got == nearest) {
    return (got == 0.0f && std::signbit(got) != std::signbit(want)) ? INFINITY : 0.0;
  }
  if (std::isinf(got)) return INFINITY;
  int exponent;
  std::frexp(std::fabs(want), &exponent);  // |want| = m 2^exponent, m in [0.5, 1)
  const double ulp = std::ldexp(1.0, std::min(std::max(exponent - 24, -149), 104));
  return std::fabs(double(got) - want) / ulp;
}

struct Worst {
  double ulps = -1.0;
  float x = 0.0f, got = 0.0f;
  double want = 0.0;
};

constexpr int64_t kChunk = 4096;

// The inputs are values[begin, end) when values is given, else the floats whose bits
// are begin, begin + stride, ... below end. out: inputs, worst ulps, x, got, want.
template <class F, class R>
void sweep(F f, R reference, const float* values, uint64_t begin, uint64_t end,
           uint64_t stride, double* out) {
  const uint64_t count = values ? end - begin : (end - begin + stride - 1) / stride;
  const uint64_t chunks = (count + kChunk - 1) / kChunk;
  Worst all;
#pragma omp parallel
  {
    Worst mine;
    float x[kChunk], y[kChunk];
#pragma omp for schedule(dynamic, 16)
    for (uint64_t c = 0; c < chunks; ++c) {
      const int64_t n = int64_t(std::min<uint64_t>(kChunk, count - c * kChunk));
      for (int64_t i = 0; i < n; ++i) {
        const uint64_t k = c * kChunk + uint64_t(i);
        x[i] = values ? values[begin + k] : ember::bits_f32(uint32_t(begin + k * stride));
      }
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) y[i] = f(x[i]);
      for (int64_t i = 0; i < n; ++i) {
        const double want = reference(double(x[i]));
        const double error = ulps(y[i], want);
        if (error > mine.ulps) mine = Worst{error, x[i], y[i], want};
      }
    }
#pragma omp critical(ember_ulps)
    if (mine.ulps > all.ulps) all = mine;
  }
  out[0] = double(count);
  out[1] = all.ulps;
  out[2] = all.x;
  out[3] = all.got;
  out[4] = all.want;
}

}  // namespace ember_sweep

extern "C" void ember_ulps(int function, const float* values, uint64_t begin, uint64_t end,
                           uint64_t stride, double* out) {
  switch (function) {
"""


def harness_source(*, libm: bool = False) -> str:
    """The C++ of the sweeps: the prelude (as libm calls with `libm`) and `ember_ulps`."""
    cases = [
        f"    case {number}: ember_sweep::sweep([](float v) {{ return {ours}; }}, "
        f"[](double v) {{ return {reference}; }}, values, begin, end, stride, out); return;"
        for number, (ours, reference) in enumerate(FUNCTIONS.values())
    ]
    define = "#define EMBER_LIBM_MATH\n" if libm else ""
    return define + PRELUDE + _HARNESS + "\n".join(cases) + "\n  }\n  out[0] = -1;\n}\n"


@dataclass(frozen=True)
class UlpError:
    """The largest error of one function over a set of inputs, and where it occurs."""

    function: str
    inputs: int
    ulps: float
    x: float
    got: float
    want: float

    def describe(self) -> str:
        return (
            f"{self.function}: {self.ulps:.3f} ulps over {self.inputs} inputs, at "
            f"x={self.x!r} ({_bits(self.x):#010x}): got {self.got!r}, want {self.want!r}"
        )


def _bits(x: float) -> int:
    return int(torch.tensor([x], dtype=torch.float32).view(torch.int32).item()) & 0xFFFFFFFF


class UlpSweeps:
    """The compiled harness (cached like kernels under `cache_dir`)."""

    def __init__(self, cache_dir: Path, *, libm: bool = False) -> None:
        self.libm = libm
        self.unit: CompiledUnit = compile_cpp_source(
            CppSource(harness_source(libm=libm), ()), cache_dir=cache_dir
        )
        self.function = self.unit.library.ember_ulps
        self.function.restype = None
        self.function.argtypes = [
            ctypes.c_int,
            ctypes.c_void_p,
            ctypes.c_uint64,
            ctypes.c_uint64,
            ctypes.c_uint64,
            ctypes.c_void_p,
        ]

    def _run(
        self, function: str, values: int | None, begin: int, end: int, stride: int
    ) -> UlpError:
        if function not in FUNCTIONS:
            raise ValueError(f"unknown function {function!r}: one of {', '.join(FUNCTIONS)}")
        out = (ctypes.c_double * 5)()
        self.unit.sync_threads()
        self.function(list(FUNCTIONS).index(function), values, begin, end, stride, out)
        return UlpError(function, int(out[0]), out[1], out[2], out[3], out[4])

    def bits(
        self, function: str, begin: int = 0, end: int = ALL_FLOATS, stride: int = 1
    ) -> UlpError:
        """The worst error over the floats with bit patterns begin, begin + stride, ...
        below end (as unsigned 32-bit integers)."""
        if not 0 <= begin < end <= ALL_FLOATS or stride < 1:
            raise ValueError(f"bad range [{begin:#x}, {end:#x}) or stride {stride}")
        return self._run(function, None, begin, end, stride)

    def values(self, function: str, x: torch.Tensor) -> UlpError:
        """The worst error over the elements of the float32 tensor `x`."""
        flat = x.detach().to(device="cpu", dtype=torch.float32).contiguous().reshape(-1)
        if flat.numel() == 0:
            raise ValueError("no inputs")
        return self._run(function, flat.data_ptr(), 0, flat.numel(), 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ember.runtime.ulps",
        description="ulp errors of ember's C++ float math against double-precision libm",
    )
    parser.add_argument("--stride", type=int, default=1, help="every n-th float (1: all 2^32)")
    parser.add_argument("--functions", default=",".join(FUNCTIONS), help="comma-separated")
    parser.add_argument("--libm", action="store_true", help="measure the libm path instead")
    parser.add_argument("--json", type=Path, help="also write the results here")
    options = parser.parse_args(argv)
    path = "libm (EMBER_LIBM_MATH)" if options.libm else "the prelude's vectorisable code"
    print(f"float32 math of {path} against double-precision libm, stride {options.stride}")
    with tempfile.TemporaryDirectory(prefix="ember-ulps-") as cache:
        sweeps = UlpSweeps(Path(cache), libm=options.libm)
        results = []
        for name in options.functions.split(","):
            start = time.perf_counter()
            result = sweeps.bits(name, stride=options.stride)
            print(f"{result.describe()} [{time.perf_counter() - start:.1f} s]", flush=True)
            results.append(result)
    if options.json:
        options.json.write_text(json.dumps([asdict(r) for r in results], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
