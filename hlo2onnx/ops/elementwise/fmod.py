"""XLA's float `remainder` (C's fmod) computed exactly from arithmetic, for targets whose Mod kernel is wrong.

IREE 3.13 computes Mod as a division and a product in the element type: NaN for x % inf and the wrong sign
for -1e4 % 1e-3 (hlo2onnx/targets/iree.py). fmod's result is always exactly representable, and this
computes it exactly, in float64 (f32, f16 and bf16 values are exact there), by peeling the quotient off
STEP bits at a time from the top. At step k, with y_k = |y| * 2^(STEP k):

- q = floor(r / y_k) is never below the true quotient (the division is correctly rounded and monotonic,
  and every integer below 2^53 is a double) and at most one above it, and below 2^(STEP + 3);
- y_k = hi + lo, Veltkamp's split, so that q*hi and q*lo are exact products;
- r - q*hi is exact (Sterbenz: q*hi is within a factor two of r), and (r - q*hi) - q*lo is the exact
  r - q*y_k, which lies in (-y_k, y_k) and fits in 53 bits; a negative one gets y_k added, exactly.

Where every quotient is small (periodic boundaries, angles), one step does (below 2^STEP for f64; below
2^23 for the narrow formats, whose step divides in f32: _NARROW_STEP), and an If takes that branch: one
elementwise pass. Its test reads the operands as given: max|x| < 2^bits min|y| (reductions that IREE folds
for a constant y), else, in the other branch, |x| < 2^bits |y| element by element, and a second If. Each
branch computes the whole remainder from x and y, so that IREE makes the one-step branch a single dispatch.
Where x is a sum of broadcasts of much smaller operands (a pair displacement x_i - x_j + c), the first test
bounds max|x| by the sum of their maxima instead (held to half the limit, for the roundings), and each branch
computes x again from them: nothing of x's size is read for the test, and IREE fuses the broadcasts into the
branch's pass (the f32 FIRE step: three passes over a 2M-element x, 2.1 ms, became one).
The looping branch takes any quotient: each element's top step comes from logs, kept at or below
log2(|x| / |y|) so that y_k never exceeds |x|, and an ONNX Loop runs the largest number of steps.
"""
from __future__ import annotations

from functools import partial
from typing import Callable

import numpy as np
import onnx_ir as ir

from hlo2onnx.builder import Builder
from hlo2onnx.ops.control.loops import loop
from hlo2onnx.types import TensorType, set_type

F32, F64, I64 = np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int64)
STEP = 22  # bits per step: q < 2^25, and 26-bit hi and lo halves keep q*hi and q*lo within 53 bits
_TOP = 1023 // STEP  # the largest k whose 2^(STEP k) is a double: a step's scale is a product of three
_SCALES = np.ldexp(1.0, STEP * np.arange(_TOP + 1))
# r and y_k are kept between 2^-800 and 2^900 by a shared power-of-two scale, so that Veltkamp's split
# neither overflows nor makes subnormal halves (IREE flushes those to zero); `units` counts the scalings.
_LOW, _HIGH, _UNIT = 2.0 ** -800, 2.0 ** 900, 2.0 ** 200


def fmod(b: Builder, x: ir.Value, y: ir.Value, ttype: TensorType) -> ir.Value:
    """fmod(x, y) of two float tensors of `ttype` (same shape), bit for bit as XLA computes it."""
    # Each branch computes the whole remainder from x and y, specials and sign included, so that the one-step
    # branch is one elementwise pass over the narrow operands: IREE fuses it into one dispatch, where a branch
    # that read f64 copies made outside it had them written to memory first (the f32 FIRE step on IREE took
    # 32 ms where IREE's inexact Mod takes 11; docs/runtime.md, IREE).
    wide = _wide_dtype(ttype)
    yw, limit = b.cast(y, wide), _limit(b, ttype)
    # min|y| over y flattened, folded away by IREE where y is a constant or the broadcast of one (a periodic
    # box). A NaN or a zero y fails the tests below; a product that overflows means every quotient is small.
    flat = b.shape_const([-1])
    min_y = b.op("ReduceMin", b.op("Abs", b.op("Reshape", yw, flat)), keepdims=0)
    found = _abs_bound(b, x, ttype)
    if found is not None:
        # max|x| bounded from x's smaller operands (a pair displacement x_i - x_j + c): no pass over x. The
        # bound may fall short of max|x| by a few roundings, so it is held to half the limit. Each branch
        # computes x again from those operands, so that IREE fuses the broadcasts into the branch's one pass
        # (x made outside the If is written to memory, then read back).
        bound, rebuild = found
        half = b.op("Mul", min_y, b.op("Mul", limit, b.const(0.5, wide)))
        return _if(b, b.op("Less", bound, half), ttype, lambda sb: _first_step(sb, rebuild(sb), y, ttype),
                   lambda sb: _element_by_element(sb, rebuild(sb), y, ttype))
    # max|x| as max(max x, -min x) over x flattened.
    xf = b.op("Reshape", b.cast(x, wide), flat)
    max_x = b.op("Max", b.op("ReduceMax", xf, keepdims=0), b.op("Neg", b.op("ReduceMin", xf, keepdims=0)))
    return _if(b, b.op("Less", max_x, b.op("Mul", min_y, limit)), ttype, lambda sb: _first_step(sb, x, y, ttype),
               lambda sb: _element_by_element(sb, x, y, ttype))


# An upper bound on |x| passes through these: |a +- b| <= max|a| + max|b| (rounding is monotonic, so the
# computed sum of the maxima is at least each computed element's magnitude, up to the roundings of the
# bound's own dtype), and the others move or negate values.
_SUMS = ("Add", "Sub")
_MOVES = ("Neg", "Abs", "Identity", "Reshape", "Expand", "Unsqueeze", "Squeeze", "Transpose", "Flatten")
_BOUND_SHARE = 8  # the operands read must be this many times smaller than x
_BOUND_NODES = 16  # nodes visited at most


def _abs_bound(b: Builder, x: ir.Value, ttype: TensorType
               ) -> tuple[ir.Value, Callable[[Builder], ir.Value]] | None:
    """A scalar in the tests' dtype at least max|x| (NaN or inf where an operand holds one), from operands of
    x's sums and broadcasts that are much smaller than x, and a function that computes x again from them in a
    subgraph's builder; None where x has no such operands."""
    size, wide, visited = ttype.size, _wide_dtype(ttype), 0
    chain: list[ir.Node] = []  # x's nodes above the operands, producers first

    # The bound's terms: a small operand, or a pair of terms to add. Nothing is emitted until the whole walk
    # succeeds (a failed one would leave dead reductions in an unoptimized model).
    def walk(v: ir.Value) -> ir.Value | tuple | None:
        nonlocal visited
        visited += 1
        if visited > _BOUND_NODES or (v.dtype is not None and v.dtype != x.dtype):
            return None
        dims = v.shape.dims if v.shape is not None else None
        if dims is not None and all(isinstance(d, int) for d in dims) and int(np.prod(dims)) * _BOUND_SHARE <= size:
            return v
        node = v.producer()
        if node is None or node.domain not in ("", "ai.onnx") or not node.inputs or node.inputs[0] is None \
                or len(node.outputs) != 1:
            return None
        if node.op_type in _SUMS and len(node.inputs) == 2:
            first, second = walk(node.inputs[0]), walk(node.inputs[1])
            found = None if first is None or second is None else (first, second)
        else:
            found = walk(node.inputs[0]) if node.op_type in _MOVES else None
        chain.append(node)
        return found

    terms = walk(x) if size >= _BOUND_SHARE else None
    if terms is None:
        return None
    maxima: dict[int, ir.Value] = {}

    def emit(term: ir.Value | tuple) -> ir.Value:
        if isinstance(term, tuple):
            return b.op("Add", emit(term[0]), emit(term[1]))
        if id(term) not in maxima:
            flat = b.op("Reshape", b.cast(term, wide), b.shape_const([-1]))
            maxima[id(term)] = b.op("ReduceMax", b.op("Abs", flat), keepdims=0)
        return maxima[id(term)]

    bound = emit(terms)

    def rebuild(sb: Builder) -> ir.Value:
        copies: dict[int, ir.Value] = {}
        for node in chain:
            if id(node.outputs[0]) in copies:
                continue
            inputs = [copies.get(id(v), v) if i == 0 or node.op_type in _SUMS else v
                      for i, v in enumerate(node.inputs)]
            out = ir.Node(node.domain, node.op_type, inputs, list(node.attributes.values()), graph=sb.graph).outputs[0]
            out.type, out.shape = node.outputs[0].type, node.outputs[0].shape
            copies[id(node.outputs[0])] = out
        return copies[id(x)]

    return bound, rebuild


def _wide_dtype(ttype: TensorType) -> np.dtype:
    """The dtype of the If's tests: f32 for the narrow formats (2^23 is past f16's range), f64 for f64."""
    return F32 if np.dtype(ttype.dtype).itemsize <= 4 else F64


def _wide(b: Builder, x: ir.Value, y: ir.Value, ttype: TensorType) -> tuple[ir.Value, ir.Value, ir.Value]:
    """x and y for the If's tests, and 2^bits, where one step takes quotients below 2^bits."""
    wide = _wide_dtype(ttype)
    return b.cast(x, wide), b.cast(y, wide), _limit(b, ttype)


def _limit(b: Builder, ttype: TensorType) -> ir.Value:
    """2^bits in the tests' dtype, where one step takes quotients below 2^bits."""
    wide = _wide_dtype(ttype)
    return b.const(2.0 ** (_NARROW_STEP if wide == F32 else STEP), wide)


def _first_step(b: Builder, x: ir.Value, y: ir.Value, ttype: TensorType) -> ir.Value:
    """fmod(x, y) where every quotient is below 2^bits: in f32 for the narrow formats, in f64 for f64."""
    if np.dtype(ttype.dtype).itemsize <= 4:
        return _exact(b, x, y, ttype, _narrow_step, F32)
    return _exact(b, x, y, ttype, _one_step, F64)


def _element_by_element(b: Builder, x: ir.Value, y: ir.Value, ttype: TensorType) -> ir.Value:
    """fmod(x, y) in one step where no |x| >= 2^bits |y| (NaNs compare false; an infinite x, a zero y or a
    flushed subnormal one take the Loop, which is exact for every element), else by the Loop. The count of
    large quotients is exact to 2^24, never 0 once one is found, and 0 on an empty tensor."""
    xw, yw, limit = _wide(b, x, y, ttype)
    large = b.op("GreaterOrEqual", b.op("Abs", xw), b.op("Mul", b.op("Abs", yw), limit))
    fits = b.op("Less", b.op("ReduceSum", b.op("Cast", large, to=ir.DataType.FLOAT), keepdims=0),
                b.const(0.5, np.float32))
    return _if(b, fits, ttype, lambda sb: _first_step(sb, x, y, ttype),
               lambda sb: _exact(sb, x, y, ttype, _steps, F64))


def _if(b: Builder, condition: ir.Value, ttype: TensorType, then_branch: Callable[[Builder], ir.Value],
        else_branch: Callable[[Builder], ir.Value]) -> ir.Value:
    """If(condition) over two branches that each build their value of `ttype` in a subgraph."""
    branches = {}
    for name, build in (("then_branch", then_branch), ("else_branch", else_branch)):
        sb = b.subgraph(f"fmod_{name[:4]}")
        branches[name] = sb.finish_subgraph([], [build(sb)], [ttype])
    result = b.ops("If", condition, num_outputs=1, **branches)[0]
    set_type(result, ttype)
    return result


def _exact(b: Builder, x: ir.Value, y: ir.Value, ttype: TensorType,
           path: Callable[[Builder, ir.Value, ir.Value, TensorType], ir.Value], compute: np.dtype) -> ir.Value:
    """fmod(x, y) in ttype, with `path` computing fmod(|x|, |y|) in `compute` (which holds every value of
    ttype) where both are regular."""
    f = partial(b.const, dtype=compute)
    xc, yc = b.cast(x, compute), b.cast(y, compute)
    ax, ay = b.op("Abs", xc), b.op("Abs", yc)
    # `path` runs where |y| <= |x| < inf and y is normal (comparisons with a NaN are false). XLA's CPU code
    # reads subnormal operands as zero (f16 and bf16 are computed in f32, where theirs are normal): a
    # subnormal y gives NaN (measured: fmod(1e-27, 2.5e-40) is NaN under jax.jit).
    tiny = np.finfo(np.float64 if np.dtype(ttype.dtype).itemsize == 8 else np.float32).tiny
    normal_y = b.op("GreaterOrEqual", ay, f(tiny))
    regular = b.op("And", b.op("And", b.op("GreaterOrEqual", ax, ay), b.op("Less", ax, f(np.inf))), normal_y)
    one = f(1.0)
    remainder = path(b, b.op("Where", regular, ax, one), b.op("Where", regular, ay, one),
                     TensorType(ttype.shape, compute))
    # Elsewhere fmod is x itself where |x| < |y| (±0, finite x % ±inf), else NaN (x inf or NaN, y 0, subnormal
    # or NaN). x taken as it is, in Where's second branch, whose -0 ORT keeps (it turns one taken from the first
    # into +0, arithmetic.py); a regular x's sign (x is not zero: no division needed to tell -0) by a
    # product after the Where, which a zero remainder turns into -0.
    kept = b.op("And", b.op("Less", ax, ay), normal_y)
    negative = b.op("And", regular, b.op("Less", xc, f(0.0)))
    magnitude = b.op("Where", regular, remainder, b.op("Mul", xc, b.op("Where", kept, one, f(np.nan))))
    result = b.op("Mul", magnitude, b.op("Where", negative, f(-1.0), one))
    return b.cast(result, ttype.dtype)


# f32, f16 and bf16 values have 24 significant bits at most. Below 2^23 the f32 quotient's floor is the true
# quotient or one above it (f32 division is correctly rounded and monotonic, and both integers are f32 values),
# and q*y (48 bits) and x - q*y (in (-y, y), on y's grid) are exact in f64: one step, no split, with the
# division and the checks in f32 (IREE's f32 vectors hold twice the lanes, and its f64 division is slow).
_NARROW_STEP = 23


def _narrow_step(b: Builder, r: ir.Value, y_k: ir.Value, f32: TensorType) -> ir.Value:
    """r - q*y_k for q = floor(r / y_k) < 2^23, exactly, in [0, y_k), for f32 r and y_k."""
    q = b.op("Floor", b.op("Div", r, y_k))
    rd, yd = b.cast(r, F64), b.cast(y_k, F64)
    return b.cast(_into_range(b, b.op("Sub", rd, b.op("Mul", b.cast(q, F64), yd)), yd), F32)


def _into_range(b: Builder, rest: ir.Value, y_k: ir.Value) -> ir.Value:
    """rest + y_k where rest < 0 (the quotient came out one too high), exactly: [0, y_k)."""
    zero = b.const(0.0, F64)
    return b.op("Add", rest, b.op("Where", b.op("Less", rest, zero), y_k, zero))


def _reduce(b: Builder, r: ir.Value, y_k: ir.Value) -> ir.Value:
    """One step: r - q*y_k for q = floor(r / y_k) < 2^(STEP + 3), exactly, in [0, y_k). y_k must lie in
    [2^-800, 2^900] (Veltkamp's split: hi holds y_k's top 26 bits, lo the rest, neither overflowing nor
    subnormal)."""
    c = partial(b.const, dtype=F64)
    split = b.op("Mul", y_k, c(2.0 ** 27 + 1))
    hi = b.op("Sub", split, b.op("Sub", split, y_k))
    lo = b.op("Sub", y_k, hi)
    q = b.op("Floor", b.op("Div", r, y_k))
    return _into_range(b, b.op("Sub", b.op("Sub", r, b.op("Mul", q, hi)), b.op("Mul", q, lo)), y_k)


def _one_step(b: Builder, ax: ir.Value, ay: ir.Value, f64: TensorType) -> ir.Value:
    """fmod(|x|, |y|) where |x| < 2^STEP |y|, with both scaled (exactly) into the split's range first."""
    c = partial(b.const, dtype=F64)
    high, low = b.op("Greater", ay, c(_HIGH)), b.op("Less", ay, c(_LOW))
    scale = b.op("Where", high, c(1 / _UNIT), b.op("Where", low, c(_UNIT), c(1.0)))
    # Undone by a product, exact as a division by the scale would be (f64 division is the slowest of IREE's
    # elementwise ops: the f64 FIRE step spent most of its remainder's time in its three).
    undo = b.op("Where", high, c(_UNIT), b.op("Where", low, c(1 / _UNIT), c(1.0)))
    return b.op("Mul", _reduce(b, b.op("Mul", ax, scale), b.op("Mul", ay, scale)), undo)


def _steps(b: Builder, ax_s: ir.Value, ay_s: ir.Value, f64: TensorType) -> ir.Value:
    """fmod(|x|, |y|) for any quotient: a Loop of steps from each element's top step down."""
    f = partial(b.const, dtype=F64)
    one = f(1.0)
    # Each element's top step, from floor(log2(|x| / |y|)) rounded down by at least one (the logs' error
    # is far below the margin), and the loop's trip count: the largest top step, plus one.
    log_ratio = b.op("Mul", b.op("Sub", b.op("Log", ax_s), b.op("Log", ay_s)), f(1 / np.log(2.0)))
    bits = b.op("Max", b.op("Floor", b.op("Sub", log_ratio, f(1.01))), f(0.0))
    top = b.cast(b.op("Floor", b.op("Div", bits, f(float(STEP)))), I64)
    flat_top = b.op("Concat", b.op("Reshape", top, b.shape_const([-1])), b.const(np.zeros(1, I64)), axis=0)
    trip = b.op("Add", b.op("ReduceMax", flat_top, keepdims=0), b.const(np.int64(1)))
    y_top = _scaled(b, ay_s, _power_of_two_steps(b, top))  # at most |x| / 2
    high = b.op("Greater", y_top, f(_HIGH))
    down = b.op("Where", high, f(1 / _UNIT), one)  # exact: r = |x| and y_top both stay above 2^700
    units = b.op("Neg", b.op("Cast", high, to=ir.DataType.DOUBLE))
    carried = [b.op("Mul", ax_s, down), b.op("Mul", y_top, down), units]

    def step(sb: Builder, i: ir.Value, values: list[ir.Value]):
        r, y_k, scalings = values
        c = partial(sb.const, dtype=F64)
        k = sb.op("Sub", sb.op("Sub", trip, sb.const(np.int64(1))), i)
        active = sb.op("LessOrEqual", k, top)  # this element's steps run from its top step down
        low = sb.op("And", active, sb.op("Less", y_k, c(_LOW)))
        up = sb.op("Where", low, c(_UNIT), c(1.0))
        r, y_k = sb.op("Mul", r, up), sb.op("Mul", y_k, up)  # exact: scaling up never rounds
        scalings = sb.op("Add", scalings, sb.op("Cast", low, to=ir.DataType.DOUBLE))
        shift = sb.op("Where", active, c(2.0 ** -STEP), c(1.0))
        return [sb.op("Where", active, _reduce(sb, r, y_k), r), sb.op("Mul", y_k, shift), scalings], []

    remainder, _, scalings = loop(b, "fmod", trip, carried, [f64] * 3, step)
    # Undo the scalings (at most one down, then two up): each product exact until the last, which rounds
    # only where the result is subnormal.
    remainder = b.op("Mul", remainder, b.op("Where", b.op("Less", scalings, f(0.0)), f(_UNIT), one))
    for count in (1.0, 2.0):
        undo = b.op("Where", b.op("GreaterOrEqual", scalings, f(count)), f(1 / _UNIT), one)
        remainder = b.op("Mul", remainder, undo)
    return remainder


def _power_of_two_steps(b: Builder, top: ir.Value) -> list[ir.Value]:
    """2^(STEP top) as three factors, each a table entry and a double (top is at most 2098 / STEP)."""
    table = b.const(_SCALES)
    cap = b.const(np.int64(_TOP))
    first = b.op("Min", top, cap)
    second = b.op("Min", b.op("Sub", top, first), cap)
    third = b.op("Sub", b.op("Sub", top, first), second)
    return [b.op("Gather", table, part) for part in (first, second, third)]


def _scaled(b: Builder, value: ir.Value, factors: list[ir.Value]) -> ir.Value:
    """value * 2^(STEP top), one factor at a time: each product is exact and grows towards |x|, never past."""
    for factor in factors:
        value = b.op("Mul", value, factor)
    return value
