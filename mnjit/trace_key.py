"""The key of a trace before it is lowered (mnjit/persist.py's `trace` entries): a warm process finds its
translation from jax.jit's trace alone, without lowering to StableHLO or serializing it.

The digest covers what decides the lowering, beyond the environment persist.key adds (versions, sources, CPU):
- the jaxpr's text, primitives' parameters included, numpy printing every element of an array parameter;
- the value of every constant: the closed jaxpr's consts and literals, and those of the jaxprs inside
  parameters (pjit, cond, scan... hold closed jaxprs whose consts the text names but does not print);
- the input and output types with their weak types, both pytrees, the effects;
- the debug info (argument names and result paths name the ONNX inputs and outputs; the function's source);
- jax's trace context (jax.jit keys its own caches on it: configuration such as threefry_partitionable or the
  default matmul precision changes the lowering without changing the jaxpr) and the x64 flag.

Anything whose text carries an object's address (a Python callable as a parameter, an unprintable config
value) has no key: such a trace is lowered, and keyed on its StableHLO as before. A trace key never reaches a
translation that was not stored, so host callbacks (never stored) never hit.
"""
from __future__ import annotations

import hashlib
import re
import sys
from typing import Any, Iterator

import jax
import numpy as np
import jax.extend.core as core

from hlo2onnx import compat

# "<function f at 0x7f...>", "<AxisEnv object at 0x...>": printed addresses differ in every process.
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def digest(traced: Any) -> bytes | None:
    """The SHA-256 of what decides `traced`'s lowering (a jax.stages.Traced), or None where it has no stable key."""
    closed = traced.jaxpr
    with np.printoptions(threshold=sys.maxsize):
        text = str(closed)
    info = closed.jaxpr.debug_info
    described = repr((
        [repr(aval) for aval in closed.in_avals], [repr(aval) for aval in closed.out_avals],
        str(traced.in_tree), str(traced.out_tree), str(closed.effects),
        (info.traced_for, info.func_src_info, info.arg_names, info.result_paths) if info is not None else None,
        [_context_part(part) for part in compat.trace_context()], bool(jax.config.jax_enable_x64)))
    if _ADDRESS.search(text) or _ADDRESS.search(described):
        return None
    hasher = hashlib.sha256()
    for part in (text, described):
        data = part.encode()
        hasher.update(len(data).to_bytes(8, "little") + data)
    try:
        for value in _constants(closed):
            if isinstance(value, jax.Array) and jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key):
                value = jax.random.key_data(value)
            array = np.asarray(value)
            if array.dtype == object:
                return None
            hasher.update(f"{array.dtype.str}{array.shape}".encode())
            hasher.update(np.ascontiguousarray(array).tobytes())
    except (TypeError, ValueError):  # a constant numpy cannot read: no key
        return None
    return hasher.digest()


def _context_part(part: Any) -> str:
    """One value of jax's trace context as stable text: the axis environment by its contents, not its address."""
    text = repr(part)
    if _ADDRESS.search(text) and hasattr(part, "__dict__"):
        return f"{type(part).__name__}{sorted((k, repr(v)) for k, v in vars(part).items())}"
    if _ADDRESS.search(text) and hasattr(type(part), "__slots__"):
        slots = [k for k in type(part).__slots__ if not k.startswith("__")]  # __weakref__ prints an address
        return f"{type(part).__name__}{[(k, repr(getattr(part, k, None))) for k in slots]}"
    return text


def _constants(closed: Any) -> Iterator[Any]:
    """The consts and literals of a closed jaxpr and of every jaxpr in its equations' parameters, in order."""
    yield from closed.consts
    yield from _jaxpr_constants(closed.jaxpr)


def _jaxpr_constants(jaxpr: Any) -> Iterator[Any]:
    for eqn in jaxpr.eqns:
        for var in eqn.invars:
            if isinstance(var, core.Literal):
                yield var.val
        for param in eqn.params.values():
            yield from _param_constants(param)


def _param_constants(param: Any) -> Iterator[Any]:
    if isinstance(param, core.ClosedJaxpr):
        yield from _constants(param)
    elif isinstance(param, core.Jaxpr):
        yield from _jaxpr_constants(param)
    elif isinstance(param, (tuple, list)):
        for item in param:
            yield from _param_constants(item)
