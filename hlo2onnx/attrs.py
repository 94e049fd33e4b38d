"""MLIR attributes -> Python values for rule keyword arguments.

Builtin attributes arrive already downcast by the bindings; StableHLO's own
attributes arrive as plain `ir.Attribute` and are cast by name here, once.
"""
from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

from jax.extend.mlir import ir
from jax.extend.mlir.dialects import stablehlo

_DIALECT_DECODERS = {
    "comparison_direction": lambda a: stablehlo.ComparisonDirectionAttr(a).value,
    "compare_type": lambda a: stablehlo.ComparisonTypeAttr(a).value,
    "dot_dimension_numbers": stablehlo.DotDimensionNumbers,
    "dimension_numbers": lambda a: a,  # gather/scatter/conv: the rule casts
}
# Hints that do not change the result on ONNX Runtime, and the memory layouts XLA HLO text carries
# (`{0,1}`: column-major), which XLA's importer leaves on ops as `result_layout` and `xla_shape`.
_IGNORED = frozenset({"precision_config", "result_accuracy", "algorithm", "result_layout", "xla_shape"})

_ARRAY_ATTRS = (ir.DenseI64ArrayAttr, ir.DenseI32ArrayAttr, ir.DenseBoolArrayAttr)


def decode(name: str, attr: ir.Attribute) -> Any:
    decoder = _DIALECT_DECODERS.get(name)
    if decoder is not None:
        return decoder(attr)
    if isinstance(attr, _ARRAY_ATTRS):
        return tuple(attr)
    if isinstance(attr, ir.BoolAttr):
        return bool(attr.value)
    if isinstance(attr, ir.IntegerAttr):
        return int(attr.value)
    if isinstance(attr, ir.FloatAttr):
        return float(attr.value)
    if isinstance(attr, (ir.StringAttr, ir.FlatSymbolRefAttr)):
        return attr.value
    if isinstance(attr, ir.ArrayAttr):
        return [decode(name, a) for a in attr]
    return attr  # dense elements and other attributes the rule reads itself


# Read by the rule itself: complex `value` attributes must not be touched
# through the generic path (reading them can abort the process).
_LEFT_TO_RULE = frozenset({"value"})


def decode_all(op: ir.Operation) -> dict[str, Any]:
    # Names with a dot are discardable attributes (MLIR prefixes them with their dialect: mhlo.sharding,
    # mhlo.frontend_attributes, jax.*, other producers' hints): none changes the op's value, and a rule's
    # keyword arguments are the op's own attributes.
    attributes = op.attributes
    return {name: decode(name, attributes[name]) for name in attributes
            if name not in _LEFT_TO_RULE and name not in _IGNORED and "." not in name}


@functools.lru_cache(maxsize=None)
def _keywords(rule: Callable) -> frozenset[str] | None:
    """The keyword arguments `rule` takes; None when it takes any (**attributes)."""
    parameters = inspect.signature(rule).parameters.values()
    if any(p.kind == p.VAR_KEYWORD for p in parameters):
        return None
    return frozenset(p.name for p in parameters if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD))


def unknown(rule: Callable, attributes: dict[str, Any]) -> list[str]:
    """The attributes `rule` has no parameter for (an op written by hand or another producer): refused by name,
    where calling the rule would be a TypeError."""
    if not attributes:  # most ops (elementwise arithmetic): nothing to look up, on every op translated
        return []
    keywords = _keywords(rule)
    return [] if keywords is None else sorted(set(attributes) - keywords)
