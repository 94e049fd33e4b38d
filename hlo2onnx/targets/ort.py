"""The ONNX Runtime targets and `core`, with the kernel gaps the rules work around.

    mnjit(f, target="core")          hlo2onnx model.mlir --target ort-cuda

- `ort-cpu`: ONNX Runtime's CPU provider; its kernel gaps are measured (below).
- `ort-cuda`: ONNX Runtime's CUDA provider, from ORT's own kernel table
  (docs/OperatorKernels.md, CUDAExecutionProvider, latest opset rows). It cannot
  be tested without a GPU, so it is data only. A node CUDA has no kernel for
  still runs, on ORT's CPU provider: the check lists such nodes, it does not refuse them.
- `core`: a strict subset of the kind accelerator compilers accept: float32,
  int32, int64 and bool tensors only, no control flow (Loop/If), and a fixed list
  of common ops. A model with anything else is refused.

The ORT CPU gaps were measured with onnxruntime 1.31 and 1.32 at opset 21 (one
tiny model per op and dtype); tests/test_support.py re-checks every entry.
ORT's Max and Min kernels propagate NaN (microsoft/onnxruntime#21492, CPU; its
CUDA kernels alike), so its graphs carry no NaN guard.
"""
from __future__ import annotations

import numpy as np

from hlo2onnx.targets.profile import Target, parse_dtypes

_INTS = "int8 int16 int32 int64 uint8 uint16 uint32 uint64"
_FLOAT_ONLY = "bool " + _INTS  # ops whose kernels exist for floats only
_TRANSCENDENTAL_F64 = "bool float64 " + _INTS  # f32/f16 only

# op_type -> dtypes ORT CPU has no kernel for (bf16 is missing for every
# compute op and is added below).
ORT_CPU_MISSING = {
    "Add": "bool", "Sub": "bool", "Mul": "bool", "Div": "bool", "Mod": "bool",
    "Pow": "bool int8 int16 uint8 uint16 uint32 uint64",
    "Max": "bool int16 uint16", "Min": "bool int16 uint16",
    "Less": "bool", "Greater": "bool", "LessOrEqual": "bool", "GreaterOrEqual": "bool",
    "Neg": "bool uint8 uint16 uint32 uint64", "Abs": "bool", "Sign": "bool",
    "Where": "bool int16 uint16 uint64",
    "BitwiseAnd": "bool", "BitwiseOr": "bool", "BitwiseXor": "bool", "BitwiseNot": "bool",
    "ReduceSum": "bool int8 int16 uint8 uint16 uint32 uint64",
    "ReduceProd": "bool int8 int16 uint8 uint16 uint32 uint64",
    "ReduceMax": "int16 uint16 uint32 uint64", "ReduceMin": "int16 uint16 uint32 uint64",
    "ArgMax": "bool int16 uint16 uint32 uint64", "ArgMin": "bool int16 uint16 uint32 uint64",
    "MatMul": "bool int8 int16 uint8 uint16", "Gemm": "bool " + _INTS,
    "CumSum": "bool int8 int16 uint8 uint16 uint32 uint64",
    "Pad": "int16 uint16", "TopK": "bool uint16 uint32 uint64", "Clip": "bool",
    "Relu": "bool int16 int64 uint8 uint16 uint32 uint64",
    "EyeLike": "bool int8 int16 uint8 uint16 uint32 float16",
    # Convolutions and pools: float kernels only, and no f64 Conv/ConvTranspose/AveragePool.
    "Conv": _FLOAT_ONLY + " float64", "ConvTranspose": _FLOAT_ONLY + " float64",
    "AveragePool": _FLOAT_ONLY + " float64", "MaxPool": "bool int16 int32 int64 uint16 uint32 uint64",
    # Scatter reductions are keyed "op:reduction": ORT's kernels differ by reduction.
    "ScatterND:add": "float16", "ScatterND:mul": "float16",
    "ScatterND:min": "bool float16", "ScatterND:max": "bool float16",
    "ScatterElements:add": "float16", "ScatterElements:mul": "float16",
    "ScatterElements:min": "bool", "ScatterElements:max": "bool",
    **{op: _FLOAT_ONLY for op in ("Exp", "Log", "Sqrt", "Reciprocal", "Tanh", "Sin", "Cos", "Floor",
                                  "Ceil", "Round", "Sigmoid", "IsNaN", "IsInf")},
    **{op: _TRANSCENDENTAL_F64 for op in ("Tan", "Erf", "Atan", "Asin", "Acos", "Sinh", "Cosh",
                                          "Asinh", "Acosh", "Atanh")},
    # Ops the fusions emit (hlo2onnx/patterns). Gelu's tanh form has an f64 kernel, its erf form not.
    **{op: _TRANSCENDENTAL_F64 for op in ("Gelu", "HardSigmoid", "HardSwish", "Softplus", "LeakyRelu")},
    **{op: _FLOAT_ONLY for op in ("Softmax", "LayerNormalization", "RMSNormalization",
                                  "BatchNormalization", "Swish")},
    # The f64 kernel exists but gives -inf, not NaN, beside a +inf in a row (x - max is NaN there, and XLA's
    # log-sum-exp with it); the fusion keeps the graph's own arithmetic for f64 (measured, ORT 1.31 and 1.32).
    "LogSoftmax": "float64 " + _FLOAT_ONLY,
}
# ORT CPU (1.32, measured) has no f16 kernel for these: it casts to f32 around each such node, and
# then drops a Cast pair between two of them, even one of ours, so a chain like a*b+c is rounded to
# f16 once where XLA rounds after each op. Computing them in f32 with explicit Casts back (which
# ORT keeps between nodes of its own f32 kernels) rounds like XLA. Exact ops are listed too: the
# dropped pair around them would join the rounding ops on either side.
F16_VIA_F32 = (
    "Abs Neg Exp Log Sqrt Reciprocal Tanh Sin Cos Tan Floor Ceil Sigmoid Erf Atan Asin Acos Sinh Cosh Asinh "
    "Acosh Atanh Relu Softplus Add Sub Mul Div Pow Less Greater Equal LessOrEqual GreaterOrEqual ReduceSum "
    "ReduceMax ReduceMin ReduceProd ReduceMean ReduceSumSquare ReduceL2 ReduceLogSumExp ArgMax ArgMin CumSum "
    "MatMul Gemm Where Softmax LogSoftmax Gelu HardSigmoid HardSwish LeakyRelu Elu Selu Softsign Mish Conv "
    "ConvTranspose AveragePool MaxPool BatchNormalization Trilu Pad Sum Mean").split()
for _op in F16_VIA_F32:
    ORT_CPU_MISSING[_op] = ORT_CPU_MISSING.get(_op, "") + " float16"


# Kernels ORT CPU has that give wrong integer answers: its integer ReduceSum/ReduceProd accumulate in
# float64 and convert back with saturation (measured, 1.32: int32 [2^31-1, 1] sums to 2^31-1, int64
# [2^53+1, 2] to 2^53+2). XLA wraps; rules reduce integers with Add/Mul instead (ops/core/reduce.py), and
# asking for these kernels is an error. tests/test_int_wrap.py re-checks the measurement.
_ORT_CPU_WRONG = {"ReduceSum": _INTS, "ReduceProd": _INTS}


ORT_CPU = Target("ort-cpu", {op: parse_dtypes(spec) for op, spec in ORT_CPU_MISSING.items()},
                 wrong={op: parse_dtypes(spec) for op, spec in _ORT_CPU_WRONG.items()},
                 propagates_nan=True,
                 description="ONNX Runtime's CPU provider (kernel gaps measured)")



# -- ORT CUDA: op -> the dtypes its kernel is registered for ---------------------------------------------
_ALL = "bool int8 int16 int32 int64 uint8 uint16 uint32 uint64 float16 float32 float64 bfloat16"
_NUMERIC = "int8 int16 int32 int64 uint8 uint16 uint32 uint64 float16 float32 float64 bfloat16"
_FLOATS = "float16 float32 float64"
_FLOATS_BF16 = _FLOATS + " bfloat16"
_ORDERED = "float16 float32 float64 int32 int64 uint32 uint64"  # comparisons, Max/Min without bf16

_ORT_CUDA_KERNELS = {
    **{op: _NUMERIC for op in ("Abs", "Add", "Sub", "Mul", "Div", "Sign")},
    **{op: "bool" for op in ("And", "Or", "Xor", "Not")},
    **{op: _FLOATS for op in ("ArgMax", "ArgMin", "BatchNormalization", "Ceil", "Floor", "Round", "ConvTranspose",
                              "Cos", "Sin", "Einsum", "LeakyRelu", "Log", "LogSoftmax", "Reciprocal", "Softplus",
                              "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike")},
    **{op: _FLOATS_BF16 for op in ("AveragePool", "Conv", "Erf", "Exp", "Gelu", "Gemm", "MatMul", "HardSigmoid",
                                   "HardSwish", "IsInf", "IsNaN", "LayerNormalization", "RMSNormalization", "Relu",
                                   "Sigmoid", "Sqrt", "Tanh", "Softmax")},
    "Attention": "float16 float32 bfloat16",
    **{op: _ALL for op in ("Cast", "Concat", "ConstantOfShape", "Expand", "Flatten", "Gather", "GatherElements",
                           "Identity", "If", "Loop", "Reshape", "Shape", "Size", "Slice", "Split", "Squeeze",
                           "Unsqueeze", "Transpose", "ScatterElements", "ScatterND", "Trilu")},
    "Clip": "float16 float32 float64 int8 int64 uint8 uint64",
    "CumSum": _ORDERED,
    "Equal": "bool " + _ORDERED,
    **{op: _ORDERED for op in ("Greater", "GreaterOrEqual", "Less", "LessOrEqual")},
    **{op: _ORDERED + " bfloat16" for op in ("Max", "Min", "Mod")},
    "GatherND": "bool int64 float16 float32 float64 bfloat16",
    "MaxPool": "int8 uint8 " + _FLOATS,
    "Neg": "int8 int16 int32 int64 " + _FLOATS_BF16,
    "Pad": "bool " + _FLOATS,
    "Pow": "int32 int64 " + _FLOATS_BF16,
    "Range": "int16 int32 int64 float32 float64",
    "ReduceMax": "int32 int64 " + _FLOATS,
    "ReduceMin": "int8 uint8 int32 int64 " + _FLOATS,
    **{op: "int32 " + _FLOATS for op in ("ReduceMean", "ReduceProd")},
    "ReduceSum": "int32 int64 " + _FLOATS_BF16,
    "Tile": "int32 int64 " + _FLOATS_BF16,
    "TopK": "int32 int64 " + _FLOATS,
    "Where": "uint8 int32 int64 " + _FLOATS_BF16,  # the value dtype; the condition is bool
}
# Not registered at all for CUDA (they fall back to CPU): BitShift, Bitwise*, Tan, Atan, Asin, Acos, Sinh, Cosh,
# Asinh, Acosh, Atanh, Bernoulli, Multinomial, Swish.


def _kernel_table(kernels: dict[str, str]) -> dict[str, frozenset[np.dtype]]:
    everything = parse_dtypes(_ALL)
    return {op: everything - parse_dtypes(spec) for op, spec in kernels.items()}


ORT_CUDA = Target("ort-cuda", _kernel_table(_ORT_CUDA_KERNELS), bf16_compute=True, propagates_nan=True,
                  ops=frozenset(_ORT_CUDA_KERNELS), fallback=ORT_CPU,
                  description="ONNX Runtime's CUDA provider (from ORT's kernel table; nodes it lacks run on CPU)",
                  providers=("CUDAExecutionProvider", "CPUExecutionProvider"), device="gpu")

# -- core: what a typical accelerator compiler accepts ------------------------------------------------------
_CORE_OPS = frozenset("""
    Abs Add And ArgMax ArgMin AveragePool BatchNormalization Cast Ceil Clip Concat ConstantOfShape Conv
    ConvTranspose Cos Div Equal Erf Exp Expand Flatten Floor Gather Gemm Greater GreaterOrEqual Identity
    LayerNormalization Less LessOrEqual Log LogSoftmax MatMul Max MaxPool Min Mul Neg Not Or Pad Pow Range
    Reciprocal ReduceMax ReduceMean ReduceMin ReduceProd ReduceSum Relu Reshape Shape Sigmoid Sign Sin Slice
    Softmax Split Sqrt Squeeze Sub Tanh Tile Transpose Unsqueeze Where
""".split())
CORE = Target("core", {"MatMul": parse_dtypes("int32 int64 bool"), "Gemm": parse_dtypes("int32 int64 bool")},
              ops=_CORE_OPS, dtypes=parse_dtypes("bool int32 int64 float32"), expanded=frozenset({"IsNaN", "IsInf"}),
              description="a strict accelerator-compiler subset: f32/i32/i64/bool, no Loop/If, common ops only")
