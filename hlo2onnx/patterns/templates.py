"""Patterns taken from JAX itself: the graph a function translates to, replayed as a pattern.

chlo legalization expands `erf` and `erfc` into dozens of polynomial ops whose
coefficients differ per dtype. Writing those patterns by hand would copy
XLA's constants; instead the function is lowered once per dtype on a scalar,
translated and put in canonical form, and its nodes become the pattern.
"""
from __future__ import annotations

import contextlib
from functools import lru_cache
from typing import Callable

import jax
import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern

from hlo2onnx import ops  # noqa: F401  (the rules the template's translation needs)
from hlo2onnx.loading import from_exported, quiet_context
from hlo2onnx.mlir_io import prepare
from hlo2onnx.patterns.cleanup import const_array
from hlo2onnx.patterns.folding import canonicalize
from hlo2onnx.targets import ORT_CPU
from hlo2onnx.translator import Translator

# Below this many nodes in the model no template is looked for (they cost a JAX lowering each, once).
MIN_NODES = 20
# Templates hold elementwise ops only, the same at every opset mnjit supports.
MIN_TEMPLATE_OPSET = 18


# How a function reached the translator: jax.jit's lowering (erf and erfc as chlo ops, which hlo2onnx legalizes)
# or a jax.export artifact (legalized by jax at export). From jax 0.12.1 the two expand erfc differently (the
# export's Horner steps are multiply and add, chlo's are fma), so a fusion looks for both.
SOURCES = ("jit", "export")


@lru_cache(maxsize=None)
def template(fn: Callable, dtype: str, source: str = "jit") -> ir.Graph:
    """The canonical ONNX graph of `fn` on one scalar of `dtype`, lowered as `source` lowers it."""
    spec = jax.ShapeDtypeStruct((), np.dtype(dtype))
    # A 64-bit template is lowered with x64 on whatever the caller's setting: with it off, jax would lower (and
    # this cache keep) a 32-bit graph under the 64-bit key.
    with jax.enable_x64(True) if np.dtype(dtype).itemsize == 8 else contextlib.nullcontext():
        if source == "export":
            module = prepare(from_exported(jax.export.export(jax.jit(fn))(spec), quiet_context()).module)
        else:
            module = prepare(jax.jit(fn).lower(spec).compiler_ir("stablehlo"))
    with module.context:  # the translator itself: no fusions (they would look for this very template)
        model = Translator(module, ORT_CPU, opset=MIN_TEMPLATE_OPSET).translate(graph_name="template")
    canonicalize(model)
    return model.graph


@lru_cache(maxsize=None)
def sources(fn: Callable, dtype: str) -> tuple[str, ...]:
    """The SOURCES whose templates of `fn` differ (one where this jax lowers both alike)."""
    distinct: dict[tuple, str] = {}
    for source in SOURCES:
        distinct.setdefault(_shape_of(template(fn, dtype, source)), source)
    return tuple(distinct.values())


def _shape_of(graph: ir.Graph) -> tuple:
    """A graph's nodes and constants, as replay reads them: equal for templates that match the same nodes."""
    index = {value: i for i, value in enumerate(graph.inputs)}
    shape = []
    for node in graph:
        index.update((value, len(index)) for value in node.outputs)
        args = tuple(index[v] if v in index else float(const_array(v).reshape(())) for v in node.inputs)
        shape.append((node.op_type, args, tuple(sorted((k, str(a.value)) for k, a in node.attributes.items()))))
    return tuple(shape)


def replay(graph: ir.Graph, op, *inputs):
    """Builds `graph` again with the pattern builder `op`; constants become value patterns."""
    env: dict[ir.Value, object] = dict(zip(graph.inputs, inputs))
    for node in graph:
        args = []
        for value in node.inputs:
            if value in env:
                args.append(env[value])
                continue
            array = const_array(value)
            if array is None or array.size != 1:
                raise ValueError(f"template input {value.name} is neither an input nor a scalar constant")
            args.append(pattern.Constant(array.reshape(()).item()))
        attrs = {name: attr.value for name, attr in node.attributes.items()}
        outputs = getattr(op, node.op_type)(*args, _outputs=len(node.outputs), **attrs)
        outputs = outputs if isinstance(outputs, (list, tuple)) else [outputs]
        env.update(zip(node.outputs, outputs))
    return env[graph.outputs[0]]
