"""The `openvino-cpu` target: what OpenVINO's CPU plugin computes wrongly, and the exact rewrites it needs
(targets/openvino_rewrite.py).

Measured with openvino 2026.4 at opset 21 (one tiny ONNX model per op and dtype against numpy, with the
f32 precision hint; tests/test_openvino.py re-checks the refusals and runs the op tables on it):

- float64 (and complex128, stored as f64 pairs) is computed in f32 by every node, Identity included:
  1 + 2**-40 comes back as 1.0, 1e300 as f32's max.
- int64 values are narrowed to int32 by every node (an int64 Identity of 2**40 + 3 returns 3), and uint64
  arithmetic to 32 bits. Index and shape tensors are int64 in ONNX and hold small values, so int64 is
  refused only where it carries data: a model input or output, or a compute node (the table below).
- int8 and uint8 Add, Sub, Mul, Neg and Abs saturate instead of wrapping (127 + 1 = 127); uint8 BitShift
  left saturates too; integer MatMul is computed in f32; int32 and uint32 ReduceSum, ReduceMax/Min, Div
  and Mod go through f32 (2**31 - 1 loses its low bits); uint32 Abs, Max, Min, comparisons and right
  shifts treat it as int32. int16/uint16 reductions and unsigned Neg are refused by OpenVINO itself.
- Pad on int32/uint32 converts its pad value through f32 (cummin's INT32_MAX padding became INT32_MIN).
- TopK does not put equal values in index order (ONNX asks for it; XLA's stable sort needs it), so a
  TopK whose indices are read (argsort, sorts with payloads) is refused; a values-only TopK is exact.
- Its DFT gives wrong multi-axis FFTs (jnp.fft.fft2 off by 11 on unit-normal data); the 1-D FFT, a MatMul
  against the DFT matrix, is exact. uint32 bitwise ops lose the top bit (PRNGKey of a uint32 seed).
- Casts keyed by target type (`Cast:int64`) since their kernel dtype is the input's.
- Pad(mode=wrap) is refused by OpenVINO. The translator only emits constant Pads; the entry guards
  models from elsewhere checked against this target.
"""
from __future__ import annotations

from hlo2onnx.targets import ort
from hlo2onnx.targets.openvino_rewrite import for_openvino
from hlo2onnx.targets.profile import Target, parse_dtypes

_EVERY = "bool int8 int16 int32 int64 uint8 uint16 uint32 uint64 float16 bfloat16 float32 float64"
_NARROW_INTS = "int8 uint8"
_FLOATED_INTS = "int32 uint32"  # kernels that compute these through f32
_WIDE = "int64 uint64"
_UNSIGNED_AS_SIGNED = "uint32"

# Ops that compute on their values (not data movement): none of them is exact on 64-bit integers.
_COMPUTE = """
    Abs Add And ArgMax ArgMin BitShift BitwiseAnd BitwiseNot BitwiseOr BitwiseXor Ceil Clip CumSum Div Equal
    Floor Gemm Greater GreaterOrEqual Less LessOrEqual MatMul Max Min Mod Mul Neg Not Or Pow ReduceL1
    ReduceMax ReduceMean ReduceMin ReduceProd ReduceSum ReduceSumSquare Round Sign Sub Sum TopK Xor
    ScatterND:add ScatterND:mul ScatterND:min ScatterND:max ScatterElements:add ScatterElements:mul
    ScatterElements:min ScatterElements:max
""".split()

# Clamps and comparisons of int64 index values stay exact: the values come from int32 data or array
# sizes (64-bit data is refused at the model's boundary, and every op that could make a large int64
# value is in the table), so narrowing them to int32 changes nothing. The op tables' gathers, scatters
# and dynamic slices clamp their indices this way.
_INDEX_SAFE = {"Max", "Min", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Equal"}
WRONG: dict[str, str] = {op: _WIDE if op not in _INDEX_SAFE else "uint64" for op in _COMPUTE}
for _ops, _spec in (
        ("Add Sub Mul Neg Abs", _NARROW_INTS),
        ("MatMul Gemm", "int8 uint8 int16 uint16 int32 uint32"),
        ("ReduceSum ReduceProd ReduceMax ReduceMin ReduceL1 ReduceSumSquare CumSum Div Mod", _FLOATED_INTS),
        ("Abs Max Min Less Greater LessOrEqual GreaterOrEqual ArgMax ArgMin TopK Clip Sign", _UNSIGNED_AS_SIGNED),
        ("BitShift", "uint8 uint16 uint32"),
        ("ReduceSum ReduceProd ReduceMax ReduceMin", "int16 uint16"),
        ("Neg", "uint8 uint16 uint32"),
        ("Cast:int64", "float16 bfloat16 float32 float64"),
        ("Pad", "int32 uint32"),  # the pad value goes through f32: INT32_MAX comes back as INT32_MIN
        ("BitwiseAnd BitwiseOr BitwiseXor BitwiseNot", "uint32"),  # jax.random.PRNGKey(4e9) lost its top bit
        ("Add Sub Mul", "uint32"),  # a uint32 constant past INT32_MAX loses its top bit (x + 0xFFFFFFFF)
        ("DFT", "float16 bfloat16 float32 float64"),  # multi-axis FFTs came back wrong (fft2: errors of 11)
        ("TopK:indices", _EVERY),  # ties not in index order
        ("Pad:wrap", _EVERY),
):
    for _op in _ops.split():
        WRONG[_op] = f"{WRONG.get(_op, '')} {_spec}"


OPENVINO_CPU = Target(
    "openvino-cpu",
    # ORT CPU's kernel table keeps the lowerings on paths the op tables test (f16 through f32, no bf16 math).
    dict(ort.ORT_CPU.missing),
    wrong={op: parse_dtypes(spec) for op, spec in WRONG.items()},
    narrowed=parse_dtypes("float64 uint64"),
    boundary_narrowed=parse_dtypes("int64"),
    # float Mod (fmod) gives NaN for x % inf and 0 for -1e4 % 1e-3: stablehlo.remainder takes its exact expansion.
    refused={"Mod": parse_dtypes("float16 bfloat16 float32 float64")},
    folds_constant_products=True,
    rewrites=(for_openvino,),
    description="OpenVINO's CPU plugin (f32 precision hint); f64, 64-bit integer math, integer wraparound, "
                "shifts and Pad(wrap) refused",
    runtime="openvino", providers=(), device="cpu", fallback_chain=("ort-cpu",))
