"""The one table of translation rules, keyed by StableHLO op name.

A rule is `rule(ctx, *inputs, **attrs) -> Value | Sequence[Value]`, with the
op's attributes decoded to Python values (see attrs.py). It raises
NotImplementedError for a form it does not handle; the translator turns that
into an UnsupportedOpError naming the op and source line.
"""
from __future__ import annotations

from typing import Callable, Sequence

import onnx_ir as ir

Rule = Callable[..., "ir.Value | Sequence[ir.Value]"]
RULES: dict[str, Rule] = {}
# stablehlo.custom_call dispatches on its call_target_name through this second
# table: `rule(ctx, *inputs, **backend_config)`, with the entries of the op's
# `mhlo.backend_config` dictionary decoded like attributes (LAPACK's uplo,
# side, ... arrive as the ints of their character codes).
CUSTOM_CALLS: dict[str, Rule] = {}
# Custom call targets whose rules are correct on dynamic dims.
CUSTOM_DYNAMIC_OK: set[str] = set()

# Rules for ops with a complex operand or result, which the graph holds as float
# (real, imag) pairs (TensorType.storage). The translator looks here, and only
# here, whenever an op touches a complex type (see ops/complex/).
COMPLEX_RULES: dict[str, Rule] = {}
# Ops whose rules read no static dim (or handle dynamic dims themselves). The
# translator rejects any other op that sees a dynamic dim, rather than let a
# rule bake a -1 into a shape constant.
DYNAMIC_OK: set[str] = set()


def register(*op_names: str, table: dict[str, Rule] = RULES) -> Callable[[Rule], Rule]:
    def wrap(rule: Rule) -> Rule:
        for name in op_names:
            if name in table:
                raise ValueError(f"two rules for {name}")
            table[name] = rule
        return rule

    return wrap


def register_custom_call(*targets: str, dynamic: bool = False, replace: bool = False) -> Callable[[Rule], Rule]:
    """A decorator adding a rule for the custom calls named `targets` (see CUSTOM_CALLS); public as
    `hlo2onnx.register_custom_call` (docs/extending.md), which loads hlo2onnx's own rules first.

    `dynamic`: the rule handles dynamic dims. A name that has a rule already (hlo2onnx's own or one
    registered before) is refused with a ValueError, unless `replace=True`: the new rule then serves that
    name in every later translation of the process.
    """
    def wrap(rule: Rule) -> Rule:
        taken = [name for name in targets if name in CUSTOM_CALLS]
        if taken and not replace:
            raise ValueError(f"custom call @{taken[0]} has a rule already; pass replace=True to replace it")
        for name in targets:
            CUSTOM_CALLS[name] = rule
            if dynamic:
                CUSTOM_DYNAMIC_OK.add(name)
            else:
                CUSTOM_DYNAMIC_OK.discard(name)
        return rule

    return wrap


def register_complex(*op_names: str) -> Callable[[Rule], Rule]:
    return register(*op_names, table=COMPLEX_RULES)


def allow_dynamic(*op_names: str) -> None:
    """Marks ops whose rules are correct on dynamic dims (see DYNAMIC_OK)."""
    DYNAMIC_OK.update(op_names)
