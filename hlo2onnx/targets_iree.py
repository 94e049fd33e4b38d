"""The data of the `iree-cpu` target (built in targets.py): what IREE's ONNX importer and llvm-cpu backend
cannot take.

Measured with iree-base-compiler/iree-base-runtime 3.13 at opset 21: every (op, dtype) of the op tables'
models as a one-node model through the importer and `iree-compile --compile-to=input`, then the op tables
on the target (tests/test_iree.py):

- Casts to int16, uint16, uint32 and uint64 are not legalized (torch-mlir's ONNX conversion has no such
  torch dtypes), so those dtypes are refused wherever they appear; int16 and unsigned arithmetic inside a
  graph is widened to int32/int64 by the rules (targets.WIDER), as for ORT's missing kernels.
- `Loop` with scan outputs (lax.scan's stacked ys, a fori_loop writing every row) is not legalized; the
  while rule keeps such buffers as carried values instead (ops/control_flow.py), which compile when the rows
  are not scalars. A Loop
  ended by a condition (a while loop) is not either without a trip count, and with 2**63 - 1 as its trip
  count it ran away (memory grew past 12 GB). Loops with a trip count and no condition (fori_loop) compile,
  once mnjit/iree_rewrite.py gives them a constant true condition. fallback=True runs the refused loops on
  ort-cpu.
- float64 Sin, Cos, Tan, Tanh, Atan, Asin and Acos do not link (iree-lld: undefined symbol: sin: the CPU
  backend has no f64 libm), and f64 Erf is not legalized; rules without another lowering refuse them.
- float Sin, Cos and Tan are polynomial approximations without full range reduction: off by 1e-4 at
  |x| ~ 5e3 and -inf at 1e30 (XLA: -0.61). float Pow is exp(y log x): NaN for every negative base (even
  (-2)**3), for 0**0 and NaN**0 and 1**inf. float Mod (fmod) gives NaN for x % inf (XLA: x) and the
  wrong sign for -1e4 % 1e-3. Refused in every float dtype: stablehlo.remainder then takes its exact
  expansion (ops/fmod.py), and a power by a constant 0, 1, 2 or -1 needs no Pow (ops/elementwise.py).
- uint8 Abs, Div, Mod, Clip, TopK and MaxPool compute as int8 (200 // 5 came back 245, Abs(200) 56, a sort put
  128..255 first, a max-pool of 200 and 5 gave 5), with no error: refused, so the rules widen them to int32
  (exact: uint8 values fit) or, without a wider form, the target names them. Elementwise Max/Min,
  comparisons, ArgMax/ArgMin, ReduceMax/Min, casts and right shifts of uint8 are right (measured with values
  past 127: tests/test_iree.py). A MaxPool's own padding is 0 for int8 and int32, not the lowest value
  (a cummax of negatives started at 0; int64 is right): the pool rule pads such inputs itself.
- `ConvTranspose` (input-dilated convolutions take the dilate-and-Conv lowering instead), `DFT` (FFTs fall
  back), and ScatterElements with reduction max/min are not legalized (on floats; on integers where the
  operand is 1-d: refused in every dtype).
"""
from __future__ import annotations

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
    "MaxPool:padded": "int8 int32 uint8",
}
