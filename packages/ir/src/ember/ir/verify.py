"""The verifier: invariants every Program must keep, checked after lowering."""

from __future__ import annotations

from ember.ir.errors import VerificationError
from ember.ir.nodes import BufferRef, ExternKernel, MultiOutput, iter_exprs, iter_refs
from ember.ir.program import Program


def verify(program: Program) -> None:
    """Check that names are unique, every read names a value defined before it, every
    size expression uses only symbols the program binds, and outputs exist."""
    defined: set[str] = set()
    symbols = set(program.size_symbols())

    def define(name: str) -> None:
        if name in defined:
            raise VerificationError(f"{program.name}: {name!r} is defined twice")
        defined.add(name)

    for node in program.inputs:
        define(node.name)
    for const in program.constants:
        define(const.name)
    for item in program.nodes:
        for read in item.reads():
            if read not in defined:
                raise VerificationError(
                    f"{program.name}: {item.name!r} reads {read!r}, which is not defined before it"
                )
        if isinstance(item, ExternKernel):
            for expr in iter_exprs((item.args, item.kwargs)):
                unbound = expr.free_symbols - symbols
                if unbound:
                    raise VerificationError(
                        f"{program.name}: {item.name!r} ({item.op}) uses unbound size symbols "
                        f"{sorted(map(str, unbound))}"
                    )
            if item.symbol is not None:
                symbols.add(item.symbol)
        elif isinstance(item, MultiOutput) and item.index < 0:
            raise VerificationError(f"{program.name}: {item.name!r} has a negative index")
        define(item.name)
    for ref in iter_refs(program.outputs):
        if ref.name not in defined:
            raise VerificationError(f"{program.name}: output {ref.name!r} is not defined")
    for out in program.outputs:
        if not isinstance(out, BufferRef):
            for expr in iter_exprs(out):
                if expr.free_symbols - symbols:
                    raise VerificationError(f"{program.name}: output {expr} has unbound symbols")
