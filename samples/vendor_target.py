"""A vendor's own target, declared outside hlo2onnx: an accelerator compiler that takes ONNX (an in-house NPU,
say) with a restricted op set, float16 only, static shapes, and one fused op of its own.

    python samples/vendor_target.py --check
    hlo2onnx model.bin --target vendor_target:NPU      # from samples/ (or with it on PYTHONPATH)
    mnjit(f, target=NPU)

What it shows (docs/extending.md explains each part):

1. The target: `hlo2onnx.targets.declare` with the ops and dtypes the compiler takes, its opset, static
   shapes, a fusion mapping MatMul + Add + Relu to its own `com.example.npu.DenseRelu`, and that op's
   definition as an ONNX function, which the model carries so that any ONNX runtime can check it.
2. A custom call of the user's own (`hlo2onnx.register_custom_call`): a JAX FFI call that ONNX has no op for,
   translated by a rule.
3. A dense layer converted for it: the fused op is in the model, and ONNX Runtime's result matches jax.jit.
4. What is refused, by name: a sine (not in its op table), a float32 model (not in its dtypes), a
   symbolic batch size (not static).
5. What falls back: under mnjit with `fallback=True`, the refused sine runs in jax.jit and the rest in
   the target's runtime (here ONNX Runtime, which runs the function).
"""
from __future__ import annotations

import argparse
import sys

import jax
import jax.numpy as jnp
import numpy as np
import onnxruntime as ort
from jax import export
from onnx import helper
from onnxscript.rewriter import pattern

import hlo2onnx
from hlo2onnx import targets
from mnjit import mnjit

DOMAIN = "com.example.npu"

# The NPU's fused layer, defined in ONNX for whoever runs the model without the NPU (ONNX Runtime inlines it).
DENSE_RELU = helper.make_function(
    DOMAIN, "DenseRelu", ["x", "w", "b"], ["y"],
    [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["z"]),
     helper.make_node("Relu", ["z"], ["y"])],
    opset_imports=[helper.make_opsetid("", 21)])


def _dense_relu(op, x, w, b):
    return op.Relu(op.Add(op.MatMul(x, w), b))


def _fused(op, x, w, b):
    return op.DenseRelu(x, w, b, _domain=DOMAIN)


NPU = targets.declare(
    "example-npu",
    ops="Add Sub Mul Div MatMul Relu Max Min Reshape Transpose Concat Slice Gather Cast Squeeze Unsqueeze "
        "Identity Where IsNaN Equal Not Expand".split(),
    dtypes=["float16", "int64", "bool"],  # int64 for shapes and indices, bool for masks
    opset=21,
    fusions=[pattern.RewriteRule(_dense_relu, _fused)],
    custom_ops={DOMAIN: ["DenseRelu"]},
    functions=[DENSE_RELU],
    static_shapes=True,
    description="an example NPU compiler: f16, static shapes, a fused DenseRelu")


# -- a custom call of the user's own ------------------------------------------------------------------------
# `example_scale` stands for a vendor kernel a JAX program reaches through jax.ffi; the rule writes it in ONNX
# ops the target takes (its inputs arrive as onnx_ir values, its backend_config entries as keyword arguments).
@hlo2onnx.register_custom_call("example_scale")
def _example_scale(ctx, x, **_config):
    two = ctx.b.splat(2, ctx.in_types[0].dtype, ())
    return ctx.b.op("Mul", x, two)


def scaled(x):
    """2 * x through the custom call (jax.ffi.ffi_call lowers it; no CPU implementation is needed to convert)."""
    return jax.ffi.ffi_call("example_scale", jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


def layer(x, w, b):
    return jax.nn.relu(x @ w + b)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare each model with jax.jit on ORT")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 8)).astype(np.float16)
    w = (rng.standard_normal((8, 16)) / 3).astype(np.float16)
    b = rng.standard_normal(16).astype(np.float16)
    ok = True

    # 3. The layer, converted for the NPU: one fused node.
    conversion = hlo2onnx.convert(jax.jit(layer).lower(x, w, b), target=NPU)
    proto = conversion.to_proto()
    print("NPU model:", [f"{n.domain + '.' if n.domain else ''}{n.op_type}" for n in proto.graph.node],
          "| functions:", [f.name for f in proto.functions])
    ok &= [n.op_type for n in proto.graph.node if n.domain == DOMAIN] == ["DenseRelu"]
    if args.check:
        got = ort.InferenceSession(proto.SerializeToString()).run(None, dict(zip(
            [i.name for i in proto.graph.input], (x, w, b))))[0]
        want = np.asarray(jax.jit(layer)(x, w, b))
        close = np.allclose(got.astype(np.float32), want.astype(np.float32), rtol=1e-2, atol=1e-2)
        print(f"ORT vs jax.jit: largest difference {np.abs(got.astype(np.float32) - want).max():.2e}")
        ok &= close

    # 2. The custom call, through the rule registered above.
    scaled_model = hlo2onnx.translate(jax.jit(scaled).lower(x), target=NPU)
    print("custom call model:", [n.op_type for n in scaled_model.graph])

    # 4. Refused, by name.
    for what, fun, example in (("a sine", jnp.sin, x), ("float32", lambda v: v * 2, x.astype(np.float32))):
        try:
            hlo2onnx.convert(jax.jit(fun).lower(example), target=NPU)
            print(f"{what}: not refused")
            ok = False
        except hlo2onnx.Hlo2OnnxError as e:  # TargetError, or UnsupportedOpError where no rule fits the target
            print(f"{what} refused: {e}")
    batch = export.symbolic_shape("n, 8")
    exported = export.export(jax.jit(layer))(jax.ShapeDtypeStruct(batch, np.float16), w, b)
    try:
        hlo2onnx.convert(exported, target=NPU, dynamic=True)
        print("a symbolic batch: not refused")
        ok = False
    except targets.TargetError as e:
        print(f"a symbolic batch refused: {e}")

    # 5. Falls back: the sine runs in jax.jit, the layer on the target's runtime.
    def with_sine(x, w, b):
        return jnp.sin(layer(x, w, b))

    got = np.asarray(mnjit(with_sine, target=NPU, fallback=True)(x, w, b))
    want = np.asarray(jax.jit(with_sine)(x, w, b))
    print(f"mnjit(fallback=True) vs jax.jit: largest difference "
          f"{np.abs(got.astype(np.float32) - want.astype(np.float32)).max():.2e}")
    if args.check:
        ok &= np.allclose(got.astype(np.float32), want.astype(np.float32), rtol=1e-2, atol=1e-2)
        print("OK: matches jax.jit" if ok else "FAIL: see above")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
