"""nnx_jit: flax nnx's `nnx.jit` on mnjit, built on nnx's public graph API (split, merge, update, iter_graph).

    @nnx_jit                      # instead of @nnx.jit
    def train_step(model, optimizer, metrics, x, y): ...

nnx objects (Modules, Optimizers, Rngs, Metrics, Variables) are mutable Python objects, not values a compiled
function can return: jax.jit (and plain mnjit) would drop what the function does to them. nnx_jit does what
nnx.jit does: each call splits the nnx objects among the arguments into their graph (static) and state
(arrays), runs a pure function of the state under mnjit that merges them back, calls the user's function and
returns the new state, and writes that state back into the caller's objects (nnx.update).

flax is imported on first use only: mnjit itself does not need it.
"""
from __future__ import annotations

import functools
import types
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import jax

from mnjit import jit_options
from mnjit.api import MnjitFunction

# The keyword the nnx state travels under into the pure function (not a parameter of the user's function:
# static_argnums/static_argnames keep their meaning).
_STATE = "__mnjit_nnx_state__"


@dataclass(frozen=True)
class NodeSlot:
    """Where an nnx object was among the arguments or outputs: a pytree without leaves, so the structure and
    the cache key hold it. `source` is "in" (argument object `index`, at `path` inside it) or "new" (an object
    the function created: output object `index`)."""
    source: str
    index: int
    path: tuple = ()


jax.tree_util.register_static(NodeSlot)


def _nnx() -> types.ModuleType:
    from flax import nnx  # only nnx_jit's callers need flax installed
    return nnx


def _take_nodes(tree: Any, nodes: list, is_node: Callable[[Any], bool]) -> Any:
    """`tree` with each nnx object replaced by a NodeSlot; the objects are appended to `nodes`."""
    leaves, treedef = jax.tree_util.tree_flatten(tree, is_leaf=is_node)
    for i, leaf in enumerate(leaves):
        if is_node(leaf):
            leaves[i] = NodeSlot("in", len(nodes))
            nodes.append(leaf)
    return jax.tree_util.tree_unflatten(treedef, leaves)


def _fill(tree: Any, resolve: Callable[[NodeSlot], Any]) -> Any:
    return jax.tree_util.tree_map(lambda x: resolve(x) if isinstance(x, NodeSlot) else x, tree,
                                  is_leaf=lambda x: isinstance(x, NodeSlot))


class NnxJitFunction:
    """A function of nnx objects and arrays compiled by mnjit, with nnx.jit's semantics; see `nnx_jit`."""

    def __init__(self, fun: Callable, *, static_argnums: int | Iterable[int] | None = None,
                 static_argnames: str | Iterable[str] | None = None, **options: Any):
        if not callable(fun):
            raise TypeError(f"nnx_jit expects a callable, got {type(fun).__name__}")
        functools.update_wrapper(self, fun)
        self._fun = fun
        self._static_argnums, self._static_argnames = jit_options.normalize_static(fun, static_argnums,
                                                                                  static_argnames)

        def pure(*args, **kwargs):
            return self._pure(*args, **kwargs)
        # The user's signature (inspect follows __wrapped__): static_argnames resolve against it, as with nnx.jit.
        functools.update_wrapper(pure, fun)
        self._jitted = MnjitFunction(pure, static_argnums=self._static_argnums,
                                     static_argnames=self._static_argnames, **options)

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        return self if instance is None else types.MethodType(self, instance)

    # -- inside the trace ---------------------------------------------------------------------------------
    def _pure(self, *args, **kwargs):
        nnx = _nnx()
        graphdef, state = kwargs.pop(_STATE)
        nodes = nnx.merge(graphdef, state)
        args, kwargs = _fill((args, kwargs), lambda slot: nodes[slot.index])
        out = self._fun(*args, **kwargs)

        # Outputs that are argument objects (or objects inside them) go back to the caller's objects, as with
        # nnx.jit: their position, not a copy, is returned.
        where = {}
        for i, node in enumerate(nodes):
            for path, inner in nnx.iter_graph(node):
                if nnx.graph.is_graph_node(inner):
                    where.setdefault(id(inner), (i, path))
        new_nodes: list = []

        def slot(node):
            if id(node) in where:
                return NodeSlot("in", *where[id(node)])
            new_nodes.append(node)
            return NodeSlot("new", len(new_nodes) - 1)
        out = jax.tree_util.tree_map(lambda x: slot(x) if nnx.graph.is_graph_node(x) else x, out,
                                     is_leaf=nnx.graph.is_graph_node)

        new_graphdef, new_state = nnx.split(nodes)
        if new_graphdef != graphdef:
            raise ValueError(f"{self.__name__} changed the structure of its nnx arguments (added or removed an "
                             "attribute, Variable or submodule): nnx_jit writes back their state only; make the "
                             "change outside the compiled function")
        return out, new_state, nnx.split(tuple(new_nodes)) if new_nodes else None

    # -- outside ------------------------------------------------------------------------------------------
    def _pure_arguments(self, args: tuple, kwargs: dict) -> tuple[tuple, dict, tuple]:
        """The arguments with nnx objects replaced by slots (static ones untouched) and the objects."""
        nnx = _nnx()
        is_node = nnx.graph.is_graph_node
        static = jit_options.resolve_argnums(self._static_argnums, len(args))
        nodes: list = []
        args = tuple(a if i in static else _take_nodes(a, nodes, is_node) for i, a in enumerate(args))
        kwargs = {k: v if k in self._static_argnames else _take_nodes(v, nodes, is_node) for k, v in kwargs.items()}
        if _STATE in kwargs:
            raise TypeError(f"{_STATE} is nnx_jit's own keyword")
        return args, kwargs, tuple(nodes)

    def __call__(self, *args, **kwargs):
        nnx = _nnx()
        args, kwargs, nodes = self._pure_arguments(args, kwargs)
        out, state, created = self._jitted(*args, **kwargs, **{_STATE: nnx.split(nodes)})
        nnx.update(nodes, state)  # what the function did to the caller's objects
        if not any(isinstance(x, NodeSlot) for x in jax.tree_util.tree_leaves(
                out, is_leaf=lambda x: isinstance(x, NodeSlot))):
            return out
        created = nnx.merge(*created) if created is not None else ()
        inner = {}

        def resolve(slot: NodeSlot) -> Any:
            if slot.source == "new":
                return created[slot.index]
            if not slot.path:
                return nodes[slot.index]
            if slot.index not in inner:
                inner[slot.index] = dict(nnx.iter_graph(nodes[slot.index]))
            return inner[slot.index][slot.path]
        return _fill(out, resolve)

    def lower(self, *args, **kwargs):
        """The pure function's lowering (mnjit's `lower`): the nnx objects' state is among its inputs."""
        nnx = _nnx()
        args, kwargs, nodes = self._pure_arguments(args, kwargs)
        return self._jitted.lower(*args, **kwargs, **{_STATE: nnx.split(nodes)})

    @property
    def translations(self) -> int:
        """How many signatures were translated (as MnjitFunction.translations)."""
        return self._jitted.translations

    def clear_cache(self) -> None:
        self._jitted.clear_cache()


def nnx_jit(fun: Callable | None = None, *, static_argnums: int | Iterable[int] | None = None,
            static_argnames: str | Iterable[str] | None = None, **options: Any) -> NnxJitFunction | Callable:
    """Drop-in for flax's `nnx.jit` that runs the compiled function on ONNX Runtime (mnjit's options apply:
    `target`, `opset`, `fallback`, ...). nnx objects among the arguments are updated in place as nnx.jit updates
    them; nnx objects returned are the caller's own where the function returns an argument (or a part of one),
    new ones otherwise. The function may not add or remove attributes of its arguments."""
    if fun is None:
        return functools.partial(nnx_jit, static_argnums=static_argnums, static_argnames=static_argnames, **options)
    return NnxJitFunction(fun, static_argnums=static_argnums, static_argnames=static_argnames, **options)
