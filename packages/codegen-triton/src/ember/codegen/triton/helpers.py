"""Small @triton.jit helper functions that generated kernels call.

Each helper is Triton source text under its name; a kernel's module contains only the
helpers it uses (and the helpers those call), so every kernel file stands alone.

The random-number helpers reproduce ember.ir.random bit for bit in 32-bit unsigned
integer math: `mix` is the 32-bit integer hash, `ember_random_bits` the keyed counter
hash, `ember_rand_uniform` its top 24 bits scaled into [0, 1). `ember_rand_normal` is
Box-Muller over the uniforms of counters 2c and 2c + 1 (equal to the reference up to
the last bits of log1p and cos, which no two math libraries share).
"""

from __future__ import annotations

from ember.codegen.triton.lookback import CALLS as LOOKBACK_CALLS
from ember.codegen.triton.lookback import HELPERS as LOOKBACK_HELPERS
from ember.codegen.triton.special import SPECIAL_CALLS, SPECIAL_HELPERS

HELPERS: dict[str, str] = {
    "ember_truncdiv": """
@triton.jit
def ember_truncdiv(a, b):
    # Integer division rounding towards zero, defined for every divisor: LLVM leaves a
    # zero divisor and MIN // -1 undefined. Eager CUDA does not raise on either: a zero
    # divisor gives all bits set (-1; 8- to 32-bit types bit for bit; int64 gives
    # 4294967295 there, which is not matched) and MIN // -1 gives MIN.
    zero = b == 0
    minus_one = b == -1
    safe = tl.where(zero | minus_one, 1, b)
    quotient = tl.where(minus_one, 0 - a, a // safe)
    return tl.where(zero, quotient | ~quotient, quotient)
""",
    "ember_fmod": """
@triton.jit
def ember_fmod(a, b):
    # The remainder of ember_truncdiv (sign of the dividend): -1 for a zero divisor
    # and 0 for a divisor of -1, as eager CUDA gives.
    zero = b == 0
    safe = tl.where(zero | (b == -1), 1, b)
    r = a % safe
    return tl.where(zero, r | ~r, r)
""",
    "ember_floordiv": """
@triton.jit
def ember_floordiv(a, b):
    # Python // on integers: Triton's // truncates towards zero
    quotient = ember_truncdiv(a, b)
    fix = (ember_fmod(a, b) != 0) & ((a < 0) != (b < 0))
    return quotient - fix.to(quotient.dtype)
""",
    "ember_remainder": """
@triton.jit
def ember_remainder(a, b):
    # Python % on integers: the result takes the divisor's sign
    r = ember_fmod(a, b)
    fix = (r != 0) & ((r < 0) != (b < 0))
    return r + tl.where(fix, b, 0)
""",
    "ember_remainder_float": """
@triton.jit
def ember_remainder_float(a, b):
    r = libdevice.fmod(a, b)
    fix = (r != 0) & ((r < 0) != (b < 0))
    return tl.where(fix, r + b, r)
""",
    "ember_mix32": """
@triton.jit
def ember_mix32(x):
    # 32-bit wrapping multiplies done in uint64 and masked: the same bits, and no
    # signed-overflow trap when kernels are built with debug=True.
    x = x.to(tl.uint64)
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    x = x ^ (x >> 16)
    return x.to(tl.uint32)
""",
    "ember_random_bits": """
@triton.jit
def ember_random_bits(seed, counter):
    counter = counter.to(tl.int64)
    seed = seed.to(tl.int64)
    lo = (counter & 0xFFFFFFFF).to(tl.uint32)
    hi = ((counter >> 32) & 0xFFFFFFFF).to(tl.uint32)
    h = ember_mix32(lo ^ (seed & 0xFFFFFFFF).to(tl.uint32))
    key = ember_mix32(((seed >> 32) & 0xFFFFFFFF).to(tl.uint32) ^ 0x9E3779B9)
    return ember_mix32(h ^ hi ^ key)
""",
    "ember_rand_uniform": """
@triton.jit
def ember_rand_uniform(seed, counter):
    bits = ember_random_bits(seed, counter)
    return (bits >> 8).to(tl.float32) * 5.960464477539063e-08
""",
    "ember_rand_normal": """
@triton.jit
def ember_rand_normal(seed, counter):
    u1 = ember_rand_uniform(seed, counter * 2)
    u2 = ember_rand_uniform(seed, counter * 2 + 1)
    radius = libdevice.sqrt(-2.0 * libdevice.log1p(-u1))
    return radius * libdevice.cos(6.2831854820251465 * u2)
""",
    "ember_max_combine": """
@triton.jit
def ember_max_combine(a, b):
    # NaN wins, as in torch.amax
    return tl.where((a != a) | (a > b), a, b)
""",
    "ember_min_combine": """
@triton.jit
def ember_min_combine(a, b):
    return tl.where((a != a) | (a < b), a, b)
""",
    "ember_prod_combine": """
@triton.jit
def ember_prod_combine(a, b):
    return a * b
""",
    "ember_argmax_combine": """
@triton.jit
def ember_argmax_combine(a, a_index, b, b_index):
    # the larger value wins, NaN counts as largest, ties go to the smaller index
    a_nan = a != a
    b_nan = b != b
    take_b = (b > a) | (b_nan & ~a_nan) | (((b == a) | (a_nan & b_nan)) & (b_index < a_index))
    return tl.where(take_b, b, a), tl.where(take_b, b_index, a_index)
""",
    "ember_argmin_combine": """
@triton.jit
def ember_argmin_combine(a, a_index, b, b_index):
    a_nan = a != a
    b_nan = b != b
    take_b = (b < a) | (b_nan & ~a_nan) | (((b == a) | (a_nan & b_nan)) & (b_index < a_index))
    return tl.where(take_b, b, a), tl.where(take_b, b_index, a_index)
""",
    "ember_cummax_combine": """
@triton.jit
def ember_cummax_combine(a, a_index, b, b_index):
    # torch.cummax's rule: NaN wins, then the larger value; ties (NaN against NaN
    # included) go to the later index. Written symmetrically (the index decides, not
    # the operand order), so tl.reduce may combine in any order; in scan order it is
    # "take b when b is NaN or a is not and b >= a".
    a_nan = a != a
    b_nan = b != b
    later = b_index > a_index
    take_b = (b_nan & (~a_nan | later)) | (~a_nan & ~b_nan & ((b > a) | ((b == a) & later)))
    return tl.where(take_b, b, a), tl.where(take_b, b_index, a_index)
""",
    "ember_cummin_combine": """
@triton.jit
def ember_cummin_combine(a, a_index, b, b_index):
    a_nan = a != a
    b_nan = b != b
    later = b_index > a_index
    take_b = (b_nan & (~a_nan | later)) | (~a_nan & ~b_nan & ((b < a) | ((b == a) & later)))
    return tl.where(take_b, b, a), tl.where(take_b, b_index, a_index)
""",
    "ember_logaddexp_combine": """
@triton.jit
def ember_logaddexp_combine(a, b):
    # torch.logcumsumexp's combine: log1p(exp(min - max)) + max; two equal infinities
    # give that infinity (not NaN from inf - inf); NaN propagates
    lo = tl.minimum(a, b)
    hi = tl.maximum(a, b)
    same_inf = (lo == hi) & ((lo == float("inf")) | (lo == float("-inf")))
    out = libdevice.log1p(tl.exp(lo - hi)) + hi
    out = tl.where(same_inf, a, out)
    return tl.where((a != a) | (b != b), a + b, out)
""",
    "ember_sort_partner": """
@triton.jit
def ember_sort_partner(x, DIST: tl.constexpr, ITYPE: tl.constexpr):
    # For each element of rows of a power-of-two length, the element DIST places away
    # in its pair (positions p and p ^ DIST). The pairs are picked apart as integer
    # bits (ITYPE, x's width): a masked sum of bits is exact where one of floats would
    # turn -0.0 into 0.0 and spread NaN to the other element.
    bits = tl.reshape(x.to(ITYPE, bitcast=True), [x.numel // (2 * DIST), 2, DIST])
    side = tl.arange(0, 2)[None, :, None]
    first = tl.sum(bits * (1 - side), 1)[:, None, :]
    second = tl.sum(bits * side, 1)[:, None, :]
    other = tl.where(side == 0, second, first).to(ITYPE)
    return tl.reshape(other, x.shape).to(x.dtype, bitcast=True)
""",
    "ember_sort_before": """
@triton.jit
def ember_sort_before(a, a_at, b, b_at, n, DESCENDING: tl.constexpr):
    # Whether (a, from position a_at) comes before (b, from b_at) in torch's order:
    # NaN above every number, -0.0 equal to 0.0, equal values in input order, and
    # padding (positions >= n) after every element. Positions are distinct, so this
    # is a strict total order and the sort's result is unique.
    a_nan = a != a
    b_nan = b != b
    if DESCENDING:
        first = (a > b) | (a_nan & ~b_nan)
        second = (b > a) | (b_nan & ~a_nan)
    else:
        first = (a < b) | (b_nan & ~a_nan)
        second = (b < a) | (a_nan & ~b_nan)
    by_value = first | (~second & (a_at < b_at))
    a_real = a_at < n
    b_real = b_at < n
    return tl.where(a_real & b_real, by_value, tl.where(a_real | b_real, a_real, a_at < b_at))
""",
    "ember_sort_rows": """
@triton.jit
def ember_sort_rows(v, k, n, LOG: tl.constexpr, DESCENDING: tl.constexpr, ITYPE: tl.constexpr):
    # Bitonic sort of each row ([rows, 2**LOG]) of values v with their positions k
    # (int32, 0 .. 2**LOG - 1 on entry; the first n are real). Stage s merges sorted
    # runs of 2**(s - 1) into runs of 2**s, ascending and descending in turn (by bit s
    # of the slot), the last one all in order; each step compares slots 2**j apart.
    slot = k
    for s in tl.static_range(1, LOG + 1):
        falling = ((slot >> s) & 1) != 0
        for t in tl.static_range(s):
            # the distance is 2**(s - 1 - t); a constexpr cannot be re-bound in a loop
            other_v = ember_sort_partner(v, 1 << (s - 1 - t), ITYPE)
            other_k = ember_sort_partner(k, 1 << (s - 1 - t), tl.int32)
            right = ((slot >> (s - 1 - t)) & 1) != 0
            take = ember_sort_before(other_v, other_k, v, k, n, DESCENDING) != (right != falling)
            v = tl.where(take, other_v, v)
            k = tl.where(take, other_k, k)
    return v, k
""",
    "ember_scatter_combine": """
@triton.jit
def ember_scatter_combine(old, value, HOW: tl.constexpr):
    # one step of a scatter's reduction as eager takes it: the target's value `old`
    # combined with the scattered `value`. Max and min keep a NaN already there, take a
    # NaN or a strictly larger (smaller) value and otherwise keep `old`, so of two equal
    # values (-0.0 and 0.0) the one already there stays. A value loaded once for the
    # whole block (0-d) is widened first: the interpreter cannot `&` a 0-d comparison
    # with a block
    old, value = tl.broadcast(old, value)
    if HOW == "prod":
        out = old * value
    elif HOW == "sum":
        out = old + value
    elif HOW == "max":
        out = tl.where((old != old) | ((value == value) & (value <= old)), old, value)
    else:
        out = tl.where((old != old) | ((value == value) & (value >= old)), old, value)
    return out
""",
    "ember_scatter_cas": """
@triton.jit
def ember_scatter_cas(base, index, value, mask, HOW: tl.constexpr, ITYPE: tl.constexpr):
    # base[index] = ember_scatter_combine(base[index], value) for the lanes in `mask`,
    # elements of 32 or 64 bits (ITYPE, the signed integer of their width): read the
    # target, combine, compare-and-swap the result in; a lane whose swap found another
    # value (another lane or program changed it since) combines with that value and
    # tries again, until every lane's swap went through. Bits are compared as integers
    # (NaN == NaN), and a lane whose combination leaves the bits unchanged is done
    # without a swap. tl.atomic_cas has no mask: lanes out of the game swap their
    # target (base[0] where masked off) with itself, which changes nothing. Relaxed
    # order is enough: the loop needs each swap to be atomic, and the kernel's end
    # orders its writes before the next kernel's reads
    target = base.to(tl.pointer_type(ITYPE)) + tl.where(mask, index, 0)
    pending = mask & (index == index)
    seen = tl.load(target, pending, other=0)
    go = ember_any(pending)
    while go:
        old = seen
        new = ember_scatter_combine(old.to(value.dtype, bitcast=True), value, HOW)
        new = new.to(ITYPE, bitcast=True)
        pending = pending & (new != old)
        expected = tl.where(pending, old, 0)
        seen = tl.atomic_cas(target, expected, tl.where(pending, new, 0), sem="relaxed")
        pending = pending & (seen != old)
        go = ember_any(pending)
""",
    "ember_scatter_cas_narrow": """
@triton.jit
def ember_scatter_cas_narrow(
    base, index, value, mask, HOW: tl.constexpr, STORAGE: tl.constexpr, UTYPE: tl.constexpr
):
    # ember_scatter_cas for elements of 8 or 16 bits (STORAGE, with UTYPE the unsigned
    # integer of its width): the swap is of the aligned 32-bit word holding the element
    # (its byte offset in the word from the address, little-endian), whose other bytes
    # are kept as read, so a swap fails, and is retried, when another lane changed a
    # neighbour in the same word too. The value is rounded to STORAGE first and the
    # combination after, one rounding per step as eager's kernels do. The word of the
    # last element can reach past the end of the storage (CUDA's allocations are
    # aligned and padded to far more than 4 bytes; eager's 16-bit atomics swap the same
    # words), and the bytes there are written back as read
    pointer = base + tl.where(mask, index, 0)
    offset = pointer.to(tl.int64) & 3
    word = (pointer.to(tl.pointer_type(tl.int8)) - offset).to(tl.pointer_type(tl.uint32))
    shift = (offset * 8).to(tl.uint32)
    field = tl.full([], (1 << UTYPE.primitive_bitwidth) - 1, tl.uint32) << shift
    value = value.to(STORAGE).to(value.dtype)
    pending = mask & (index == index)
    seen = tl.load(word, pending, other=0)
    go = ember_any(pending)
    while go:
        old = seen
        current = (old >> shift).to(UTYPE).to(STORAGE, bitcast=True).to(value.dtype)
        combined = ember_scatter_combine(current, value, HOW).to(STORAGE)
        new = (old & ~field) | (combined.to(UTYPE, bitcast=True).to(tl.uint32) << shift)
        pending = pending & (new != old)
        expected = tl.where(pending, old, 0)
        seen = tl.atomic_cas(word, expected, tl.where(pending, new, 0), sem="relaxed")
        pending = pending & (seen != old)
        go = ember_any(pending)
""",
    "ember_welford_combine": """
@triton.jit
def ember_welford_combine(mean_a, m2_a, count_a, mean_b, m2_b, count_b):
    # Chan et al.: merge two partial (mean, M2, count) triples
    count = count_a + count_b
    delta = mean_b - mean_a
    weight_b = tl.where(count == 0, 0.0, count_b / tl.where(count == 0, 1.0, count))
    mean = mean_a + delta * weight_b
    m2 = m2_a + m2_b + delta * delta * count_a * weight_b
    return mean, m2, count
""",
}

# helper -> the helpers it calls
_CALLS: dict[str, tuple[str, ...]] = {
    "ember_floordiv": ("ember_truncdiv", "ember_fmod"),
    "ember_remainder": ("ember_fmod",),
    "ember_random_bits": ("ember_mix32",),
    "ember_rand_uniform": ("ember_random_bits",),
    "ember_rand_normal": ("ember_rand_uniform",),
    "ember_sort_rows": ("ember_sort_partner", "ember_sort_before"),
    "ember_scatter_cas": ("ember_any", "ember_scatter_combine"),
    "ember_scatter_cas_narrow": ("ember_any", "ember_scatter_combine"),
}


HELPERS.update(SPECIAL_HELPERS)
HELPERS.update(LOOKBACK_HELPERS)
_CALLS.update(LOOKBACK_CALLS)
_CALLS.update(SPECIAL_CALLS)


def helper_source(used: set[str]) -> str:
    """The source of the helpers in `used` and their callees, callees first."""
    ordered: list[str] = []

    def visit(name: str) -> None:
        if name in ordered:
            return
        for callee in _CALLS.get(name, ()):
            visit(callee)
        ordered.append(name)

    for name in sorted(used):
        visit(name)
    return "".join(HELPERS[name] for name in ordered)
