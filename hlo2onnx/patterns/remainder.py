"""jnp.mod by a positive constant without ONNX Runtime's float Mod.

`jnp.mod(x, c)` lowers to C's fmod (ONNX `Mod` with fmod=1) and a fix-up that
adds c to a negative remainder: `where(r < 0, r + c, r)`. ORT runs its float Mod
element by element through std::fmod, several times slower than a Div or a Mul
(docs/performance.md has the measurements; JAX-MD's periodic wrap spends a
quarter of a FIRE step in two of them). For a constant c > 0 the same floored
remainder comes from passes ORT vectorizes:

    f = floor(x / c)                   # the quotient, possibly one too large (x / c rounds up to an integer)
    y = (x - f * c_hi) - f * c_lo      # c = c_hi + c_lo, c_hi with half the mantissa bits (Cody-Waite)

and the fix-up that is already there, fed y instead of fmod(x, c), turns a
too-large quotient's y (in [-c, 0)) into y + c. Why the values stay those of fmod:
  * f * c_hi is exact while |f| < 2**(p/2) (p the mantissa bits: |x| < 4096 c in f32, 2**26 c in f64), and
    x - f * c_hi is then exact (Sterbenz: f * c_hi is within a factor 2 of x, or f is 0). What is left is
    one rounding of f * c_lo, far below an ulp of the result, and the final subtraction's half ulp:
    fmod is exact, so y is fmod's value to within about half an ulp of the result.
  * c a power of two (c_lo = 0): exact, the last Sub included.
  * NaN x: NaN. x = +-inf: inf - inf = NaN, as fmod.
  * A zero result: the fix-up's Where returns fmod's signed zero, y's zero is +0. So the rule only fires
    where the sign cannot be seen: every use of the fixed-up value adds or subtracts a nonzero finite
    constant (JAX-MD's wrap subtracts c / 2).
Beyond |x| >= 2**(p/2) c the products round and the error grows to about an ulp of x; the rule does not
know |x|, so the tests hold it to the dtype's tolerance on values up to 1e4 c.
"""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from hlo2onnx.patterns.cleanup import ScalarConstants, const_array, static_shape
from hlo2onnx.patterns.noderules import Emitter

_FLOATS = (ir.DataType.FLOAT, ir.DataType.DOUBLE)


def _constant(value: ir.Value | None) -> np.ndarray | None:
    """The scalar a one-element constant holds."""
    array = const_array(value)
    return array.reshape(()) if array is not None and array.size == 1 else None


def _is(value: ir.Value | None, scalar: np.ndarray) -> bool:
    other = _constant(value)
    return other is not None and other.dtype == scalar.dtype and other == scalar


def _producer(value: ir.Value, op_type: str) -> ir.Node | None:
    node = value.producer()
    return node if node is not None and node.op_type == op_type and node.domain == "" else None


def _is_fixup(where: ir.Node, r: ir.Value, c: np.ndarray) -> bool:
    """where(r < 0, r + c, r)."""
    if where.op_type != "Where" or where.inputs[2] is not r:
        return False
    less, add = _producer(where.inputs[0], "Less"), _producer(where.inputs[1], "Add")
    if less is None or add is None or less.inputs[0] is not r or not _is(less.inputs[1], np.zeros((), c.dtype)):
        return False
    return any(a is r and _is(k, c) for a, k in (add.inputs, add.inputs[::-1]))


def _feeds_only(value: ir.Value, r: ir.Value, c: np.ndarray, fixups: set) -> bool:
    """`value` (r < 0 or r + c) is read only by fix-ups of r."""
    if value.is_graph_output():
        return False
    for user, _ in value.uses():
        if not _is_fixup(user, r, c):
            return False
        fixups.add(user)
    return True


def _zero_sign_unseen(value: ir.Value) -> bool:
    """Every use adds or subtracts a nonzero finite constant: +0 and -0 give the same result there."""
    if value.is_graph_output() or not value.uses():
        return False
    for user, _ in value.uses():
        if user.op_type not in ("Add", "Sub") or user.domain != "":
            return False
        other = user.inputs[1] if user.inputs[0] is value else user.inputs[0]
        k = _constant(other)
        if other is value or k is None or not np.isfinite(k) or k == 0:
            return False
    return True


def split(c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """c = hi + lo exactly, hi with the top half of c's mantissa bits (so f * hi is exact for small integers f)."""
    keep = (np.finfo(c.dtype).nmant + 1) // 2
    mantissa, exponent = np.frexp(c)
    hi = np.ldexp(np.floor(mantissa * 2.0 ** keep), exponent - keep).astype(c.dtype)
    return hi, (c - hi).astype(c.dtype)


def _mod(node: ir.Node, emit: Emitter) -> ir.Value | None:
    """Mod(x, c), fmod=1, read only by jnp.mod's fix-up -> the floored remainder from Div, Floor, Mul, Sub."""
    attr = node.attributes.get("fmod")
    x, divisor = node.inputs
    r = node.outputs[0]
    c = _constant(divisor)
    if attr is None or attr.value != 1 or r.dtype not in _FLOATS or c is None or not (np.isfinite(c) and c > 0):
        return None
    if static_shape(x) != static_shape(r) or r.is_graph_output() or not emit.allows("Floor", x):
        return None
    fixups: set = set()
    for user, index in r.uses():
        if user.op_type == "Where" and index == 2 and _is_fixup(user, r, c):
            fixups.add(user)
        elif not (user.op_type in ("Less", "Add") and _feeds_only(user.outputs[0], r, c, fixups)):
            return None
    if not fixups or not all(_zero_sign_unseen(w.outputs[0]) for w in fixups):
        return None
    scalars = ScalarConstants(emit.graph)
    hi, lo = split(c)
    f = emit("Floor", emit("Div", x, divisor, like=r), like=r)
    y = emit("Sub", x, emit("Mul", f, scalars.get(hi), like=r), like=r)
    if lo != 0:
        y = emit("Sub", y, emit("Mul", f, scalars.get(lo), like=r), like=r)
    return y


RULES = {"Mod": _mod}
