"""The `iree-cpu` and `iree-cuda` targets: what IREE's ONNX importer and llvm-cpu backend cannot take, and the
exact rewrites that let it compile the rest (targets/iree_rewrite.py).

Measured with iree-base-compiler/iree-base-runtime 3.13 at opset 21: every (op, dtype) of the op tables'
models as a one-node model through the importer and `iree-compile --compile-to=input`, then the op tables
on the target (tests/test_iree.py):

- Casts to int16, uint16, uint32 and uint64 are not legalized (torch-mlir's ONNX conversion has no such
  torch dtypes), so those dtypes are refused wherever they appear; int16 and unsigned arithmetic inside a
  graph is widened to int32/int64 by the rules (targets.WIDER), as for ORT's missing kernels.
- `Loop` with scan outputs (lax.scan's stacked ys, a fori_loop writing every row) is not legalized; the
  while rule keeps such buffers as carried values instead (ops/control/control_flow.py), which compile when the rows
  are not scalars. A Loop
  ended by a condition (a while loop) is not either without a trip count, and with 2**63 - 1 as its trip
  count it ran away (memory grew past 12 GB). Loops with a trip count and no condition (fori_loop) compile,
  once targets/iree_rewrite.py gives them a constant true condition. fallback=True runs the refused loops on
  ort-cpu.
- float64 Sin, Cos, Tan, Tanh, Atan, Asin and Acos do not link (iree-lld: undefined symbol: sin: the CPU
  backend has no f64 libm), and f64 Erf is not legalized; rules without another lowering refuse them.
- float Sin, Cos and Tan are polynomial approximations without full range reduction: off by 1e-4 at |x| ~ 5e3 and
  -inf at 1e30 (XLA: -0.61). float Pow is exp(y log x): NaN for every negative base (even (-2)**3), for 0**0 and
  NaN**0 and 1**inf. float Mod (fmod) gives NaN for x % inf (XLA: x) and the wrong sign for -1e4 % 1e-3. Refused in
  every float dtype: stablehlo.remainder then takes its exact expansion (ops/elementwise/fmod.py), and a power by a
  constant 0, 1, 2 or -1 needs no Pow (ops/elementwise/arithmetic.py).
- uint8 Abs, Div, Mod, Clip, TopK and MaxPool compute as int8 (200 // 5 came back 245, Abs(200) 56, a sort put
  128..255 first, a max-pool of 200 and 5 gave 5), with no error: refused, so the rules widen them to int32
  (exact: uint8 values fit) or, without a wider form, the target names them. Elementwise Max/Min,
  comparisons, ArgMax/ArgMin, ReduceMax/Min, casts and right shifts of uint8 are right (measured with values
  past 127: tests/test_iree.py). A MaxPool's own padding is 0 for int8 and int32, not the lowest value
  (a cummax of negatives started at 0; int64 is right): the pool rule pads such inputs itself.
- Gelu(approximate="tanh") is off by up to 3.4e-3 relative on f32 (jax.nn.gelu's default form, on
  linspace(-4, 4)); refused, so that form stays Tanh and arithmetic, which is exact. The erf form is right.
- `ConvTranspose` (input-dilated convolutions take the dilate-and-Conv lowering instead), `DFT` (FFTs fall
  back), and ScatterElements with reduction max/min are not legalized (on floats; on integers where the
  operand is 1-d: refused in every dtype).
"""
from __future__ import annotations

from dataclasses import replace

from hlo2onnx.targets import ort
from hlo2onnx.targets.iree_rewrite import rewrite_for_iree
from hlo2onnx.targets.profile import Target, parse_dtypes

# iree-compile's flags that every model for these targets needs: IREE's ONNX input pipeline demotes f64 to f32
# and i64 to i32 by default (an f64 Add came back as f32 bytes; the sort rule's f64 keys, clipped to just past
# f32's range, then tied -inf with f32's lowest). Each model records them under COMPILE_FLAGS_KEY.
COMPILE_FLAGS = ("--iree-input-demote-f64-to-f32=false", "--iree-input-demote-i64-to-i32=false")
COMPILE_FLAGS_KEY = "hlo2onnx.iree-compile-flags"

_EVERY = "bool int8 int16 int32 int64 uint8 uint16 uint32 uint64 float16 bfloat16 float32 float64"
_FLOATS = "float16 bfloat16 float32 float64"

DTYPES = "bool int8 int32 int64 uint8 float16 bfloat16 float32 float64"

# op (or "op:mode") -> dtypes the target refuses.
REFUSED: dict[str, str] = {
    "Loop:scan": _EVERY,
    "Loop:while": _EVERY,
    "ConvTranspose": _EVERY,
    "DFT": _EVERY,
    "ScatterElements:max": _EVERY,
    "ScatterElements:min": _EVERY,
    **{op: "float64" for op in ("Tanh", "Erf", "Atan", "Asin", "Acos")},
    **{op: _FLOATS for op in ("Sin", "Cos", "Tan", "Pow")},
    "Mod": _FLOATS + " uint8",
    **{op: "uint8" for op in ("Abs", "Div", "Clip", "TopK", "MaxPool")},
    "Gelu:tanh": _FLOATS,
    "MaxPool:padded": "int8 int32 uint8",
}


IREE_CPU = Target(
    "iree-cpu",
    # ORT CPU's kernel table keeps the lowerings on paths the op tables test (f16 through f32, no bf16 math).
    dict(ort.ORT_CPU.missing),
    dtypes=parse_dtypes(DTYPES),
    refused={op: parse_dtypes(spec) for op, spec in REFUSED.items()},
    flushes_subnormals=True,  # measured: 1e-39 * 1.5 and reduce_precision(1e-39, 8, 23) gave 0
    fuses_broadcasts=True,
    rewrites=(rewrite_for_iree,),
    metadata={COMPILE_FLAGS_KEY: " ".join(COMPILE_FLAGS)},
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
