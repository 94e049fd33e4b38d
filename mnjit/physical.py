"""Leaf types jax holds that StableHLO and ONNX do not: typed PRNG keys and float0 (the tangent type of
integer and boolean values, `jax.grad(..., allow_int=True)`), crossing the boundary as what jax lowers them to."""
from __future__ import annotations

from typing import Any, Sequence

import jax
import numpy as np

from hlo2onnx.types import is_typed_key


def is_key(aval: Any) -> bool:
    return is_typed_key(aval.dtype)


def is_float0(aval: Any) -> bool:
    return aval.dtype == jax.dtypes.float0


def physical(aval: Any) -> Any:
    """A typed key's aval as its key data's (uint32 words on a trailing axis); float0's as bool, which jax lowers
    it to; other avals as they are."""
    if is_key(aval):
        return jax.eval_shape(jax.random.key_data, aval)
    return jax.ShapeDtypeStruct(aval.shape, np.bool_) if is_float0(aval) else aval


def key_impls(avals: Sequence) -> dict[int, Any]:
    """The positions of typed keys among `avals`, with their implementations (to wrap key data back)."""
    # A key dtype names its implementation only through this attribute (jax has no public reader).
    return {i: aval.dtype._impl for i, aval in enumerate(avals) if is_key(aval)}


def needs_wrapping(avals: Sequence) -> bool:
    return any(is_key(aval) or is_float0(aval) for aval in avals)


class PhysicalLeaves:
    """Runs `runner` (a model over the physical types) on leaves of the logical ones: typed keys go in as their
    key data and come back as keys of the same implementation (threefry, rbg, ...); float0 leaves go in as bool
    zeros and come back as float0 arrays, as jax.jit's do."""

    def __init__(self, runner: Any, in_avals: Sequence, out_avals: Sequence):
        self.runner = runner
        self.key_inputs = list(key_impls(in_avals))
        self.float0_inputs = [i for i, aval in enumerate(in_avals) if is_float0(aval)]
        self.key_outputs = key_impls(out_avals)
        self.float0_outputs = {i: aval.shape for i, aval in enumerate(out_avals) if is_float0(aval)}

    def run(self, leaves: Sequence) -> list:
        leaves = list(leaves)
        for i in self.key_inputs:
            leaves[i] = jax.random.key_data(leaves[i])
        for i in self.float0_inputs:  # no bytes to read: ORT cannot take a void array
            leaves[i] = np.zeros(np.shape(leaves[i]), np.bool_)
        outputs = self.runner.run(leaves)
        for i, impl in self.key_outputs.items():
            outputs[i] = jax.random.wrap_key_data(outputs[i], impl=impl)
        for i, shape in self.float0_outputs.items():
            outputs[i] = np.zeros(shape, jax.dtypes.float0)
        return outputs
