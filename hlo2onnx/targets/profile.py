"""A target's profile: the ONNX ops and dtypes its consumer accepts, how rules pick a dtype inside it, the
exact rewrites its runtime needs, and what the runtime promises where the ONNX spec is silent.

Rules never special-case a runtime. They ask `Target.compute_dtype(op, dtype)`
which dtype to run an ONNX op in; when the runtime lacks the kernel, the
answer is a wider dtype and the builder casts around the op. The built-in
profiles are in targets/ort.py, targets/openvino.py and targets/iree.py; a
user declares one with `hlo2onnx.targets.declare` (docs/extending.md).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

import ml_dtypes
import numpy as np
import onnx

from hlo2onnx.types import FLOAT8

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = {n: np.dtype(n) for n in ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                                "uint64", "float16", "float32", "float64")}
DTYPES["bfloat16"] = BF16

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


# Data movement that ORT CPU runs in bf16 too (measured; Expand, Tile, Pad, Where, Equal do not).
DATA_MOVEMENT = frozenset({"Identity", "Reshape", "Transpose", "Concat", "Slice", "Gather", "Cast", "Squeeze",
                           "Unsqueeze", "Shape", "Size", "ConstantOfShape", "Flatten", "Split", "GatherND",
                           "GatherElements", "BitCast"})

# An exact rewrite: takes the finished model, changes it in place (subgraphs included) into one with the same
# values that the runtime computes as the model says, and returns whether it changed anything.
Rewrite = Callable[[onnx.ModelProto], bool]


def parse_dtypes(spec: str) -> frozenset[np.dtype]:
    """The dtypes named in `spec`, separated by spaces ("float16 float32")."""
    return frozenset(DTYPES[name] for name in spec.split())


@dataclass(frozen=True, repr=False)
class Target:
    """A runtime's op subset. `missing` maps an ONNX op to dtypes it cannot run.

    Profiles for other backends also name the only ops
    and dtypes they accept (`ops`, `dtypes`; None: any), the target that runs
    what they cannot (`fallback`: ORT's CPU provider behind its CUDA one), and
    ops they lack but take in expanded form (`expanded`: IsNaN as x != x).

    A target also says where mnjit runs the model: the `runtime` package
    (`onnxruntime`, `openvino` or `iree`), its execution `providers` in order of
    preference, and the jax `device` platform its arrays live on; a declared target may name its own
    `runner` instead (mnjit calls it as `runner(model_bytes, in_avals, out_avals)` and then the result's
    `run(leaves)`), and options per execution provider (`provider_options`).

    What the pipeline does for it after optimization (hlo2onnx/pipeline.py), so that every front end writes
    the same model: Max, Min, Clip and Relu on floats get a NaN guard unless `propagates_nan` (ONNX leaves
    their NaN undefined), then each of `rewrites` runs, in order.
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
    # The runtime multiplies constants of a chain of Muls together first (OpenVINO: x * 2^127 * 2^127 became
    # x * inf, NaN for x = 0): lowerings that scale twice to overflow take another form.
    folds_constant_products: bool = False
    # The runtime's compiler fuses a broadcast into the loop of the op that reads it (IREE): the patterns that
    # materialize broadcasts for ORT's kernels (patterns/last_axis.py) only add copies there.
    fuses_broadcasts: bool = False
    # The runtime's float Max, Min, Clip and Relu return NaN where an operand is NaN (as XLA does). ONNX does
    # not say (Clip and Relu are defined through Max and Min): elsewhere the pipeline guards them.
    propagates_nan: bool = False
    # Exact rewrites of the finished model, in order (Rewrite: in place on the proto).
    rewrites: tuple[Rewrite, ...] = ()
    # The opset the consumer reads; None: the caller's (DEFAULT_OPSET unless given).
    opset: int | None = None
    # mnjit's runner for a declared target (see above); None: the one for `runtime`.
    runner: Callable | None = None
    # ONNX Runtime options per provider in `providers` (the same order), for a declared target.
    provider_options: tuple[Mapping[str, str], ...] = ()
    # A consumer's own fusions (onnxscript rewrite rules), applied after the built-in ones, before the NaN guards.
    fusions: tuple = ()
    # The consumer's own ops, by domain ({"com.vendor": {"DenseRelu"}}): accepted by the check; and ONNX functions
    # defining any of them, added to each model that uses one (so that any ONNX runtime can run it).
    custom_ops: Mapping[str, frozenset[str]] = field(default_factory=dict)
    functions: tuple[onnx.FunctionProto, ...] = ()
    # The consumer takes static shapes only: a model input or output with a symbolic dim is refused.
    static_shapes: bool = False
    # What the consumer must be told to compute the model as written (IREE's compile flags), recorded in every
    # model's metadata_props for this target.
    metadata: Mapping[str, str] = field(default_factory=dict)

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
        if dtype == BF16 and not self.bf16_compute and op_type not in DATA_MOVEMENT:
            return False
        if dtype in FLOAT8 and op_type not in DATA_MOVEMENT:
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
                                              f"(measured: hlo2onnx/targets/)")
                return candidate
        if self.fallback is not None:
            return self.fallback.compute_dtype(op_type, dtype)
        raise NotImplementedError(f"{self.name} has no {op_type} kernel for {dtype} nor a wider type")

