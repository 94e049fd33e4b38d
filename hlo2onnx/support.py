"""What a target runtime can execute, as one small table.

Rules never special-case a runtime. They ask `Target.compute_dtype(op, dtype)`
which dtype to run an ONNX op in; when the runtime lacks the kernel, the
answer is a wider dtype and the builder casts around the op.

The ORT CPU gaps below were measured with onnxruntime 1.31 and 1.32 at opset 21 (one
tiny model per op and dtype); tests/test_support.py re-checks every entry.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)
_D = {n: np.dtype(n) for n in ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                                "uint64", "float16", "float32", "float64")}
_D["bfloat16"] = BF16

# Where to go when a kernel is missing, in order of preference. Two's-complement
# wraparound makes add/sub/mul exact after casting back; other ops never see
# values outside the narrow range.
WIDER: dict[np.dtype, tuple[np.dtype, ...]] = {
    _D["bool"]: (_D["uint8"], _D["int32"]),
    _D["int8"]: (_D["int32"],),
    _D["int16"]: (_D["int32"],),
    _D["uint8"]: (_D["int32"],),
    _D["uint16"]: (_D["int32"],),
    _D["uint32"]: (_D["int64"],),
    _D["uint64"]: (_D["int64"],),
    _D["float16"]: (_D["float32"],),
    BF16: (_D["float32"],),
    _D["float64"]: (),
}

_INTS = "int8 int16 int32 int64 uint8 uint16 uint32 uint64"
_FLOAT_ONLY = "bool " + _INTS  # ops whose kernels exist for floats only
_TRANSCENDENTAL_F64 = "bool float64 " + _INTS  # f32/f16 only

# op_type -> dtypes ORT CPU has no kernel for (bf16 is missing for every
# compute op and is added below).
_ORT_CPU_MISSING = {
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
    **{op: _FLOAT_ONLY for op in ("Softmax", "LogSoftmax", "LayerNormalization", "RMSNormalization",
                                  "BatchNormalization", "Swish")},
}
# ORT CPU (1.32, measured) has no f16 kernel for these: it casts to f32 around each such node, and
# then drops a Cast pair between two of them, even one of ours, so a chain like a*b+c is rounded to
# f16 once where XLA rounds after each op. Computing them in f32 with explicit Casts back (which
# ORT keeps between nodes of its own f32 kernels) rounds like XLA. Exact ops are listed too: the
# dropped pair around them would join the rounding ops on either side.
_F16_VIA_F32 = (
    "Abs Neg Exp Log Sqrt Reciprocal Tanh Sin Cos Tan Floor Ceil Sigmoid Erf Atan Asin Acos Sinh Cosh Asinh "
    "Acosh Atanh Relu Softplus Add Sub Mul Div Pow Less Greater Equal LessOrEqual GreaterOrEqual ReduceSum "
    "ReduceMax ReduceMin ReduceProd ReduceMean ReduceSumSquare ReduceL2 ReduceLogSumExp ArgMax ArgMin CumSum "
    "MatMul Gemm Where Softmax LogSoftmax Gelu HardSigmoid HardSwish LeakyRelu Elu Selu Softsign Mish Conv "
    "ConvTranspose AveragePool MaxPool BatchNormalization Trilu Pad Sum Mean").split()
for _op in _F16_VIA_F32:
    _ORT_CPU_MISSING[_op] = _ORT_CPU_MISSING.get(_op, "") + " float16"
# Data movement that ORT CPU runs in bf16 too (measured; Expand, Tile, Pad, Where, Equal do not).
_DATA_MOVEMENT = {"Identity", "Reshape", "Transpose", "Concat", "Slice", "Gather", "Cast", "Squeeze", "Unsqueeze",
                  "Shape", "Size", "ConstantOfShape", "Flatten", "Split", "GatherND", "GatherElements"}


# Kernels ORT CPU has that give wrong integer answers: its integer ReduceSum/ReduceProd accumulate in
# float64 and convert back with saturation (measured, 1.32: int32 [2^31-1, 1] sums to 2^31-1, int64
# [2^53+1, 2] to 2^53+2). XLA wraps; rules reduce integers with Add/Mul instead (ops/reduce.py), and
# asking for these kernels is an error. tests/test_int_wrap.py re-checks the measurement.
_ORT_CPU_WRONG = {"ReduceSum": _INTS, "ReduceProd": _INTS}


def _parse(spec: str) -> frozenset[np.dtype]:
    return frozenset(_D[name] for name in spec.split())


@dataclass(frozen=True)
class Target:
    """A runtime's op subset. `missing` maps an ONNX op to dtypes it cannot run.

    Profiles for other backends (hlo2onnx/targets.py) also name the only ops
    and dtypes they accept (`ops`, `dtypes`; None: any), the target that runs
    what they cannot (`fallback`: ORT's CPU provider behind its CUDA one), and
    ops they lack but take in expanded form (`expanded`: IsNaN as x != x).

    A target also says where mnjit runs the model: the `runtime` package
    (`onnxruntime` or `openvino`), its execution `providers` in order of
    preference, and the jax `device` platform its arrays live on.
    """

    name: str
    missing: dict[str, frozenset[np.dtype]] = field(default_factory=dict)
    bf16_compute: bool = False
    ops: frozenset[str] | None = None
    dtypes: frozenset[np.dtype] | None = None
    fallback: "Target | None" = None
    expanded: frozenset[str] = frozenset()  # ops rules may emit; replaced after fusion by exact expansions
    wrong: dict[str, frozenset[np.dtype]] = field(default_factory=dict)  # kernels that run but do not match XLA
    description: str = ""
    runtime: str = "onnxruntime"
    providers: tuple[str, ...] = ("CPUExecutionProvider",)
    device: str = "cpu"
    # Dtypes the runtime silently computes in a narrower type: any node that reads or writes one is refused.
    narrowed: frozenset[np.dtype] = frozenset()
    # Dtypes narrowed the same way but safe inside the graph for index and shape values: refused as model
    # inputs and outputs only (compute nodes on them belong in `wrong`).
    boundary_narrowed: frozenset[np.dtype] = frozenset()
    # Names of the targets that run what this one refuses, in order, for partitioned execution (fallback=True).
    fallback_chain: tuple[str, ...] = ()

    def supports(self, op_type: str, dtype: np.dtype) -> bool:
        dtype = np.dtype(dtype)
        if self.ops is not None and op_type.partition(":")[0] not in self.ops | self.expanded:
            return False
        if self.dtypes is not None and dtype not in self.dtypes:
            return False
        if dtype in self.narrowed:
            return False
        if dtype == BF16 and not self.bf16_compute and op_type not in _DATA_MOVEMENT:
            return False
        return dtype not in self.missing.get(op_type, ())

    def compute_dtype(self, op_type: str, dtype: np.dtype) -> np.dtype:
        """The dtype to run `op_type` in: `dtype` itself or the first wider one that works.

        A kernel in `wrong` is an error, not a choice: a rule that reaches it would answer wrongly.
        """
        dtype = np.dtype(dtype)
        for candidate in (dtype, *WIDER.get(dtype, ())):
            if self.supports(op_type, candidate):
                if candidate in self.wrong.get(op_type, ()):
                    raise NotImplementedError(f"{self.name}'s {op_type} on {candidate} does not match XLA "
                                              f"(measured: hlo2onnx/support.py, hlo2onnx/targets_openvino.py)")
                return candidate
        if self.fallback is not None:
            return self.fallback.compute_dtype(op_type, dtype)
        raise NotImplementedError(f"{self.name} has no {op_type} kernel for {dtype} nor a wider type")


ORT_CPU = Target("ort-cpu", {op: _parse(spec) for op, spec in _ORT_CPU_MISSING.items()},
                 wrong={op: _parse(spec) for op, spec in _ORT_CPU_WRONG.items()},
                 description="ONNX Runtime's CPU provider (kernel gaps measured)")
