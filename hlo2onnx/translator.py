"""Walks a StableHLO module and emits one ONNX graph.

Private functions reached through `func.call` are inlined here, at
translation time: the MLIR `inline` pass leaves JAX's private functions alone.
"""
from __future__ import annotations

import itertools
import math
import re
from collections import ChainMap
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np
import onnx_ir as ir
from jax.extend.mlir import ir as mlir

from hlo2onnx import attrs as attr_codec
from hlo2onnx import host_calls, names
from hlo2onnx.builder import Builder
from hlo2onnx.errors import Hlo2OnnxError, InvalidInputError, UnsupportedOpError, source_line
from hlo2onnx.graphs import all_nodes
from hlo2onnx.interrupts import checkpoint
from hlo2onnx.registry import COMPLEX_RULES, DYNAMIC_OK, RULES
from hlo2onnx.provenance import tag_nodes
from hlo2onnx.targets import Target
from hlo2onnx.types import (TensorType, UnsupportedTypeError, is_complex, is_token, onnx_dtype, set_type,
                            tensor_type)

_UNSEEN = object()
_TERMINATORS = frozenset({"func.return", "stablehlo.return"})
# Replaces one op's rule inside one emit_block call: (builder, inputs) -> outputs. Keyed by the op's first result.
Override = Callable[[Builder, list[ir.Value]], list[ir.Value]]
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\[\]']*$")
IR_VERSION = 10


# Ops left without a rule on purpose, and why.
_NO_RULE = {
    "stablehlo.rng": "XLA's stateful generator (lax.rng_uniform) draws values no other runtime can reproduce; "
                     "use jax.random, which translates bit for bit",
}


@dataclass(slots=True)  # one per op: slots make it cheaper to build and read
class RuleContext:
    """What a rule sees besides its inputs: types, the builder, and the op itself."""

    b: Builder
    hlo_op: mlir.Operation
    in_types: list[TensorType]
    out_types: list[TensorType]
    translator: "Translator"

    @property
    def out_type(self) -> TensorType:
        return self.out_types[0]

    @property
    def where(self) -> str | None:
        return self.translator.where(self.hlo_op)


class Translator:
    def __init__(self, module: mlir.Module | mlir.Operation, target: Target, opset: int,
                 host_callbacks: Sequence[int] | None = None, constants: Sequence[np.ndarray] | None = None):
        """`host_callbacks`: the ids under which the caller runs the lowering's host callbacks, by index (mnjit
        gives them); without them a callback is refused (hlo2onnx/host_calls.py). `constants`: the values of
        main's `jax.const` arguments, in order (`compat.const_args` of a Lowered): they become weights."""
        module_op = module.operation if isinstance(module, mlir.Module) else module
        self.target = target
        self.constants = constants
        self.opset = opset
        self.host_callbacks = host_callbacks
        # Devices the module was lowered for: collectives over one device are identities (ops/calls/sharding.py).
        self.devices = math.prod(mlir.IntegerAttr(module_op.attributes[name]).value
                                 for name in ("mhlo.num_partitions", "mhlo.num_replicas")
                                 if name in module_op.attributes)
        self._sites = itertools.count()
        self.functions = {
            mlir.StringAttr(op.attributes["sym_name"]).value: op
            for op in module_op.regions[0].blocks[0].operations
            if op.operation.name == "func.func"
        }
        self.op_counts: dict[str, int] = {}
        # Values of the enclosing blocks: case/if regions read them directly (they are not isolated from above).
        self._env: Mapping[mlir.Value, ir.Value] = {}
        self._call_sites: list[str | None] = []  # source lines of the func.calls being inlined
        # MLIR uniques types and locations, so each distinct one is converted once: printing a location costs
        # ~20 us, a type ~6 us, against ~1 us to look it up (locations by their attribute: a Location's own
        # hash is its Python object's).
        self._types: dict[mlir.Type, TensorType] = {}
        self._lines: dict[mlir.Attribute, str | None] = {}
        # ids of the types above that are neither complex nor dynamic (an op of only those needs no checks), and
        # each type's ONNX element type and shape, made once (_set_type; the TensorType is kept in the entry, so
        # its id stays its own). Both hold one entry per distinct type of the module.
        self._plain: set[int] = set()
        self._onnx_types: dict[int, tuple[TensorType, ir.DataType, ir.Shape]] = {}
        # Model metadata the rules record (jax.export's shape assertions), written into the model's metadata_props.
        self.metadata: dict[str, str] = {}

    # -- entry -------------------------------------------------------------------
    def translate(self, name: str = "main", graph_name: str = "main") -> ir.Model:
        func = self.functions.get(name)
        if func is None:
            raise Hlo2OnnxError(f"the module has no function @{name}")
        block = func.regions[0].blocks[0]
        graph = ir.Graph([], [], nodes=[], opset_imports={"": self.opset}, name=graph_name)
        builder = Builder(graph, self.target)
        inputs, args = [], []
        constants = iter(self._constant_arguments(func, name))
        for i, arg in enumerate(block.arguments):
            if is_token(arg.type):  # ordered effects: the caller's token is a fresh one (calls run in order)
                args.append(builder.const(np.bool_(True)))
                continue
            constant = next(constants)
            if constant is not None:
                args.append(builder.weight(constant, self._type_of(arg, "func.func")))
                continue
            value = ir.Value(name=arg_name(arg, len(inputs)))
            set_type(value, self._type_of(arg, "func.func"))
            inputs.append(value)
            args.append(value)
        used_names: set[str] = set()
        for value, short in zip(inputs, names.short_names([v.name for v in inputs])):  # dict keys name leaves
            value.name = unique_name(short, used_names)
        graph.inputs.extend(inputs)
        results = self.emit_block(block, args, builder)
        result_types = mlir.FunctionType(mlir.TypeAttr(func.attributes["function_type"]).value).results
        infos = _result_infos(func, len(result_types))
        kept = [i for i, rtype in enumerate(result_types) if not is_token(rtype)]
        results = [results[i] for i in kept]
        graph.outputs.extend(self._graph_outputs(results, builder, used_names, [infos[i] for i in kept]))
        model = ir.Model(graph, ir_version=IR_VERSION, producer_name="hlo2onnx")
        model.metadata_props.update(self.metadata)
        if any(host_calls.is_host_call(node) for node in all_nodes(graph)):
            last_effect = host_calls.order_effects(graph)
            if not graph.outputs and last_effect is not None:
                # A function run only for its effects (jax.debug.print) still needs one output for ORT to run:
                # the order token, which the runtime drops.
                graph.outputs.extend(self._graph_outputs([last_effect], builder, used_names))
            graph.opset_imports[host_calls.DOMAIN] = host_calls.DOMAIN_VERSION
            model.metadata_props[host_calls.NEEDS_MNJIT] = "true"
        return model

    def _constant_arguments(self, func: mlir.Operation, name: str) -> list[np.ndarray | None]:
        """Per argument of `func`, the value of a `jax.const` one (else None).

        jax >= 0.12.1 passes closed-over arrays larger than `jax_embedded_constants_max_bytes` as arguments of
        main marked `jax.const`, their values held by the Lowered, not the module: they are the model's weights.
        """
        arguments = func.regions[0].blocks[0].arguments
        arg_attrs = list(func.attributes["arg_attrs"]) if "arg_attrs" in func.attributes else []
        marked = [i for i, attrs in enumerate(arg_attrs) if "jax.const" in mlir.DictAttr(attrs)]
        values: list[np.ndarray | None] = [None] * len(arguments)
        if not marked:
            return values
        if self.constants is None:
            listed = ", ".join(f"%arg{i}" for i in marked)
            raise InvalidInputError(
                f"@{name}'s {'arguments' if len(marked) > 1 else 'argument'} {listed} "
                f"{'are constants' if len(marked) > 1 else 'is a constant'} that jax passes beside the module "
                "(jax.const = true), not in it, so the file lacks its value: convert the "
                "jax.jit(f).lower(...) result itself (hlo2onnx.convert(lowered), mnjit's lower().save()), or "
                "save the function with jax.export, which keeps them in the module")
        if len(self.constants) != len(marked):
            raise InvalidInputError(f"@{name} has {len(marked)} jax.const arguments, but {len(self.constants)} "
                                    "constant values were given")
        for i, constant in zip(marked, self.constants):
            values[i] = np.asarray(constant)  # a CPU jax.Array is viewed, not copied
        return values

    def next_site(self) -> int:
        """A number no other emitted callback node has: equal callbacks (one function inlined twice) stay two."""
        return next(self._sites)

    def _graph_outputs(self, results: list[ir.Value], b: Builder, used_names: set[str],
                       infos: Sequence[str | None] = ()) -> list[ir.Value]:
        """ONNX outputs must be distinct node outputs: wrap inputs, constants and repeats in Identity. A result
        of a dict is named by its key (jax.result_info), others out<i>."""
        outputs: list[ir.Value] = []
        for i, value in enumerate(results):
            if value.producer() is None or value.is_initializer() or value in outputs:
                copy = b.op("Identity", value)
                copy.type, copy.shape = value.type, value.shape
                value = copy
            value.name = unique_name(names.output_name(infos[i] if i < len(infos) else None, i), used_names)
            outputs.append(value)
        return outputs

    # -- walking -----------------------------------------------------------------
    def emit_block(self, block: mlir.Block, args: Sequence[ir.Value], b: Builder,
                   overrides: Mapping[mlir.Value, Override] | None = None) -> list[ir.Value]:
        """Emits every op of `block`; returns the values its terminator yields.

        `overrides` replaces the rule of the ops whose first result it names (loop rewrites use it).
        """
        local = dict(zip(block.arguments, args))
        outer = self._env
        # An op's region reads the values of the enclosing blocks too (through the chain); most reads are of the
        # block's own values, looked up in its dict first (a ChainMap lookup costs ~1 us more).
        env = ChainMap(local, outer) if outer else local
        self._env = env
        try:
            for op in block.operations:
                operation = op.operation
                name = operation.name
                operands = operation.operands
                try:
                    inputs = [local[v] for v in operands]
                except KeyError:
                    inputs = [env[v] for v in operands]
                if name in _TERMINATORS:
                    return inputs
                results = operation.results
                override = overrides.get(results[0]) if overrides and len(results) else None
                outputs = override(b, inputs) if override else self.emit_op(op, name, inputs, b, operands, results)
                for result, value in zip(results, outputs):
                    local[result] = value
        finally:
            self._env = outer
        raise Hlo2OnnxError("block without terminator")

    def where(self, op: mlir.Operation) -> str | None:
        """The op's user source line; for an op in a JAX-internal function (jnp.linalg's LAPACK calls carry
        only a name), the line of the innermost call that has one."""
        return self._source_line(op.location) or next((w for w in reversed(self._call_sites) if w), None)

    def _source_line(self, location: mlir.Location) -> str | None:
        key = location.attr
        line = self._lines.get(key, _UNSEEN)
        if line is _UNSEEN:
            line = self._lines[key] = source_line(location)
        return line

    def emit_op(self, op: mlir.OpView, name: str, inputs: list[ir.Value], b: Builder,
                operands: Sequence[mlir.Value] | None = None,
                results: Sequence[mlir.Value] | None = None) -> list[ir.Value]:
        """Emits `op` through its rule. `operands` and `results`: the op's own, when the caller has them (the
        bindings build new Python objects on every read)."""
        checkpoint()  # a Ctrl-C taken by the guard (hlo2onnx.interrupts) is raised between ops
        if name not in RULES and name not in COMPLEX_RULES:
            raise UnsupportedOpError(name, self.where(op), _NO_RULE.get(name, "no translation rule"))
        operation = op.operation
        type_of = self._type_of
        in_types = [type_of(v, name, op) for v in (operation.operands if operands is None else operands)]
        out_types = [type_of(r, name, op) for r in (operation.results if results is None else results)]
        ctx = RuleContext(b, operation, in_types, out_types, self)
        # The one dispatch point for complex values: their rules see complex types and float-pair inputs.
        rule = RULES.get(name)
        plain = self._plain
        if not (plain.issuperset(map(id, in_types)) and plain.issuperset(map(id, out_types))):
            # Custom calls keep their own dispatch, which names the call target in its refusals.
            if name != "stablehlo.custom_call" and any(is_complex(t.dtype) for t in in_types + out_types):
                rule = COMPLEX_RULES.get(name)
                if rule is None:
                    raise UnsupportedOpError(name, self.where(op), "complex operands are not supported")
            if name not in DYNAMIC_OK and any(d < 0 for t in in_types + out_types for d in t.shape):
                raise UnsupportedOpError(name, ctx.where, "dynamic dimensions are not supported for this op")
        if out_types and all(_empty(t) for t in out_types) and "has_side_effect" not in operation.attributes:
            # Results with no elements hold no data, whatever the op: empty constants of their types, and no
            # kernel for ORT to refuse on empty inputs. An op with one non-empty result runs its rule as usual.
            self.op_counts[name] = self.op_counts.get(name, 0) + 1
            return [b.const(np.zeros(t.storage.shape, t.storage.dtype)) for t in out_types]
        graph = b.graph
        emitted = len(graph)
        attributes = attr_codec.decode_all(operation)
        unknown = attr_codec.unknown(rule, attributes)
        if unknown:
            raise UnsupportedOpError(name, self.where(op), f"unknown attribute(s) {', '.join(unknown)}")
        try:
            outputs = rule(ctx, *inputs, **attributes)
        except Hlo2OnnxError:
            raise
        except (NotImplementedError, UnsupportedTypeError) as e:
            raise UnsupportedOpError(name, self.where(op), str(e)) from None
        outputs = [outputs] if isinstance(outputs, ir.Value) else list(outputs)
        if len(outputs) != len(out_types):
            raise AssertionError(f"rule for {name} returned {len(outputs)} values, expected {len(out_types)}")
        for value, ttype in zip(outputs, out_types):
            if value.type is None:
                self._set_type(value, ttype)
        self.op_counts[name] = self.op_counts.get(name, 0) + 1
        made = len(graph) - emitted
        if made:  # the source line is looked up only for ops that made nodes (constants make initializers)
            tag_nodes(itertools.islice(reversed(graph), made), name, self.where(op))
        return outputs

    def call(self, callee: str, args: Sequence[ir.Value], b: Builder, where: str | None = None) -> list[ir.Value]:
        """Inlines a private function's body; `where` is the call's source line."""
        func = self.functions.get(callee)
        if func is None:
            raise Hlo2OnnxError(f"call to unknown function @{callee}")
        self._call_sites.append(where)
        try:
            return self.emit_block(func.regions[0].blocks[0], args, b)
        finally:
            self._call_sites.pop()

    def _type_of(self, value: mlir.Value, name: str, op=None) -> TensorType:
        mlir_type = value.type
        found = self._types.get(mlir_type)
        if found is not None:
            return found
        try:
            found = self._types[mlir_type] = tensor_type(mlir_type)
        except (UnsupportedTypeError, ValueError) as e:
            where = self.where(op) if op is not None else None
            raise UnsupportedOpError(name, where, f"type {value.type}: {e}") from None
        if not is_complex(found.dtype) and min(found.shape, default=0) >= 0:
            self._plain.add(id(found))  # kept alive by self._types
        return found

    def _set_type(self, value: ir.Value, ttype: TensorType) -> None:
        """types.set_type, with the ONNX element type and shape of each TensorType made once: the shape is a
        frozen ir.Shape that all values of the type share (as onnx-ir shares a tensor's shape with the values it
        initializes), which also spares the collector three objects a value."""
        converted = self._onnx_types.get(id(ttype))
        if converted is None:
            storage = ttype.storage
            shape = ir.Shape([d if d >= 0 else None for d in storage.shape], frozen=True)
            converted = self._onnx_types[id(ttype)] = (ttype, onnx_dtype(storage.dtype), shape)
        value.type = ir.TensorType(converted[1])
        value.shape = converted[2]


def _empty(ttype: TensorType) -> bool:
    """A static shape with a 0 dimension."""
    return 0 in ttype.shape and min(ttype.shape) >= 0


def arg_name(arg: mlir.BlockArgument, index: int) -> str:
    """The ONNX input name of a function argument: its source name when JAX kept one, else `in<index>`."""
    # JAX names arguments through their location: loc("x") or loc("params['w']").
    match = re.match(r'loc\("([^"]+)"\)$', str(arg.location))
    if match and _IDENTIFIER.match(match.group(1)):
        return match.group(1)
    return f"in{index}"


def _result_infos(func: mlir.Operation, count: int) -> list[str | None]:
    """Per result of `func`, jax's path of it in the output tree (`result['probs']`), where jax recorded one."""
    infos: list[str | None] = [None] * count
    if "res_attrs" in func.attributes:
        for i, attrs in enumerate(list(func.attributes["res_attrs"])[:count]):
            attrs = mlir.DictAttr(attrs)
            if "jax.result_info" in attrs:
                infos[i] = mlir.StringAttr(attrs["jax.result_info"]).value
    return infos


def unique_name(name: str, used: set[str]) -> str:
    """`name`, or `name_1`, `name_2` ... the first not in `used`; records it there (graph inputs and outputs
    need distinct names)."""
    candidate, n = name, 0
    while candidate in used:
        n += 1
        candidate = f"{name}_{n}"
    used.add(candidate)
    return candidate


