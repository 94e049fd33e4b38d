"""Target profiles: which ONNX ops and dtypes a backend accepts, and the check of a finished model against one.

    mnjit(f, target="core")          hlo2onnx model.mlir --target ort-cuda

- `ort-cpu`: ONNX Runtime's CPU provider; its kernel gaps are measured (below).
- `ort-cuda`: ONNX Runtime's CUDA provider, from ORT's own kernel table
  (docs/OperatorKernels.md, CUDAExecutionProvider, latest opset rows). It cannot
  be tested without a GPU, so it is data only. A node CUDA has no kernel for
  still runs, on ORT's CPU provider: the check lists such nodes, it does not refuse them.
- `core`: a strict subset of the kind accelerator compilers accept: float32,
  int32, int64 and bool tensors only, no control flow (Loop/If), and a fixed list
  of common ops. A model with anything else is refused.

- `openvino-cpu`: OpenVINO's CPU plugin, minus what it computes wrongly (targets_openvino.py).
- `iree-cpu`: IREE compiling the model for the host CPU, minus what its ONNX importer cannot take
  (targets_iree.py); what it refuses runs on ort-cpu under `fallback=True`.
- `iree-cuda`: the same, compiled for the NVIDIA GPU jax sees and run by IREE's CUDA driver; what it
  refuses runs on ort-cuda, or else ort-cpu, under `fallback=True`.

Rules never special-case a runtime. They ask `Target.compute_dtype(op, dtype)`
which dtype to run an ONNX op in; when the runtime lacks the kernel, the
answer is a wider dtype and the builder casts around the op. The ORT CPU gaps
were measured with onnxruntime 1.31 and 1.32 at opset 21 (one tiny model per op
and dtype); tests/test_support.py re-checks every entry.

Rules pick lowerings inside the profile (`Builder.typed` widens to a dtype the
target runs, fusions only emit ops it has). `validate` then walks the final graph
and names, for each node outside the profile, the StableHLO op and source line
that produced it (the node metadata the translator writes).
"""
from __future__ import annotations

import itertools

from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Iterable

import ml_dtypes
import numpy as np
import onnx_ir as ir
from onnx_ir.tape import Tape

from hlo2onnx import host_calls
from hlo2onnx import targets_iree, targets_openvino
from hlo2onnx.errors import Hlo2OnnxError
from hlo2onnx.provenance import SOURCE_LOC, SOURCE_OP
from hlo2onnx.target_table import TargetTable
from hlo2onnx.types import FLOAT8

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = {n: np.dtype(n) for n in ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                                "uint64", "float16", "float32", "float64")}
DTYPES["bfloat16"] = BF16

# Where to go when a kernel is missing, in order of preference. Two's-complement
# wraparound makes add/sub/mul exact after casting back; other ops never see
# values outside the narrow range.
WIDER: dict[np.dtype, tuple[np.dtype, ...]] = {
    DTYPES["bool"]: (DTYPES["uint8"], DTYPES["int32"]),
    DTYPES["int8"]: (DTYPES["int32"],),
    DTYPES["int16"]: (DTYPES["int32"],),
    DTYPES["uint8"]: (DTYPES["int32"],),
    DTYPES["uint16"]: (DTYPES["int32"],),
    DTYPES["uint32"]: (DTYPES["int64"],),
    DTYPES["uint64"]: (DTYPES["int64"],),
    DTYPES["float16"]: (DTYPES["float32"],),
    BF16: (DTYPES["float32"],),
    # float8 is storage only: no runtime computes in it, and float32 holds every value (XLA upcasts too).
    **{dtype: (DTYPES["float32"],) for dtype in FLOAT8},
    DTYPES["float64"]: (),
}

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
# Data movement that ORT CPU runs in bf16 too (measured; Expand, Tile, Pad, Where, Equal do not).
_DATA_MOVEMENT = {"Identity", "Reshape", "Transpose", "Concat", "Slice", "Gather", "Cast", "Squeeze", "Unsqueeze",
                  "Shape", "Size", "ConstantOfShape", "Flatten", "Split", "GatherND", "GatherElements", "BitCast"}


# Kernels ORT CPU has that give wrong integer answers: its integer ReduceSum/ReduceProd accumulate in
# float64 and convert back with saturation (measured, 1.32: int32 [2^31-1, 1] sums to 2^31-1, int64
# [2^53+1, 2] to 2^53+2). XLA wraps; rules reduce integers with Add/Mul instead (ops/reduce.py), and
# asking for these kernels is an error. tests/test_int_wrap.py re-checks the measurement.
_ORT_CPU_WRONG = {"ReduceSum": _INTS, "ReduceProd": _INTS}


def _parse(spec: str) -> frozenset[np.dtype]:
    return frozenset(DTYPES[name] for name in spec.split())


@dataclass(frozen=True, repr=False)
class Target:
    """A runtime's op subset. `missing` maps an ONNX op to dtypes it cannot run.

    Profiles for other backends (hlo2onnx/targets.py) also name the only ops
    and dtypes they accept (`ops`, `dtypes`; None: any), the target that runs
    what they cannot (`fallback`: ORT's CPU provider behind its CUDA one), and
    ops they lack but take in expanded form (`expanded`: IsNaN as x != x).

    A target also says where mnjit runs the model: the `runtime` package
    (`onnxruntime`, `openvino` or `iree`), its execution `providers` in order of
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
    # Ops (keyed like `wrong`) the runtime does not take at all for these dtypes (a compiler's importer lacks
    # them): rules with another lowering take it (compute_dtype), and validate refuses what is left.
    refused: dict[str, frozenset[np.dtype]] = field(default_factory=dict)
    # The runtime's float arithmetic reads and writes subnormals as zeros (as XLA's CPU code does): lowerings
    # that find a float's bits by arithmetic cannot see them.
    flushes_subnormals: bool = False
    # The runtime's compiler fuses a broadcast into the loop of the op that reads it (IREE): the patterns that
    # materialize broadcasts for ORT's kernels (patterns/last_axis.py) only add copies there.
    fuses_broadcasts: bool = False

    def __repr__(self) -> str:  # the op and dtype tables would print ~14 KB per target
        return f"Target({self.name!r}, runtime={self.runtime!r}, device={self.device!r})"

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
        if dtype in FLOAT8 and op_type not in _DATA_MOVEMENT:
            return False
        return dtype not in self.missing.get(op_type, ()) and dtype not in self.refused.get(op_type, ())

    def compute_dtype(self, op_type: str, dtype: np.dtype) -> np.dtype:
        """The dtype to run `op_type` in: `dtype` itself or the first wider one that works.

        A kernel in `wrong` is an error, not a choice: a rule that reaches it would answer wrongly.
        """
        dtype = np.dtype(dtype)
        for candidate in (dtype, *WIDER.get(dtype, ())):
            if self.supports(op_type, candidate):
                if candidate in self.wrong.get(op_type, ()):
                    raise NotImplementedError(f"{self.name}'s {op_type} on {candidate} does not match XLA "
                                              f"(measured: hlo2onnx/targets.py, hlo2onnx/targets_openvino.py)")
                return candidate
        if self.fallback is not None:
            return self.fallback.compute_dtype(op_type, dtype)
        raise NotImplementedError(f"{self.name} has no {op_type} kernel for {dtype} nor a wider type")


ORT_CPU = Target("ort-cpu", {op: _parse(spec) for op, spec in ORT_CPU_MISSING.items()},
                 wrong={op: _parse(spec) for op, spec in _ORT_CPU_WRONG.items()},
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
    everything = _parse(_ALL)
    return {op: everything - _parse(spec) for op, spec in kernels.items()}


ORT_CUDA = Target("ort-cuda", _kernel_table(_ORT_CUDA_KERNELS), bf16_compute=True,
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
CORE = Target("core", {"MatMul": _parse("int32 int64 bool"), "Gemm": _parse("int32 int64 bool")},
              ops=_CORE_OPS, dtypes=_parse("bool int32 int64 float32"), expanded=frozenset({"IsNaN", "IsInf"}),
              description="a strict accelerator-compiler subset: f32/i32/i64/bool, no Loop/If, common ops only")

OPENVINO_CPU = Target(
    "openvino-cpu",
    # ORT CPU's kernel table keeps the lowerings on paths the op tables test (f16 through f32, no bf16 math).
    dict(ORT_CPU.missing),
    wrong={op: _parse(spec) for op, spec in targets_openvino.WRONG.items()},
    narrowed=_parse("float64 uint64"),
    boundary_narrowed=_parse("int64"),
    description="OpenVINO's CPU plugin (f32 precision hint); f64, 64-bit integer math, integer wraparound, "
                "shifts and Pad(wrap) refused",
    runtime="openvino", providers=(), device="cpu", fallback_chain=("ort-cpu",))

IREE_CPU = Target(
    "iree-cpu",
    # ORT CPU's kernel table keeps the lowerings on paths the op tables test (f16 through f32, no bf16 math).
    dict(ORT_CPU.missing),
    dtypes=_parse(targets_iree.DTYPES),
    refused={op: _parse(spec) for op, spec in targets_iree.REFUSED.items()},
    flushes_subnormals=True,  # measured: 1e-39 * 1.5 and reduce_precision(1e-39, 8, 23) gave 0
    fuses_broadcasts=True,
    description="IREE (iree-base-compiler) compiled for the host CPU; no int16 or unsigned types but uint8, "
                "no Loop with scan outputs, DFT, ConvTranspose, f64 trigonometry or float scatter-min/max",
    runtime="iree", providers=(), device="cpu", fallback_chain=("ort-cpu",))

# The same importer and table: the refusals are the importer's and the torch-to-linalg conversion's, which
# come before the backend (f64 trigonometry is refused for llvm-cpu's missing libm; CUDA's libdevice has it,
# but the CPU measurement stands until it is measured on a GPU).
IREE_CUDA = replace(
    IREE_CPU, name="iree-cuda", device="gpu", fallback_chain=("ort-cuda", "ort-cpu"),
    description="IREE (iree-base-compiler) compiled for the NVIDIA GPU jax sees (CUDA driver only, no "
                "onnxruntime-gpu); the iree-cpu table")

TARGETS: dict[str, Target] = TargetTable({t.name: t for t in (ORT_CPU, ORT_CUDA, CORE, OPENVINO_CPU, IREE_CPU,
                                                                 IREE_CUDA)})


def get(target: str | Target) -> Target:
    if isinstance(target, Target):
        return target
    if target not in TARGETS:
        raise Hlo2OnnxError(f"unknown target {target!r} (choose from {', '.join(TARGETS)})")
    return TARGETS[target]


# -- validation ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Violation:
    """One node outside a target's profile, and the StableHLO op behind it."""

    op_type: str
    reason: str
    source_op: str | None
    where: str | None

    def __str__(self) -> str:
        source = f" from {self.source_op}" if self.source_op else ""
        return f"{self.op_type} ({self.reason}){source}" + (f" at {self.where}" if self.where else "")


class TargetError(Hlo2OnnxError):
    """The model needs ops or dtypes the target does not accept."""

    def __init__(self, target: Target, violations: list[Violation]):
        self.target, self.violations = target, violations
        counts = Counter(str(v) for v in violations)
        lines = [f"{text}" + (f" [x{n}]" if n > 1 else "") for text, n in counts.items()]
        super().__init__(f"target {target.name} cannot run {len(violations)} node(s): " + "; ".join(lines))


# Ops whose kernel dtype is not their first input's (Where's first input is the bool condition).
_TYPED_INPUT = {"Where": 1}


def _kernel_dtype(node: ir.Node) -> np.dtype | None:
    values = [v for v in node.inputs if v is not None] or list(node.outputs)
    index = _TYPED_INPUT.get(node.op_type, 0)
    value = values[index] if index < len(values) else values[0] if values else None
    return None if value is None or value.dtype is None else np.dtype(value.dtype.numpy())


def _reasons(node: ir.Node, target: Target) -> Iterable[str]:
    if host_calls.is_host_call(node):
        if target.runtime != "onnxruntime" or target.device != "cpu":
            yield "a Python host callback runs only on mnjit's ort-cpu runtime"
        return
    if node.domain not in ("", "ai.onnx"):
        yield f"custom domain {node.domain}"
        return
    if target.ops is not None and node.op_type not in target.ops:
        yield "no kernel"
        return
    if target.dtypes is not None:
        bad = sorted({np.dtype(v.dtype.numpy()).name for v in [*node.inputs, *node.outputs]
                      if v is not None and v.dtype is not None and np.dtype(v.dtype.numpy()) not in target.dtypes})
        if bad:
            yield f"dtype {', '.join(bad)} not accepted"
            return
    if target.narrowed:
        bad = sorted({np.dtype(v.dtype.numpy()).name for v in [*node.inputs, *node.outputs]
                      if v is not None and v.dtype is not None and np.dtype(v.dtype.numpy()) in target.narrowed})
        if bad:
            yield f"{', '.join(bad)} would be computed in a narrower type"
            return
    dtype, key = _kernel_dtype(node), _kernel_key(node)
    if dtype is not None and dtype in target.wrong.get(key, ()):
        yield f"wrong results for {dtype.name}"
        return
    if dtype is not None and dtype in target.refused.get(key, ()):
        yield f"no kernel for {key if ':' in key else dtype.name}"
        return
    if target.ops is not None:  # a kernel table: check the op's dtype against it
        if dtype is not None and not target.supports(node.op_type, dtype):
            yield f"no kernel for {dtype.name}"


def _kernel_key(node: ir.Node) -> str:
    """The op's key in a `wrong` table: Pad and the scatters differ by mode or reduction (`ScatterND:add`),
    casts by the dtype they make (`Cast:int64`), MaxPool by whether it pads (`MaxPool:padded`), TopK by whether its
    indices are read (`TopK:indices`), Loop
    by whether it has scan outputs (`Loop:scan`) or a condition (`Loop:while`)."""
    if node.op_type == "TopK" and len(node.outputs) > 1 and (node.outputs[1].uses()
                                                              or node.outputs[1].is_graph_output()):
        return "TopK:indices"  # the order of ties shows only in the indices
    if node.op_type == "Loop" and len(node.outputs) > len(node.inputs) - 2:
        return "Loop:scan"  # with scan outputs (values stacked per iteration) besides the carried ones
    if node.op_type == "Loop" and (node.inputs[0] is None or node.inputs[1] is not None):
        return "Loop:while"  # ended by a condition, not (only) by its trip count
    if node.op_type == "MaxPool" and any(node.attributes.get_ints("pads", ())):
        return "MaxPool:padded"  # padding of its own (IREE pads integers with 0, not the type's lowest value)
    if node.op_type == "Cast" and node.outputs[0].dtype is not None:  # keyed by the dtype it makes
        return f"Cast:{np.dtype(node.outputs[0].dtype.numpy()).name}"
    attr = node.attributes.get("mode" if node.op_type == "Pad" else "reduction")
    if node.op_type in ("Pad", "ScatterND", "ScatterElements") and attr is not None:
        return f"{node.op_type}:{attr.value}"
    return node.op_type


def validate(model: ir.Model, target: Target) -> list[Violation]:
    """Every node of `model` (subgraphs included) that `target` cannot run; empty for ORT CPU's own lowerings."""
    found: list[Violation] = []
    for value in [*model.graph.inputs, *model.graph.outputs]:
        if value.dtype is not None and np.dtype(value.dtype.numpy()) in target.boundary_narrowed | target.narrowed:
            where = "input" if value in model.graph.inputs else "output"
            found.append(Violation(f"graph {where} {value.name}", f"{np.dtype(value.dtype.numpy()).name} would be "
                                   "computed in a narrower type", None, None))
    _validate_graph(model.graph, target, (None, None), found)
    return found


def _validate_graph(graph: ir.Graph, target: Target, outer: tuple[str | None, str | None],
                    found: list[Violation]) -> None:
    """`outer`: the source of the Loop/If holding `graph`, for body nodes a rule built without metadata."""
    for node in graph:
        source = (node.metadata_props[SOURCE_OP], node.metadata_props.get(SOURCE_LOC)) \
            if SOURCE_OP in node.metadata_props else outer
        found.extend(Violation(node.op_type, reason, *source) for reason in _reasons(node, target))
        for attr in node.attributes.values():
            if attr.type == ir.AttributeType.GRAPH:
                _validate_graph(attr.value, target, source, found)
            elif attr.type == ir.AttributeType.GRAPHS:
                for sub in attr.value:
                    _validate_graph(sub, target, source, found)


def _expand_isnan(tape: Tape, x: ir.Value, graph: ir.Graph) -> ir.Value:
    return tape.op("Not", [tape.op("Equal", [x, x])])


def _expand_isinf(tape: Tape, x: ir.Value, graph: ir.Graph) -> ir.Value:
    # An initializer, not a Constant node: core (the target that expands IsInf) has no Constant op.
    name = next(f"inf_{i}" for i in itertools.count(len(graph.initializers)) if f"inf_{i}" not in graph.initializers)
    inf = ir.Value(name=name, const_value=ir.tensor(np.asarray(np.inf, x.dtype.numpy())))
    inf.type, inf.shape = ir.TensorType(x.dtype), ir.Shape([])
    graph.register_initializer(inf)
    return tape.op("Equal", [tape.op("Abs", [x]), inf])


# Exact expansions into common ops, for the ops in a target's `expanded`. Applied after fusion, so the
# fusion patterns (which look for IsNaN in max's NaN guard) still see the translator's own form.
_EXPANSIONS = {"IsNaN": _expand_isnan, "IsInf": _expand_isinf}


def legalize(model: ir.Model, target: Target) -> int:
    """Replaces ops the target lacks by their exact expansions (main graph); returns how many."""
    count = 0
    for node in list(model.graph):
        if node.op_type not in target.expanded or node.domain != "":
            continue
        expand = _EXPANSIONS[node.op_type]
        tape = Tape()
        result = expand(tape, node.inputs[0], model.graph)
        result.type, result.shape = node.outputs[0].type, node.outputs[0].shape
        for new in tape.nodes:
            new.metadata_props.update(node.metadata_props)
        model.graph.insert_before(node, tape.nodes)
        out = node.outputs[0]
        if out.is_graph_output():  # the expansion takes the output's place and its name (callers see it)
            name, out.name = out.name, None
            result.name = name
        ir.convenience.replace_all_uses_with(out, result, replace_graph_outputs=True)
        model.graph.remove(node, safe=True)
        count += 1
    return count


def enforce(model: ir.Model, target: Target) -> list[Violation]:
    """Raises TargetError for a strict target (no fallback) the model does not fit; returns the fallbacks otherwise."""
    legalize(model, target)
    violations = validate(model, target)
    if violations and target.fallback is None:
        raise TargetError(target, violations)
    return violations
