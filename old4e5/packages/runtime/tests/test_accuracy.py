"""The accuracy rule (ember.runtime.accuracy): tolerances, special values, float64 rescue."""

from __future__ import annotations

import math

import torch

from ember.runtime.accuracy import compare, compare_outputs, largest_error, tolerance


def test_within_tolerance_passes_and_beyond_fails_with_the_worst_index() -> None:
    e = torch.ones(3, 4)
    assert compare(e + 1e-6, e).ok
    a = e.clone()
    a[2, 1] += 1e-2
    verdict = compare(a, e)
    assert not verdict.ok and verdict.where == (2, 1)
    assert math.isclose(verdict.max_abs_err, 1e-2, rel_tol=1e-3)


def test_metadata_and_exactness_for_integers() -> None:
    assert not compare(torch.ones(3), torch.ones(3, dtype=torch.float64)).ok
    assert "sizes" in compare(torch.ones(3), torch.ones(1, 3)).reason
    assert not compare(torch.tensor([1, 2]), torch.tensor([1, 3])).ok
    assert tolerance(torch.int64) == (0.0, 0.0)


def test_nans_and_infinities_must_sit_where_eagers_do() -> None:
    nan, inf = float("nan"), float("inf")
    assert compare(torch.tensor(nan), torch.tensor(nan)).ok
    assert compare(torch.tensor([1.0, nan, inf]), torch.tensor([1.0, nan, inf])).ok
    assert not compare(torch.tensor([1.0, 2.0]), torch.tensor([1.0, nan])).ok
    assert not compare(torch.tensor([-inf]), torch.tensor([inf])).ok


def test_a_float64_reference_rescues_a_result_closer_to_the_truth() -> None:
    truth = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64) / 3
    eager = (truth + 0.05).bfloat16()  # eager itself is off
    compiled = (truth + 0.02).bfloat16()  # closer to the truth, far from eager
    assert not compare(compiled, eager).ok
    assert compare(compiled, eager, reference=truth).ok
    far = (truth - 0.5).bfloat16()
    verdict = compare(far, eager, reference=truth)
    assert not verdict.ok and verdict.used_reference and "float64" in verdict.reason


def test_nested_outputs_name_the_failing_leaf() -> None:
    expected = {"a": torch.zeros(2), "b": (torch.ones(2), 3)}
    actual = {"a": torch.zeros(2), "b": (torch.ones(2) * 2, 3)}
    found = compare_outputs(actual, expected)
    assert found is not None and found[1] == "['b'][0]"
    assert compare_outputs(expected, expected) is None
    assert largest_error(actual, expected) == 1.0
