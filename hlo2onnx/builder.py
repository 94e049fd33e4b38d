"""Emits ONNX nodes into an onnx-ir graph.

Rules build through this class only: it names initializers, deduplicates
small constants and applies the target's dtype table (`typed`).
"""
from __future__ import annotations

from typing import Sequence

import ml_dtypes
import numpy as np
import onnx_ir as ir

from hlo2onnx.targets import Target
from hlo2onnx.types import FLOAT8, TensorType, onnx_dtype, set_type

# Constants up to this many elements are shared between uses.
_DEDUP_LIMIT = 16
# Ops whose answer depends on their inputs' order. uint64 has no wider type, so where ORT lacks the uint64
# kernel they run in int64, whose order differs past 2**63 (max([1, 2**64 - 1]) would be 1): `typed` flips
# the top bit around them, which maps uint64 order onto int64 order.
_ORDER_OPS = frozenset({"ReduceMax", "ReduceMin", "ArgMax", "ArgMin", "TopK", "MaxPool"})
_TOP_BIT = np.uint64(1 << 63)
_BF16 = np.dtype(ml_dtypes.bfloat16)
# The elementwise ops whose bf16 results XLA's CPU loop fusions keep in float32 when only converted back
# (`unrounded`); dots, reductions and the like write bf16 (measured: a bf16 matmul's .astype(f32) is rounded).
_FUSED_ELEMENTWISE = frozenset("""Add Sub Mul Div Pow Neg Abs Exp Log Sqrt Reciprocal Tanh Sin Cos Tan Erf Atan
    Asin Acos Sinh Cosh Asinh Acosh Atanh Floor Ceil Round Sigmoid Max Min Sign Where Mod Relu Clip""".split())


def _has_zero_size(shape: ir.Value | None) -> bool:
    tensor = shape.const_value if shape is not None else None
    return tensor is not None and 0 in tensor.numpy().reshape(-1).tolist()


def _attributes(attrs: dict) -> list[ir.Attr]:
    """ir.convenience.convert_attributes, faster for the plain ints, floats, strings and int lists rules pass
    (it tells a list from a graph or tensor with isinstance checks against protocols, ~20 us per attribute);
    anything else is left to it, so every attribute gets the type it would give."""
    converted = []
    for name, value in attrs.items():
        kind = type(value)
        if kind is int:
            converted.append(ir.AttrInt64(name, value))
        elif kind is float:
            converted.append(ir.AttrFloat32(name, value))
        elif kind is str:
            converted.append(ir.AttrString(name, value))
        elif (kind is list or kind is tuple) and value and all(type(x) is int for x in value):
            converted.append(ir.AttrInt64s(name, value))
        else:
            converted.append(ir.convenience.convert_attribute(name, value))
    return converted


class Builder:
    def __init__(self, graph: ir.Graph, target: Target, root: "Builder | None" = None):
        self.graph = graph
        self.target = target
        # Initializers always live in the root graph (ONNX subgraphs may read outer values).
        self._root = root or self
        self._consts: dict[tuple, ir.Value] = {}
        self._counter = 0
        # bf16 results computed in float32, by id, with that float32 value (see `unrounded`).
        self._unrounded: dict[int, tuple[ir.Value, ir.Value]] = {}

    @property
    def opset(self) -> int:
        """The model's default-domain opset (rules whose best form needs a newer op ask it)."""
        return self._root.graph.opset_imports.get("", 0)

    # -- nodes ---------------------------------------------------------------
    def op(self, op_type: str, *inputs: ir.Value | None, **attrs) -> ir.Value:
        if op_type == "Reshape" and "allowzero" not in attrs and _has_zero_size(inputs[1]):
            # Rules spell sizes literally: a 0 is an empty axis, not ONNX's default "copy the input's dim".
            # ONNX forbids allowzero next to a -1, which would be ambiguous on an empty tensor anyway.
            if -1 in inputs[1].const_value.numpy().reshape(-1).tolist():
                raise NotImplementedError("reshape to a 0-size shape with a dynamic dimension")
            attrs["allowzero"] = 1
        return ir.Node("", op_type, inputs, _attributes(attrs), graph=self.graph).outputs[0]

    def ops(self, op_type: str, *inputs: ir.Value | None, num_outputs: int, domain: str = "",
            **attrs) -> Sequence[ir.Value]:
        return ir.Node(domain, op_type, inputs, _attributes(attrs), num_outputs=num_outputs, graph=self.graph).outputs

    def typed(self, op_type: str, *inputs: ir.Value, dtype: np.dtype, result_dtype: np.dtype | None = None,
              cast: Sequence[int] | None = None, **attrs) -> ir.Value:
        """`op_type` on inputs of `dtype`, run in a wider dtype if the target lacks the kernel.

        `result_dtype` is the op's own output dtype when it differs from the
        inputs' (ArgMax, Less); `cast` lists the inputs of `dtype` when not all are.
        """
        compute = self.target.compute_dtype(op_type, dtype)
        if compute == np.dtype(dtype):
            return self.op(op_type, *inputs, **attrs)
        positions = range(len(inputs)) if cast is None else cast
        if op_type in _ORDER_OPS and dtype == np.uint64:
            flipped = [self.cast(self.op("BitwiseXor", x, self.const(_TOP_BIT)), compute) if i in positions else x
                       for i, x in enumerate(inputs)]
            result = self.op(op_type, *flipped, **attrs)
            return result if result_dtype is not None else self.op("BitwiseXor", self.cast(result, dtype),
                                                                    self.const(_TOP_BIT))
        widened = [self.cast(x, compute) if i in positions else x for i, x in enumerate(inputs)]
        result = self.op(op_type, *widened, **attrs)
        if result_dtype is not None:
            return result
        if op_type in _FUSED_ELEMENTWISE and compute == np.float32:
            return self.narrow(result, dtype)
        return self.cast(result, dtype)

    def narrow(self, wide: ir.Value, dtype: np.dtype) -> ir.Value:
        """An elementwise result computed in float32 (`wide`), rounded to `dtype`; for bf16 the float32 value
        stays known to `unrounded`."""
        rounded = self.cast(wide, dtype)
        if np.dtype(dtype) == _BF16:
            self._root._unrounded[id(rounded)] = (rounded, wide)
        return rounded

    def unrounded(self, x: ir.Value) -> ir.Value | None:
        """The float32 value a bf16 result was rounded from, where `typed` computed it in float32; else None.
        XLA's CPU compiler computes bf16 arithmetic in float32 too and, allowing excess precision, drops the
        rounding when the result is only converted back to float32: (a * b).astype(f32) on bf16 a, b is the
        float32 product there (it rounds an explicit f32 -> bf16 -> f32 and results kept as bf16)."""
        entry = self._root._unrounded.get(id(x))
        return entry[1] if entry is not None and entry[0] is x else None

    def cast(self, x: ir.Value, dtype: np.dtype) -> ir.Value:
        if x.dtype is not None and x.dtype == onnx_dtype(dtype):
            return x
        if np.dtype(dtype) in FLOAT8:  # overflow is inf or NaN
            return self.op("Cast", x, to=onnx_dtype(dtype), saturate=0)  # in XLA, not ONNX's default largest
        return self.op("Cast", x, to=onnx_dtype(dtype))

    # -- constants -----------------------------------------------------------
    def const(self, value, dtype: np.dtype | None = None) -> ir.Value:
        """An initializer holding `value`; the numpy buffer is wrapped, not copied."""
        array = np.asarray(value, dtype=dtype)
        key = None
        if array.size <= _DEDUP_LIMIT:
            key = (array.dtype.str, array.shape, array.tobytes())
            cached = self._root._consts.get(key)
            if cached is not None:
                return cached
        value = self._root._new_initializer(array)
        if key is not None:
            self._root._consts[key] = value
        return value

    def weight(self, array: np.ndarray, ttype: TensorType) -> ir.Value:
        """An initializer holding `array` as a value of `ttype` (complex as its trailing (real, imag) pairs):
        wrapped in place, copied only where its dtype or layout differs from the graph's."""
        if tuple(array.shape) != ttype.shape:
            raise ValueError(f"a constant of shape {array.shape} where the module expects {ttype.shape}")
        array = np.ascontiguousarray(array.astype(ttype.dtype, copy=False))
        storage = ttype.storage
        if storage is ttype and _is_uniform(array):
            # As an embedded splat constant is: never stored densely, and the rewrites that fold a broadcast
            # value apply (a sum of np.ones(n) * x is n * x, as XLA computes it, not n float32 additions).
            return self.splat(array.reshape(-1)[0], array.dtype, array.shape)
        if storage is not ttype:
            array = array.reshape(ttype.shape + (1,)).view(storage.dtype)
        return self.const(array)

    def shape_const(self, dims: Sequence[int]) -> ir.Value:
        return self.const(np.asarray(dims, dtype=np.int64))

    def splat(self, scalar, dtype: np.dtype, shape: Sequence[int]) -> ir.Value:
        """A constant filled with one value, never stored densely."""
        if len(shape) == 0:
            return self.const(scalar, dtype)
        fill = ir.tensor(np.asarray([scalar], dtype=dtype))
        return self.op("ConstantOfShape", self.shape_const(shape), value=fill)

    def _new_initializer(self, array: np.ndarray) -> ir.Value:
        self._counter += 1
        tensor = ir.Tensor(array, name=f"const_{self._counter}")
        value = ir.Value(name=tensor.name, shape=ir.Shape(array.shape), type=ir.TensorType(tensor.dtype),
                         const_value=tensor)
        self.graph.register_initializer(value)
        return value

    # -- subgraphs -------------------------------------------------------------
    def subgraph(self, name: str) -> "Builder":
        """A builder for a Loop/If body; its constants go to the root graph.

        The graph's name is unique in the model, so its values can be named after it.
        """
        self._root._counter += 1
        graph = ir.Graph([], [], nodes=[], name=f"{name}_{self._root._counter}")
        return Builder(graph, self.target, root=self._root)

    # -- subgraphs (Loop and If bodies) ------------------------------------------------------------------
    def finish_subgraph(self, inputs: Sequence[ir.Value], outputs: Sequence[ir.Value],
                        types: Sequence[TensorType]) -> ir.Graph:
        """Sets this (body) builder's graph signature and returns the graph.

        Outputs that are not distinct values computed in this graph (or its inputs) pass through an Identity.
        """
        final: list[ir.Value] = []
        for value, ttype in zip(outputs, types):
            producer = value.producer()
            outside = producer is not None and producer.graph is not self.graph
            if (producer is None and value not in inputs) or outside or value in final:
                value = self.op("Identity", value)
            set_type(value, ttype)
            final.append(value)
        self.graph.inputs.extend(inputs)
        self.graph.outputs.extend(final)
        # Each graph's own namer restarts at val_0; ONNX wants names unique across the model's scopes.
        # Nested subgraphs were renamed when they were finished.
        values = [*inputs, *(out for node in self.graph for out in node.outputs)]
        for i, value in enumerate(values):
            value.name = f"{self.graph.name}/{i}"
        return self.graph


def _is_uniform(array: np.ndarray, chunk: int = 1 << 20) -> bool:
    """Whether every element of `array` has the first one's bits; read a chunk at a time, so that a large
    constant costs no temporary of its size and a non-uniform one is usually told from its first chunk."""
    if array.size <= 1:
        return array.size == 1
    bits = array.reshape(-1).view(f"u{array.dtype.itemsize}") if array.dtype.itemsize in (1, 2, 4, 8) else None
    if bits is None:
        return False
    first = bits[0]
    return all((bits[start:start + chunk] == first).all() for start in range(0, bits.size, chunk))


def graph_input(ttype: TensorType) -> ir.Value:
    """A fresh subgraph input of type `ttype` (for Builder.finish_subgraph)."""
    value = ir.Value()
    set_type(value, ttype)
    return value
