"""The prelude's float exp, log, erf, tanh and sigmoid against double-precision libm, in
float32 ulps, through the kernels' compiler and flags (ember.runtime.ulps): at most 2
ulps for each, NaN, infinities, signed zeros, overflow and underflow exactly as libm.

The inputs: every 61st float32 bit pattern (70 million, all exponents and signs, NaNs
and subnormals among them), every float within 2^14 bit patterns of each function's
thresholds and branch points, and a list of special values. Over all 2^32 floats
(`python -m ember.runtime.ulps --stride 1`, g++ 12.2, AVX-512, 2026-11-24) the largest
errors are exp 1.035 ulps, log 0.827, erf 1.587, tanh 1.332, sigmoid 1.480."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import pytest
import torch

from ember.runtime.ulps import ALL_FLOATS, FUNCTIONS, UlpSweeps, main

MAX_ULPS = 2.0
WINDOW = 1 << 14  # bit patterns on each side of a threshold
THRESHOLDS = {
    # overflow, largest finite result, last normal result, last subnormal one, underflow
    "exp": [88.72283935546875, 88.7228317, 88.8, -87.336544, -103.27893, -103.97208, -104.0],
    # 1 (log 0), sqrt(1/2) and sqrt(2) (mantissa split), smallest normal, largest float
    "log": [1.0, 0.70710677, 1.4142135, 1.17549435e-38, 3.4028235e38, 1e-45],
    # branch point, clamp, where erf rounds to 1, Q's origin
    "erf": [0.96875, 4.0, 3.9192059, 2.484375, 1e-20],
    # branch point, clamp, where tanh rounds to 1
    "tanh": [0.625, 9.5, 9.0109129, 1e-20],
    # 0, where 1 / (1 + e) rounds to 1, the subnormal results, exp's clamp of -|x|
    "sigmoid": [0.0, 16.635532, 17.3286795, -87.336544, -103.27893, -103.97208, -104.0],
}
SPECIAL = [0.0, -0.0, math.inf, -math.inf, math.nan, -math.nan, 1e-45, -1e-45, 1e-40]
SPECIAL += [-1e-40, 1.17549435e-38, 3.4028235e38, -3.4028235e38, 1.0, -1.0, 0.5, 2.0, 1e30]
SPECIAL += [-1e30, 1000.0, -1000.0, 200.0, -200.0, 20.0, -20.0, 5.0, -5.0]
# (function, input, the exact libm result): signs of zeros count (a list: 0.0 == -0.0)
EXACT = [
    ("exp", math.nan, math.nan),
    ("exp", math.inf, math.inf),
    ("exp", -math.inf, 0.0),
    ("exp", 0.0, 1.0),
    ("exp", -0.0, 1.0),
    ("exp", 88.8, math.inf),
    ("exp", 1000.0, math.inf),
    ("exp", -104.0, 0.0),
    ("exp", -1000.0, 0.0),
    ("exp", -103.9, 2.0**-149),  # the smallest subnormal
    ("log", math.nan, math.nan),
    ("log", 0.0, -math.inf),
    ("log", -0.0, -math.inf),
    ("log", -1.0, math.nan),
    ("log", -1e-45, math.nan),
    ("log", -math.inf, math.nan),
    ("log", math.inf, math.inf),
    ("log", 1.0, 0.0),
    ("erf", math.nan, math.nan),
    ("erf", 0.0, 0.0),
    ("erf", -0.0, -0.0),
    ("erf", math.inf, 1.0),
    ("erf", -math.inf, -1.0),
    ("erf", 5.0, 1.0),
    ("erf", -1e30, -1.0),
    ("tanh", math.nan, math.nan),
    ("tanh", 0.0, 0.0),
    ("tanh", -0.0, -0.0),
    ("tanh", math.inf, 1.0),
    ("tanh", -math.inf, -1.0),
    ("tanh", 20.0, 1.0),
    ("tanh", -1e30, -1.0),
    ("tanh", 1e-40, 1e-40),
    ("tanh", -1e-40, -1e-40),
    ("sigmoid", math.nan, math.nan),
    ("sigmoid", 0.0, 0.5),
    ("sigmoid", -0.0, 0.5),
    ("sigmoid", math.inf, 1.0),
    ("sigmoid", -math.inf, 0.0),
    ("sigmoid", 20.0, 1.0),
    ("sigmoid", -200.0, 0.0),
]


def bits(x: float) -> int:
    return int(struct.unpack("<I", struct.pack("<f", x))[0])


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory: pytest.TempPathFactory) -> UlpSweeps:
    return UlpSweeps(tmp_path_factory.mktemp("ulps"))


@pytest.mark.parametrize("function", list(FUNCTIONS))
def test_within_two_ulps_of_libm(function: str, sweeps: UlpSweeps) -> None:
    results = [sweeps.bits(function, stride=61), sweeps.values(function, torch.tensor(SPECIAL))]
    for threshold in THRESHOLDS[function]:
        for signed in (threshold, -threshold):
            center = bits(signed)
            begin = max(center - WINDOW, 0)
            results.append(sweeps.bits(function, begin, min(center + WINDOW, ALL_FLOATS)))
    assert sum(r.inputs for r in results) > 70_000_000
    worst = max(results, key=lambda r: r.ulps)
    assert worst.ulps <= MAX_ULPS, worst.describe()
    assert worst.ulps > 0.5, worst.describe()  # none of them is correctly rounded


@pytest.mark.parametrize(("function", "x", "exact"), EXACT)
def test_special_values_are_libms(function: str, x: float, exact: float, sweeps: UlpSweeps) -> None:
    result = sweeps.values(function, torch.tensor([x]))
    assert result.ulps == 0.0, result.describe()
    want = struct.unpack("<f", struct.pack("<f", exact))[0]  # as float32
    got = result.got
    assert (math.isnan(got) and math.isnan(want)) or got == want, result.describe()
    assert math.copysign(1.0, got) == math.copysign(1.0, want) or math.isnan(want)


def test_the_measure_agrees_with_torch(sweeps: UlpSweeps) -> None:
    """The worst case the C++ sweep reports, measured again in Python: the float32
    result of the compiled function and the ulps from torch's float64 value."""
    result = sweeps.bits("erf", bits(0.5), bits(1.5))
    assert result.inputs == bits(1.5) - bits(0.5)
    want = torch.erf(torch.tensor(result.x, dtype=torch.float64)).item()
    assert want == pytest.approx(result.want, rel=1e-15)
    spacing = 2.0 ** (math.frexp(abs(want))[1] - 24)
    assert abs(result.got - want) / spacing == pytest.approx(result.ulps, rel=1e-9)
    assert result.got == sweeps.values("erf", torch.tensor([result.x])).got


def test_the_libm_path_is_libm(tmp_path: Path) -> None:
    """With EMBER_LIBM_MATH the functions are libm's float ones: glibc's expf and erff
    are within one ulp, and give other results than the vectorised code."""
    libm = UlpSweeps(tmp_path, libm=True)
    ours = UlpSweeps(tmp_path)
    for function in ("exp", "erf"):
        assert libm.bits(function, stride=4099).ulps < 1.0
        mine = ours.bits(function, bits(0.5), bits(1.5))
        theirs = libm.values(function, torch.tensor([mine.x]))
        assert theirs.got != mine.got  # the vectorised code's worst case is not libm's


def test_bad_arguments_are_refused(sweeps: UlpSweeps) -> None:
    with pytest.raises(ValueError, match="unknown function"):
        sweeps.bits("cos")
    with pytest.raises(ValueError, match="bad range"):
        sweeps.bits("exp", 10, 5)


def test_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ulps.json"
    assert main(["--stride", "65537", "--functions", "tanh,log", "--json", str(out)]) == 0
    results = json.loads(out.read_text())
    assert [r["function"] for r in results] == ["tanh", "log"]
    assert all(r["inputs"] == -(-ALL_FLOATS // 65537) for r in results)
    assert all(0.0 < r["ulps"] <= MAX_ULPS for r in results)
    assert "tanh: " in capsys.readouterr().out
