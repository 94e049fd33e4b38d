"""The referee of target="auto" (mnjit/tiering.py): is a compiled tier's result as close to jax.jit's as ort-cpu's?

On the comparing call the background worker runs jax.jit's executable of the signature's jaxpr once, as the
reference, beside ort-cpu's result and each compiled candidate's. Each float output's error is measured in
units of its dtype's tolerance (hlo2onnx.check.TOLERANCE, the absolute part scaled to the output's largest
magnitude as `compare(scaled=True)` does): 1.0 is the edge of the tolerance. A candidate is accepted when,
on every output, its error is at most max(1, K x ort-cpu's error).

Why relative to ort-cpu: two correct implementations of a chaotic program drift apart (100 f32 FIRE steps:
ort-cpu itself is 7.1e-5 from jax.jit, beyond any fixed tolerance), and a fixed tolerance would drop a faster
tier for drifting as far as the tier that serves anyway. Where ort-cpu is close (the CFD step: 2.4e-7) a
candidate 40x further is refused. K = 4 leaves room for two implementations rounding differently along a
chaotic trajectory while refusing one whose error is of another order than ort-cpu's.

Integers and bools have no tolerance: a candidate must match jax.jit exactly, or differ in no more elements
than K x ort-cpu does. NaNs must be where the reference has them.

A candidate whose outputs are this close to ort-cpu's (`implied`) passes whatever jax.jit's result, so jax.jit
runs only for candidates further off: on a slow call its run would double the comparison's time.
"""
from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.extend.core as jc
import numpy as np

from hlo2onnx.check import TOLERANCE, compare
from hlo2onnx.types import is_typed_key

K = 4.0


def _host(value) -> np.ndarray:
    if isinstance(value, jax.Array) and is_typed_key(value.dtype):
        value = jax.random.key_data(value)  # typed PRNG keys: their key data
    return np.asarray(value)


def _inexact(dtype: np.dtype) -> bool:
    return bool(jax.numpy.issubdtype(dtype, jax.numpy.inexact))  # bf16 and fp8 too (numpy's kind is "V")


def error(actual, reference) -> float:
    """`actual`'s distance from `reference`, in units of the dtype's tolerance for floats (1.0: at its edge),
    in differing elements for integers and bools; inf for another shape or dtype, or NaNs elsewhere."""
    a, r = _host(actual), _host(reference)
    if a.shape != r.shape or a.dtype != r.dtype:
        return float("inf")
    if a.size == 0:
        return 0.0
    if not _inexact(a.dtype):
        return float(np.sum(a != r))
    rtol, atol = TOLERANCE.get(a.dtype.name, (1e-4, 1e-5))
    wide = np.complex128 if a.dtype.kind == "c" else np.float64
    a, r = a.astype(wide), r.astype(wide)
    finite = np.abs(r[np.isfinite(r)])
    atol *= max(1.0, float(finite.max())) if finite.size else 1.0
    same = (a == r) | (np.isnan(a) & np.isnan(r))  # equal infinities too
    with np.errstate(invalid="ignore", over="ignore"):
        scaled = np.abs(a - r) / (atol + rtol * np.abs(r))
    scaled = np.where(same, 0.0, np.where(np.isnan(scaled), np.inf, scaled))
    return float(scaled.max())


def verdict(candidate: Sequence, base: Sequence, reference: Sequence, k: float = K) -> str | None:
    """Why `candidate` is further from `reference` than allowed (None: accepted), `base` being ort-cpu's
    outputs on the same inputs."""
    if len(candidate) != len(reference):
        return f"{len(candidate)} outputs against jax.jit's {len(reference)}"
    for i, (c, b, r) in enumerate(zip(candidate, base, reference)):
        mine, theirs = error(c, r), error(b, r)
        exact = not _inexact(_host(r).dtype)
        if mine <= (0.0 if exact else 1.0) or mine <= k * theirs:
            continue
        unit = "elements differ" if exact else "x the tolerance"
        return (f"output {i}: {mine:.3g} {unit} from jax.jit, ort-cpu {theirs:.3g} (allowed: "
                f"{'none' if exact else '1'}, or {k:g}x ort-cpu's)")
    return None


# A candidate within this share of the tolerance of ort-cpu's result passes `verdict` whatever jax.jit's result is,
# for k >= 4: by the triangle inequality its error from jax.jit is at most this (times the ratio of the two
# tolerance scales, under 1.15 even for bf16) plus ort-cpu's own e, and 0.5 * 1.15 + e <= max(1, 4e) for every
# e >= 0 (at e = 1/4 both sides meet at 1 with 0.175 to spare; above it 4e grows faster).
IMPLIED = 0.5


def implied(candidate: Sequence, base: Sequence, k: float = K) -> bool:
    """Whether `verdict` must accept `candidate` without jax.jit's result: integers and bools equal to ort-cpu's,
    floats within IMPLIED of the tolerance from them (jax.jit's run, as long as the call, is then skipped)."""
    if k < 4 or len(candidate) != len(base):
        return False
    for c, b in zip(candidate, base):
        exact = not _inexact(_host(b).dtype)
        if error(c, b) > (0.0 if exact else IMPLIED):
            return False
    return True


def reference(traced) -> Any:
    """jax.jit's executable of the signature's jaxpr (the referee's reference), compiled; None if jax fails."""
    try:
        avals = [jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type) for a in traced.jaxpr.in_avals]
        return jax.jit(jc.jaxpr_as_fun(traced.jaxpr)).lower(*avals).compile()
    except Exception:
        return None


def disagreement(actual: Sequence, expected: Sequence) -> str | None:
    """Why two flat output lists differ beyond their dtypes' tolerance (None: they agree): the comparison with
    ort-cpu where jax.jit's reference could not run."""
    if len(actual) != len(expected):
        return f"{len(actual)} outputs against {len(expected)}"
    for i, (a, e) in enumerate(zip(actual, expected)):
        if isinstance(e, jax.Array) and is_typed_key(e.dtype):
            a, e = jax.random.key_data(a), jax.random.key_data(e)  # typed PRNG keys: their key data
        _, problem = compare(np.asarray(a), np.asarray(e), scaled=True)
        if problem:
            return f"output {i}: {problem}"
    return None
