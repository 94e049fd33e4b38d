"""mnjit's reading of jax.jit's options: static arguments, placement, and signatures in messages."""
from __future__ import annotations

import inspect
import sys
from typing import Any, Callable, Sequence

import jax
import numpy as np

import hlo2onnx


def static_key(positional: tuple, keyword: tuple[tuple[str, Any], ...]) -> tuple:
    """A call's static arguments in its cache key. As in jax.jit's, equal values of other types (2, 2.0, True,
    np.int64(2)) are other signatures: the function may branch on the type. Positional and keyword ones are
    apart: a positional value ("n", 2) is not the keyword n=2."""
    return positional, keyword, tuple(type(v) for v in positional + tuple(v for _, v in keyword))


def describe(key: tuple) -> str:
    """A signature (a cache key) as the argument types it stands for."""
    treedef, signature, static = key[0], key[1], key[2]
    types = ", ".join(f"{dtype.name}{list(shape)}{' (weak)' if weak else ''}" for shape, dtype, weak in signature)
    values = static[0] + tuple(f"{k}={v!r}" for k, v in static[1]) if static else ()
    return f"arguments ({types}) in the structure {treedef}" + (f", static {values}" if values else "")


def call_types(key: tuple) -> tuple:
    """What jax's Compiled checks a call's signature (a cache key) against: its structure, static values and
    argument types without their weak types, whatever the x64 mode."""
    return key[0], tuple((shape, dtype) for shape, dtype, _ in key[1]), key[2]


def refuse_static_keywords(name: str, kwargs: dict, static_argnames: tuple[str, ...]) -> None:
    """A compiled signature's call passing a static argument by name again: the lowering's value would run in
    its place (a silently wrong result where they differ), so it is refused, as jax's Compiled refuses it
    (another pytree: static arguments are not part of the compiled one)."""
    passed = sorted(set(kwargs) & set(static_argnames))
    if passed:
        raise TypeError(f"{name} was compiled with the static argument(s) {', '.join(passed)} of its lowering: "
                        "call it with the dynamic arguments only")


def check_placement(target: hlo2onnx.Target, device: Any, backend: str | None, in_shardings: Any,
                    out_shardings: Any) -> None:
    """jax.jit's placement options, accepted where they name the device the target runs on already."""
    platform = "cuda" if target.device in ("cuda", "gpu") else "cpu"  # the GPU targets say "gpu"
    for name, value in (("device", device and device.platform), ("backend", backend)):
        if value is not None and value not in (platform, "gpu" if platform == "cuda" else platform):
            raise ValueError(f"{name}={value!r}: mnjit runs target {target.name!r} on {platform}; choose the target "
                             "instead (hlo2onnx.TARGETS)")
    if in_shardings is not None or out_shardings is not None:
        raise ValueError("in_shardings/out_shardings: mnjit runs on one device and places no shards")


def normalize_static(fun: Callable, argnums, argnames) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """Like jax.jit: names and positions of static parameters each imply the other."""
    argnums = () if argnums is None else ((argnums,) if isinstance(argnums, int) else tuple(argnums))
    argnames = () if argnames is None else ((argnames,) if isinstance(argnames, str) else tuple(argnames))
    try:
        params = list(inspect.signature(fun).parameters.values())
    except (TypeError, ValueError):
        return argnums, argnames
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    n = len(positional)
    # With *args, jax.jit counts a negative index from the end of each call's arguments (resolve_argnums).
    varargs = any(p.kind == p.VAR_POSITIONAL for p in params)
    if not varargs and any(i < -n for i in argnums):  # jax.jit's refusal (a position past the end is its too)
        raise ValueError(f"Jitted function has static_argnums={argnums}, but only accepts {n} positional arguments.")
    argnums = tuple(sorted({i + n if i < 0 and not varargs else i for i in argnums}))
    names = set(argnames) | {positional[i] for i in argnums if 0 <= i < n and
                             params[i].kind == params[i].POSITIONAL_OR_KEYWORD}
    nums = set(argnums) | {positional.index(a) for a in argnames if a in positional}
    return tuple(sorted(nums)), tuple(sorted(names))


def has_symbolic_dims(tree: Any) -> bool:
    """Whether some leaf's shape has a dim that is not a number (jax.export.symbolic_shape)."""
    return any(not isinstance(d, int) for leaf in jax.tree_util.tree_leaves(tree)
               for d in getattr(leaf, "shape", ()))


def resolve_argnums(argnums: tuple[int, ...], nargs: int) -> tuple[int, ...]:
    """The positions of one call's static arguments, as jax.jit takes them: negative ones count from the end,
    those past the call's arguments are ignored."""
    return tuple(sorted({i % nargs for i in argnums if -nargs <= i < nargs}))


def debug_check_fails(outputs: Sequence) -> bool:
    """Whether jax_debug_nans (jax_debug_infs) is on and some floating output holds a NaN (an inf): jax.jit then
    runs the function op by op and raises FloatingPointError naming the primitive that made it."""
    nans, infs = jax.config.jax_debug_nans, jax.config.jax_debug_infs
    if not (nans or infs):
        return False
    for out in outputs:
        if isinstance(out, jax.Array) and jax.numpy.issubdtype(out.dtype, jax.numpy.inexact):
            values = np.asarray(out)
            if (nans and np.isnan(values).any()) or (infs and np.isinf(values).any()):
                return True
    return False


def holds_nnx_objects(tree: Any) -> bool:
    """Whether `tree` holds flax nnx objects whose updates a jit of arrays drops (a Module, Optimizer, Rngs, Metric,
    or a Variable outside an nnx.State, which is how nnx passes state on purpose). False without importing flax
    where the caller never did."""
    nnx = sys.modules.get("flax.nnx")
    if nnx is None:
        return False
    stop = lambda x: isinstance(x, nnx.State) or nnx.graph.is_graph_node(x)  # noqa: E731
    return any(not isinstance(x, nnx.State) and nnx.graph.is_graph_node(x)
               for x in jax.tree_util.tree_leaves(tree, is_leaf=stop))
