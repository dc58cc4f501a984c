"""Reduction kinds (ember.ir.loops.REDUCTION_KINDS) as C++ accumulator rules.

A reduction keeps a small state per accumulator (one per vector lane, later one per
thread): `fields` are its C++ variables with their initial values, `update` folds in one
value `{x}` at linear reduction index `{r}` (`uniform_update` likewise where all lanes
have seen the same count, given as the reciprocal `{w}`), `combine` merges state `b`
into state `a` (lanes into one result, threads' partials into the total, in a fixed
order so a run is repeatable), and `results` says which fields the member's values are
(welford: mean and M2). Semantics follow torch: max/min propagate NaN; argmax/argmin
give the first index of the extreme, NaN counting as the extreme; welford uses Welford's
update and Chan's combination.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ReductionRule:
    fields: tuple[tuple[str, str], ...]  # (C++ type, initial value); `{T}`: accumulator type
    update: str  # `{s0}`..: the state's fields, `{x}`: the value, `{r}`: its linear index
    combine: str  # `{a0}`.. <- `{b0}`..
    results: tuple[int, ...] = (0,)
    # the update where every lane's count is the same, `{w}` being 1 / the new count
    # (computed once per chunk: no division per element); "" when there is none
    uniform_update: str = ""


def extreme(lowest: bool, dtype: torch.dtype, ctype: str) -> str:
    """The lowest (or highest) value of `dtype` as `ctype`: -inf/inf for floats."""
    if dtype == torch.bool:
        return "false" if lowest else "true"
    if dtype.is_floating_point:
        return f"{'-' if lowest else ''}std::numeric_limits<{ctype}>::infinity()"
    return f"std::numeric_limits<{ctype}>::{'lowest' if lowest else 'max'}()"


def _fold(expression: str, init: str) -> ReductionRule:
    return ReductionRule(
        fields=(("{T}", init),),
        update="{s0} = " + expression.format(a="{s0}", b="{x}") + ";",
        combine="{a0} = " + expression.format(a="{a0}", b="{b0}") + ";",
    )


def _arg(direction: str) -> ReductionRule:
    return ReductionRule(
        fields=(("{T}", "0"), ("int64_t", "-1")),
        update=(
            f"{{{{ const bool take = ember::arg_take_{direction}({{x}}, {{s0}}, {{s1}}); "
            "{s0} = take ? {x} : {s0}; {s1} = take ? {r} : {s1}; }}"
        ),
        combine=(
            f"if (ember::arg_better_{direction}({{b0}}, {{b1}}, {{a0}}, {{a1}})) "
            "{{ {a0} = {b0}; {a1} = {b1}; }}"
        ),
        results=(1,),
    )


def reduction_rule(kind: str, dtype: torch.dtype, ctype: str) -> ReductionRule | None:
    """The rule of reduction `kind` over values of `dtype` (computed as `ctype`); None
    for an unknown kind."""
    if kind == "sum":
        return _fold("{a} + {b}", "0")
    if kind == "prod":
        return _fold("{a} * {b}", "1")
    if kind == "max":
        return _fold("ember::maximum({a}, {b})", extreme(True, dtype, ctype))
    if kind == "min":
        return _fold("ember::minimum({a}, {b})", extreme(False, dtype, ctype))
    if kind == "any":
        return ReductionRule(
            fields=(("bool", "false"),),
            update="{s0} = {s0} | ({x} != 0);",
            combine="{a0} = {a0} | {b0};",
        )
    if kind == "all":
        return ReductionRule(
            fields=(("bool", "true"),),
            update="{s0} = {s0} & ({x} != 0);",
            combine="{a0} = {a0} & {b0};",
        )
    if kind == "argmax":
        return _arg("max")
    if kind == "argmin":
        return _arg("min")
    if kind == "welford":
        return ReductionRule(
            fields=(("{T}", "0"), ("{T}", "0"), ("{T}", "0")),
            update=(
                "{{ {s2} = {s2} + 1; const {T} delta = {x} - {s0}; {s0} = {s0} + delta / {s2}; "
                "{s1} = {s1} + delta * ({x} - {s0}); }}"
            ),
            combine="ember::welford_combine({a0}, {a1}, {a2}, {b0}, {b1}, {b2});",
            results=(0, 1),
            uniform_update=(
                "{{ {s2} = {s2} + 1; const {T} delta = {x} - {s0}; "
                "{s0} = {s0} + delta * {T}({w}); {s1} = {s1} + delta * ({x} - {s0}); }}"
            ),
        )
    return None
