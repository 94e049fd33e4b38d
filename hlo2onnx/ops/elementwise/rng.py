"""stablehlo.rng_bit_generator, expanded exactly as XLA expands it.

The bits are an XLA choice, not the spec's: this follows XLA's
RngBitGeneratorExpander and lib/prng.cc (ThreeFry2x32 with 20 rounds,
Philox4x32 with 10), so results match jax.jit on CPU bit for bit.

- The state is u64[n]; its first word is the key (kept in the new state).
- THREE_FRY: counter = state[1]; element i gets counter + i. 64-bit outputs
  take both ThreeFry words; 32-bit ones split the shape in halves (XLA's
  SplitShapeIntoHalves) and interleave the two words along the split dim.
- PHILOX: a 128-bit counter (state[1] low, state[0] high for u64[2], whose new
  state keeps only the low word; state[1], state[2] for u64[3]). Counter + i
  gives 4 words, laid out round-robin.
- DEFAULT is PHILOX: XLA's CPU and GPU compilers run RngBitGeneratorExpander(RNG_PHILOX).
- Narrower outputs are the low bits of the 32-bit stream; signed outputs
  reinterpret the unsigned bits (XLA's CPU executable even returns them unsigned).
- Float outputs are refused: ORT has no bitcast, so random NaN patterns would
  lose their payloads (and XLA returns unsigned integers for them anyway).

Words are u32 tensors (ORT's Add/Xor/BitShift wrap mod 2^32 there); Philox's
32x32->64 multiply runs in u64.
"""
from __future__ import annotations

import numpy as np
import onnx_ir as ir
from jax.extend.mlir.dialects import stablehlo

from hlo2onnx.ops.elementwise.bits import from_unsigned
from hlo2onnx.registry import register

U32, U64 = np.dtype(np.uint32), np.dtype(np.uint64)
from hlo2onnx.translator import RuleContext
_THREEFRY_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PHILOX_M = (0xD2511F53, 0xCD9E8D57)  # multipliers of words 0 and 2
_PHILOX_W = (0x9E3779B9, 0xBB67AE85)  # key increments per round
_DEFAULT_ALGORITHM = "PHILOX"


# -- words ------------------------------------------------------------------------
def _split64(b, x: ir.Value) -> tuple[ir.Value, ir.Value]:
    """(low, high) 32-bit words of a u64 (Cast to u32 keeps the low bits)."""
    high = b.op("BitShift", x, b.const(np.uint64(32)), direction="RIGHT")
    return b.cast(x, U32), b.cast(high, U32)


def _join64(b, low: ir.Value, high: ir.Value) -> ir.Value:
    high = b.op("BitShift", b.cast(high, U64), b.const(np.uint64(32)), direction="LEFT")
    return b.op("BitwiseOr", b.cast(low, U64), high)


def _rotl32(b, v: ir.Value, r: int) -> ir.Value:
    left = b.op("BitShift", v, b.const(np.uint32(r)), direction="LEFT")
    return b.op("BitwiseOr", left, b.op("BitShift", v, b.const(np.uint32(32 - r)), direction="RIGHT"))


def _counters(b, start: ir.Value, n: int) -> ir.Value:
    """start + [0, n) in u64 (wrapping), as a vector."""
    iota = b.op("Range", b.const(np.int64(0)), b.const(np.int64(n)), b.const(np.int64(1)))
    return b.op("Add", start, b.cast(iota, U64))


# -- ThreeFry -------------------------------------------------------------------------
def _threefry2x32(b, x: list[ir.Value], k0: ir.Value, k1: ir.Value) -> list[ir.Value]:
    """20 rounds: five groups of four, each followed by a key injection."""
    ks = [k0, k1, b.op("BitwiseXor", b.op("BitwiseXor", k0, k1), b.const(np.uint32(0x1BD11BDA)))]
    x = [b.op("Add", x[0], ks[0]), b.op("Add", x[1], ks[1])]
    for group in range(5):
        for r in _THREEFRY_ROTATIONS[group % 2]:
            x0 = b.op("Add", x[0], x[1])
            x = [x0, b.op("BitwiseXor", x0, _rotl32(b, x[1], r))]
        injected = b.op("Add", ks[(group + 2) % 3], b.const(np.uint32(group + 1)))
        x = [b.op("Add", x[0], ks[(group + 1) % 3]), b.op("Add", x[1], injected)]
    return x


def _threefry(b, key: ir.Value, counter: ir.Value, shape: tuple[int, ...], width: int):
    """(bits as u32/u64 of `shape`, new counter)."""
    k0, k1 = _split64(b, key)
    if width == 64:
        n = int(np.prod(shape))
        x = _threefry2x32(b, list(_split64(b, _counters(b, counter, n))), k0, k1)
        return b.op("Reshape", _join64(b, *x), b.shape_const(shape)), b.op("Add", counter, b.const(np.uint64(n)))
    if not shape:  # XLA's half shape of a scalar is [1]; the first word is the value
        x = _threefry2x32(b, list(_split64(b, counter)), k0, k1)
        return x[0], b.op("Add", counter, b.const(np.uint64(1)))
    # Split on the first even dim (else the largest), halves interleaved along a new minor dim.
    even = [i for i, d in enumerate(shape) if d % 2 == 0]
    axis = even[0] if even else int(np.argmax(shape))
    half = list(shape)
    half[axis] = -(-shape[axis] // 2)
    half.insert(axis + 1, 1)
    n = int(np.prod(half))
    x = _threefry2x32(b, list(_split64(b, _counters(b, counter, n))), k0, k1)
    pair = b.op("Concat", *(b.op("Reshape", w, b.shape_const(half)) for w in x), axis=axis + 1)
    padded = list(shape)
    padded[axis] = 2 * half[axis]
    bits = b.op("Reshape", pair, b.shape_const(padded))
    if padded[axis] != shape[axis]:
        bits = b.op("Slice", bits, b.shape_const([0]), b.shape_const([shape[axis]]), b.shape_const([axis]))
    return bits, b.op("Add", counter, b.const(np.uint64(n)))


# -- Philox ----------------------------------------------------------------------------
def _philox4x32(b, x: list[ir.Value], k0: ir.Value, k1: ir.Value) -> list[ir.Value]:
    mask = b.const(np.uint64(0xFFFFFFFF))
    for round_ in range(10):
        keys = [b.op("Add", k, b.const(np.uint32(w * round_ % 2 ** 32))) if round_ else k
                for k, w in zip((k0, k1), _PHILOX_W)]
        p0 = b.op("Mul", b.cast(x[0], U64), b.const(np.uint64(_PHILOX_M[0])))
        p1 = b.op("Mul", b.cast(x[2], U64), b.const(np.uint64(_PHILOX_M[1])))
        hi0, hi1 = (b.cast(b.op("BitShift", p, b.const(np.uint64(32)), direction="RIGHT"), U32) for p in (p0, p1))
        x = [b.op("BitwiseXor", b.op("BitwiseXor", hi1, x[1]), keys[0]), b.cast(b.op("BitwiseAnd", p1, mask), U32),
             b.op("BitwiseXor", b.op("BitwiseXor", hi0, x[3]), keys[1]), b.cast(b.op("BitwiseAnd", p0, mask), U32)]
    return x


def _add128(b, low: ir.Value, high: ir.Value, delta: ir.Value) -> tuple[ir.Value, ir.Value]:
    """(low, high) + delta, delta a u64: the high word takes the carry."""
    new_low = b.op("Add", low, delta)
    carry = b.cast(b.op("Less", new_low, low), U64)
    return new_low, b.op("Add", high, carry)


def _philox(b, key: ir.Value, low: ir.Value, high: ir.Value, shape: tuple[int, ...], width: int):
    """(bits as u32/u64 of `shape`, new counter low, new counter high)."""
    size = int(np.prod(shape))
    words_per_element = width // 32
    blocks = -(-size * words_per_element // 4)
    k0, k1 = _split64(b, key)
    counter = _add128(b, low, high, _counters(b, b.const(np.uint64(0)), blocks))
    x = _philox4x32(b, [*_split64(b, counter[0]), *_split64(b, counter[1])], k0, k1)
    if width == 64:
        x = [_join64(b, x[0], x[1]), _join64(b, x[2], x[3])]
    # Round-robin: block j's words are elements len(x)*j, len(x)*j + 1, ...
    stacked = b.op("Concat", *(b.op("Unsqueeze", w, b.shape_const([1])) for w in x), axis=1)
    flat = b.op("Reshape", stacked, b.shape_const([-1]))
    if blocks * len(x) != size:
        flat = b.op("Slice", flat, b.shape_const([0]), b.shape_const([size]), b.shape_const([0]))
    new_low, new_high = _add128(b, low, high, b.const(np.uint64(blocks)))
    return b.op("Reshape", flat, b.shape_const(shape)), new_low, new_high


# -- the op ------------------------------------------------------------------------------
def _algorithm(attr) -> str:
    name = attr if isinstance(attr, str) else stablehlo.RngAlgorithmAttr(attr).value
    return _DEFAULT_ALGORITHM if name == "DEFAULT" else name


@register("stablehlo.rng_bit_generator")
def rng_bit_generator(ctx: RuleContext, state: ir.Value, *, rng_algorithm) -> list[ir.Value]:
    b = ctx.b
    algorithm = _algorithm(rng_algorithm)
    state_type, out_type = ctx.in_types[0], ctx.out_types[1]
    dtype, shape = out_type.dtype, tuple(out_type.shape)
    if state_type.dtype != U64:
        raise NotImplementedError(f"rng_bit_generator with a {state_type.dtype} state: XLA expands u64 states only")
    if dtype.kind not in "ui":
        raise NotImplementedError(f"rng_bit_generator producing {dtype}: only integer bits can be exact (ORT has "
                                  "no bitcast, random NaN patterns would lose their payloads)")
    words = state_type.shape[0]
    if (algorithm, words) not in {("THREE_FRY", 2), ("PHILOX", 2), ("PHILOX", 3)}:
        raise NotImplementedError(f"rng_bit_generator {algorithm} with a u64[{words}] state: XLA takes "
                                  "u64[2] for THREE_FRY and u64[2] or u64[3] for PHILOX")
    width = 64 if dtype.itemsize == 8 else 32  # narrower types keep the low bits of 32-bit words
    word = [b.op("Gather", state, b.const(np.int64(i))) for i in range(words)]
    key = word[0]
    if algorithm == "THREE_FRY":
        bits, counter = _threefry(b, key, word[1], shape, width)
        new_state = [key, counter]
    else:
        high = word[2] if words == 3 else key  # XLA reverses a u64[2] state into the 128-bit counter
        bits, low, high = _philox(b, key, word[1], high, shape, width)
        new_state = [key, low, high][:words]
    new_state = b.op("Concat", *(b.op("Unsqueeze", w, b.shape_const([0])) for w in new_state), axis=0)
    return [new_state, from_unsigned(b, bits, dtype)]  # u32 -> u8/u16 keeps the low bits
