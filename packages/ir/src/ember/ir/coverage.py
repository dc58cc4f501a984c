"""Coverage report: which ATen overloads ember.ir lowers to loops, which stay externs
on purpose, and which fall back to an extern call.

The universe is the overloads a graph can hand to lowering: every overload PyTorch
tags `core` plus every overload with a lowering or an intentional-extern entry, minus
those ember's decomposition table rewrites away (they never reach the IR) and the
`out=` variants (functional graphs have none).

    python -m ember.ir.coverage            # counts per category and per lowering file
    python -m ember.ir.coverage --list     # every overload, by category
"""

from __future__ import annotations

import argparse
import collections
from dataclasses import dataclass

import torch

from ember.graphpasses import ember_decompositions
from ember.ir.lowering import INTENTIONAL_EXTERNS, LOWERINGS

aten = torch.ops.aten


@dataclass(frozen=True)
class Coverage:
    lowered: dict[str, str]  # overload -> lowering module
    intentional: list[str]
    fallback: list[str]


def _core_overloads() -> set[torch._ops.OpOverload]:
    found: set[torch._ops.OpOverload] = set()
    for name in dir(aten):
        packet = getattr(aten, name, None)
        if not isinstance(packet, torch._ops.OpOverloadPacket):
            continue
        for overload_name in packet.overloads():  # type: ignore[no-untyped-call]  # untyped in torch
            overload = getattr(packet, overload_name)
            if torch.Tag.core in overload.tags:
                found.add(overload)
    return found


def _is_out_variant(op: torch._ops.OpOverload) -> bool:
    name = op._overloadname
    return (
        name == "out"
        or name.endswith("_out")
        or any(
            a.alias_info is not None and a.alias_info.is_write and a.kwarg_only
            for a in op._schema.arguments
        )
    )


def coverage() -> Coverage:
    decomposed = set(ember_decompositions())
    universe = _core_overloads() | set(LOWERINGS)
    for packet in INTENTIONAL_EXTERNS:
        universe |= {getattr(packet, o) for o in packet.overloads()}  # type: ignore[no-untyped-call]  # untyped in torch
    universe = {op for op in universe if not _is_out_variant(op)}
    lowered: dict[str, str] = {}
    intentional: list[str] = []
    fallback: list[str] = []
    for op in sorted(universe, key=str):
        if op in LOWERINGS:
            lowered[str(op)] = LOWERINGS[op].__module__.rsplit(".", 1)[-1]
        elif op in decomposed:
            continue
        elif op.overloadpacket in INTENTIONAL_EXTERNS:
            intentional.append(str(op))
        else:
            fallback.append(str(op))
    return Coverage(lowered, intentional, fallback)


def main() -> None:
    parser = argparse.ArgumentParser(description="ember.ir lowering coverage")
    parser.add_argument("--list", action="store_true", help="list every overload")
    ns = parser.parse_args()
    report = coverage()
    by_file = collections.Counter(report.lowered.values())
    print(f"lowered to loops:    {len(report.lowered)}")
    for module, count in sorted(by_file.items()):
        print(f"  {module:12} {count}")
    print(f"intentional externs: {len(report.intentional)} (and any op on a complex tensor)")
    print(f"fallback externs:    {len(report.fallback)}")
    if ns.list:
        for title, names in (
            ("lowered", sorted(report.lowered)),
            ("intentional", report.intentional),
            ("fallback", report.fallback),
        ):
            print(f"\n[{title}]")
            for name in names:
                print(f"  {name}")


if __name__ == "__main__":
    main()
