"""The C++ prelude's float math in a hot loop: ns per element, one thread, in cache.

    uv run python benchmarks/cpu_math.py [--rounds 15] [--against REV] [--libm]

Each function runs as a kernel runs it, `y[i] = f(x[i])` in an `omp simd` loop, over
4096 floats (in L1/L2) that cover both branches of erf and tanh, compiled with the
kernels' compiler and flags (ember.runtime.cpp_kernels). `--against REV` also builds
the prelude of git revision REV and `--libm` the prelude with `EMBER_LIBM_MATH` (libm
calls); the builds alternate round by round and each keeps its fastest round, so that
a neighbour's load on the shared machine hits them alike. GELU, GELU (tanh) and SiLU
are the expressions ember's kernels compute for them: `ember::gelu` for GELU (the
erf formula in a prelude of a revision before it), "GELU (erf)" the formula
`x/2 (1 + erf(x / sqrt 2))` as kernels computed it before.
"""

from __future__ import annotations

import argparse
import ctypes
import subprocess
import tempfile
from pathlib import Path

from ember.codegen.cpp import PRELUDE, CppSource
from ember.runtime.cpp_kernels import compile_cpp_source

FUNCTIONS = {
    "exp": "ember::exp(v)",
    "log": "ember::log(std::fabs(v) + 0.01f)",
    "erf": "ember::erf(v)",
    "tanh": "ember::tanh(v)",
    "sigmoid": "ember::sigmoid(v)",
    "gelu": "ember::gelu(v)",
    "gelu (erf)": "v * 0.5f * (1.0f + ember::erf(v * 0.7071067811865476f))",
    "gelu tanh": "v * 0.5f * (1.0f + ember::tanh(0.7978845608f * (v + 0.044715f * v * v * v)))",
    "silu": "v * ember::sigmoid(v)",
}

HARNESS = r"""
#include <chrono>
constexpr int64_t kN = 4096;
static float ember_x[kN], ember_y[kN];
template <class F> double ember_time(F f, int64_t repeats) {
  for (int64_t i = 0; i < kN; ++i) {  // -6 .. 6
    ember_x[i] = float((i * 7919) % 2000) / 166.0f - 6.0f;
  }
  const auto start = std::chrono::steady_clock::now();
  for (int64_t r = 0; r < repeats; ++r) {
#pragma omp simd
    for (int64_t i = 0; i < kN; ++i) ember_y[i] = f(ember_x[i]);
    asm volatile("" : : "r"(ember_y) : "memory");
  }
  const auto seconds = std::chrono::steady_clock::now() - start;
  return std::chrono::duration<double, std::nano>(seconds).count() / double(repeats * kN);
}
extern "C" double ember_ns_per_element(int function, int64_t repeats) {
  switch (function) {
"""


def source(prelude: str, *, libm: bool = False) -> str:
    expressions = list(FUNCTIONS.values())
    if "inline float gelu(" not in prelude:  # an older revision's
        expressions = [
            FUNCTIONS["gelu (erf)"] if e == FUNCTIONS["gelu"] else e for e in expressions
        ]
    cases = [
        f"    case {number}: return ember_time([](float v) {{ return {expression}; }}, repeats);"
        for number, expression in enumerate(expressions)
    ]
    define = "#define EMBER_LIBM_MATH\n" if libm else ""
    return define + prelude + HARNESS + "\n".join(cases) + "\n  }\n  return -1.0;\n}\n"


def prelude_at(revision: str) -> str:
    """PRELUDE as git revision `revision` has it."""
    path = "packages/codegen-cpp/src/ember/codegen/cpp/prelude.py"
    text = subprocess.run(
        ["git", "show", f"{revision}:{path}"], capture_output=True, text=True, check=True
    ).stdout
    scope: dict[str, object] = {}
    exec(compile(text, path, "exec"), scope)
    found = scope["PRELUDE"]
    assert isinstance(found, str)
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--repeats", type=int, default=500, help="loops over x per round")
    parser.add_argument("--against", help="also the prelude of this git revision")
    parser.add_argument("--libm", action="store_true", help="also EMBER_LIBM_MATH (libm)")
    options = parser.parse_args()
    builds = {"this tree": source(PRELUDE)}
    if options.against:
        builds[options.against] = source(prelude_at(options.against))
    if options.libm:
        builds["libm"] = source(PRELUDE, libm=True)
    with tempfile.TemporaryDirectory(prefix="cpu-math-") as cache:
        libraries = {}
        for name, text in builds.items():
            unit = compile_cpp_source(CppSource(text, ()), cache_dir=Path(cache))
            function = unit.library.ember_ns_per_element
            function.restype = ctypes.c_double
            function.argtypes = [ctypes.c_int, ctypes.c_int64]
            unit.library.ember_set_num_threads(1)
            libraries[name] = function
        best = {(b, f): float("inf") for b in builds for f in FUNCTIONS}
        for _ in range(options.rounds):
            for number, function in enumerate(FUNCTIONS):
                for build, run in libraries.items():
                    repeats = options.repeats // 20 if build == "libm" else options.repeats
                    best[build, function] = min(best[build, function], run(number, repeats))
    print("ns per element, one thread, 4096 floats in cache (fastest of the rounds)")
    print(f"{'function':<10}" + "".join(f" {b:>12}" for b in builds))
    for function in FUNCTIONS:
        print(f"{function:<10}" + "".join(f" {best[b, function]:>12.3f}" for b in builds))


if __name__ == "__main__":
    main()
