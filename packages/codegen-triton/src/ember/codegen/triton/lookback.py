"""One-pass scans of long rows with decoupled look-back (Merrill and Garland, "Single-pass
Parallel Prefix Scan with Decoupled Look-back", 2016): the `lookback_scan` plan.

Each program scans one tile of RBLOCK elements of a row. It publishes its tile's total
(the aggregate) at once, scans the tile, then looks back over the tiles before it in
the row for the running value that comes in: it combines their published values,
nearest first, until it meets a tile that published its inclusive prefix (the running
value through that tile), then publishes its own inclusive prefix. A tile waits only
on the aggregates of tiles it has not passed yet, so every tile's value is ready about
one look-back after the tiles were loaded, and the input is read once (the segmented
lowering, ember.ir.scan, reads it twice).

Forward progress: a program takes its tile from a ticket counter (an atomic add), not
from its program id, so the tiles before it belong to programs that started earlier
and never wait on it: no deadlock whatever order the GPU starts programs in.

The workspace is the launcher's (`TritonKernel.workspace`): one int64 word, the ticket
counter, then one word per program and scanned member. It is zeroed once, when
allocated, and never again: the counter keeps counting across launches, so the
launch a ticket belongs to is `ticket // programs` (launches on one stream run one
after the other, and every launch of a workspace has the same grid), and its low 29
bits tag every word published in that launch. Each launch rewrites every word, so a
word tagged otherwise is the previous launch's and counts as not yet published.

A published word packs (tag << 2 | status) in its high 32 bits (status 1: aggregate,
2: inclusive prefix; 0 in a fresh workspace: nothing) and the float32 value's bits in
its low 32, so one 64-bit access reads the status and the value together and no
ordering between two stores is needed. Readers use volatile loads (they read the L2
cache, where atomics and other programs' stores land) and look back over WINDOW tiles
at once: with 256 tiles of a 1M-element row, every tile's window reaches back past the
tiles that started with it.

The combines are commutative (sum, product, logaddexp): the window's values are
combined in any order. Floating-point sums so grouped differ from one program's
left-to-right sum only by rounding, as eager's CUB scan differs from both.
"""

from __future__ import annotations

from ember.codegen.triton.body import Scope
from ember.codegen.triton.plan import KernelPlan
from ember.codegen.triton.printer import IndexPrinter
from ember.codegen.triton.skeleton import define_variables

WORKSPACE = "workspace_ptr"  # the kernel's parameter: the launcher's workspace
WINDOW = 128  # tiles read per look-back step

# kind -> (combine helper, identity)
COMBINES = {
    "sum": ("ember_sum_combine", "0.0"),
    "prod": ("ember_prod_combine", "1.0"),
    "logsumexp": ("ember_logaddexp_combine", 'float("-inf")'),
}

HELPERS: dict[str, str] = {
    "ember_sum_combine": """
@triton.jit
def ember_sum_combine(a, b):
    return a + b
""",
    "ember_lookback_publish": """
@triton.jit
def ember_lookback_publish(words, tile, tag, value, status):
    # the word of `tile`: (tag << 2 | status) << 32 | the float32 value's bits
    bits = value.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF
    tl.atomic_xchg(words + tile, ((tag | status) << 32) | bits, sem="relaxed")
""",
}

# One look-back helper per kind, its combine written in (a jit function passed as an
# argument can be called but not handed on to tl.reduce).
_LOOKBACK_TEMPLATE = """
@triton.jit
def ember_lookback_{kind}(words, tile, segment, tag, identity, WINDOW: tl.constexpr):
    # The combined values of the `segment` tiles before `tile` in its row (tiles
    # tile - segment .. tile - 1), read back from `words` nearest first, WINDOW at a
    # time: each step takes every published word up to the first inclusive prefix,
    # stopping short of the first word not yet published (read again next step).
    # One reduction finds both: the least of 2k at an inclusive prefix (or past the
    # row's start) and 2k + 1 at a word not yet published.
    carry = identity
    look = tile - 1
    first = tile - segment
    k = tl.arange(0, WINDOW)
    searching = segment > 0
    while searching:
        at = look - k
        inside = at >= first
        word = tl.load(words + at, mask=inside, other=0, volatile=True)
        upper = word >> 32
        ready = ((upper & -4) == tag) & ((upper & 3) != 0)
        stop = (ready & ((upper & 3) == 2)) | ~inside
        key = tl.where(stop, 2 * k, tl.where(ready, 2 * WINDOW, 2 * k + 1))
        end = tl.min(key)
        # up to and with the inclusive prefix at an even end; short of the word not
        # yet published at an odd one (its value is a stale launch's, or nothing)
        take = inside & (((2 * k <= end) & ((end & 1) == 0)) | (2 * k + 1 < end))
        value = word.to(tl.int32).to(tl.float32, bitcast=True)
        carry = {combine}(tl.reduce(tl.where(take, value, identity), 0, {combine}), carry)
        searching = ((end & 1) == 1) | (end == 2 * WINDOW)
        look = look - (end >> 1)
    return carry
"""
for _kind, (_combine, _) in COMBINES.items():
    HELPERS[f"ember_lookback_{_kind}"] = _LOOKBACK_TEMPLATE.format(kind=_kind, combine=_combine)
CALLS = {f"ember_lookback_{kind}": (combine,) for kind, (combine, _) in COMBINES.items()}


def setup_lookback_axes(plan: KernelPlan, printer: IndexPrinter, scope: Scope) -> None:
    """Ticket -> (row, tile of the row): offsets, index vectors, masks and loop
    variables of the [1, RBLOCK] block, and `tag`, the launch's tag."""
    x, r = plan.axes
    index_type = plan.index_type
    scope.emit(f"xnumel = {printer(x.numel)}")
    scope.emit(f"rnumel = {printer(r.numel)}")
    scope.emit(f'ticket = tl.atomic_add({WORKSPACE}, 1, sem="relaxed")')
    scope.emit("programs = tl.num_programs(0).to(tl.int64)")
    scope.emit("launch = ticket // programs")
    scope.emit("tile = ticket - launch * programs")
    scope.emit("tag = (launch & 0x1FFFFFFF) << 2")
    scope.emit("tiles = (rnumel + RBLOCK - 1) // RBLOCK")
    scope.emit(f"segment = (tile % tiles).to({index_type})")
    scope.emit(f"xoffset = (tile // tiles).to({index_type}) * XBLOCK")
    scope.emit("xindex = xoffset + tl.arange(0, XBLOCK)[:, None]")
    scope.emit("xmask = xindex < xnumel")
    define_variables(x, printer, scope)
    scope.emit("rbase = tl.arange(0, RBLOCK)[None, :]")
    scope.emit("rindex = segment * RBLOCK + rbase")
    scope.emit("rmask = rindex < rnumel")
    define_variables(r, printer, scope)


def lookback_member(
    kind: str, name: str, x: str, member: int, scope: Scope, helpers: set[str]
) -> str:
    """Lines scanning the block `x` ([1, RBLOCK], carried values, identity past the
    row) of member number `member` with look-back; returns the name of the result."""
    combine, identity = COMBINES[kind]
    helpers |= {combine, f"ember_lookback_{kind}", "ember_lookback_publish"}
    words = f"{name}_words"
    scope.emit(f"{words} = {WORKSPACE} + 1 + {member} * programs")
    scope.emit(f"{name}_total = tl.reduce({x}, None, {combine})")
    # the aggregate first: later tiles combine it without waiting for this one's carry
    scope.emit(
        f"ember_lookback_publish({words}, tile, tag, {name}_total, "
        "tl.where(segment == 0, 2, 1).to(tl.int64))"
    )
    scan = {
        "sum": f"tl.cumsum({x}, 1)",
        "prod": f"tl.cumprod({x}, 1)",
        "logsumexp": f"tl.associative_scan({x}, 1, {combine})",
    }[kind]
    scope.emit(f"{name}_scan = {scan}")
    scope.emit(
        f"{name}_carry = ember_lookback_{kind}({words}, tile, segment, tag, "
        f"tl.full([], {identity}, tl.float32), {WINDOW})"
    )
    scope.emit("if segment > 0:")
    scope.emit(
        f"    ember_lookback_publish({words}, tile, tag, {combine}({name}_carry, {name}_total), 2)"
    )
    result = f"{name}_result"
    scope.emit(f"{result} = {combine}({name}_carry, {name}_scan)")
    return result
