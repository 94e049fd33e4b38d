"""The private jax, jaxlib and ONNX Runtime APIs that mnjit and hlo2onnx use, in one place.

Each has no public equivalent that is complete or fast enough (docs/runtime.md measures them). Each was
checked on jax/jaxlib 0.10.2, 0.11.2 and 0.12.0.1, and onnxruntime 1.31.1 and 1.32.0, by the whole suite
(`make test` on both ends of the range, .ci/run). A release outside SUPPORTED_* is refused at import with the
pip line that installs a checked one: widen a range only after the suite passes on the new release.
"""
from __future__ import annotations

import warnings
from types import ModuleType

import jax

# [lowest, first unsupported): jax 0.11 and later publish wheels for Python >= 3.12 only.
SUPPORTED_JAX = ((0, 10), (0, 13))
SUPPORTED_ONNXRUNTIME = ((1, 31), (1, 33))


def release(version: str) -> tuple[int, int]:
    """(major, minor) of a version string such as '0.12.0.1' or '1.32.0.dev20260101'."""
    major, minor = version.split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def require(package: str, version: str, supported: tuple[tuple[int, int], tuple[int, int]], note: str = "") -> None:
    """Raises ImportError naming the supported range when `version` is outside it."""
    (low_major, low_minor), (high_major, high_minor) = supported
    if supported[0] <= release(version) < supported[1]:
        return
    pins = f"{package}>={low_major}.{low_minor},<{high_major}.{high_minor}"
    last = f"{high_major}.{high_minor - 1}" if high_minor else f"{low_major}.{low_minor}"
    raise ImportError(f"mnjit and hlo2onnx support {package} {low_major}.{low_minor} to {last}; found {package} "
                      f"{version}. Install with: pip install '{pins}'{note}")


# The jax releases the whole suite has passed on (`make test` on each, .ci/run for the ends), oldest first. The
# README's version table lists the same; a release newer than the last is allowed, with one warning.
TESTED_JAX = ("0.10.2", "0.11.2", "0.12.0.1", "0.12.1")


def version_tuple(version: str) -> tuple[int, ...]:
    """The numeric release parts of a version string: '0.12.0.1' -> (0, 12, 0, 1); '0.13.0.dev2026' -> (0, 13, 0)."""
    parts = []
    for part in version.split("."):
        if not part.isdigit():
            break
        parts.append(int(part))
    return tuple(parts)


def untested_warning(version: str, tested: tuple[str, ...] = TESTED_JAX) -> str | None:
    """The warning for a jax newer than every tested release (None for a tested or older one)."""
    if version_tuple(version) <= version_tuple(tested[-1]):
        return None
    return (f"mnjit and hlo2onnx were tested with jax {', '.join(tested)}; jax {version} is newer and untested. "
            "New releases can change how jax lowers programs: report what fails, or install a tested release "
            f"(pip install 'jax=={tested[-1]}' 'jaxlib=={tested[-1]}')")


class UntestedJaxWarning(UserWarning):
    """jax is newer than every release the suite has passed on."""


require("jax", jax.__version__, SUPPORTED_JAX, " (jax 0.11 and later need Python >= 3.12)")
if (_untested := untested_warning(jax.__version__)) is not None:  # once: a module runs its body once
    warnings.warn(_untested, UntestedJaxWarning, stacklevel=2)

# -- jax and jaxlib ---------------------------------------------------------------------------------------
# The raw DLPack import, (capsule, device, stream, copy, dlpack device type) -> jax.Array: about 3.4 us
# against 50 us for jax.dlpack.from_dlpack. Same signature on 0.10.2, 0.11.2 and 0.12.0.1.
from jax._src.lib import _jax  # noqa: E402

dlpack_to_buffer = _jax.dlpack_managed_tensor_to_buffer
KDL_CPU, KDL_CUDA = 1, 2  # DLPack's device types

# True outside every transformation (grad, vmap, an outer jit): 0.16 us, against 0.6 for a walk over the
# arguments' types. Checked on 0.10.2, 0.11.2 and 0.12.0.1.
from jax._src.core import trace_state_clean  # noqa: E402,F401

# jax_disable_jit's state object: `.value` reads it in 85 ns against 225 for jax.config.jax_disable_jit (every
# mnjit call reads it first). A State on 0.10.2 and 0.12.1.
from jax._src.config import disable_jit as disable_jit_state  # noqa: E402,F401

# The configuration jax.jit's cache keys hold (x64, PRNG, promotion, matmul precision, ...): a signature traced
# under one value does not serve another. 0.3-0.6 us; checked on 0.10.2, 0.11.2 and 0.12.0.1.
from jax._src.config import trace_context  # noqa: E402,F401


def mark_weak(array: jax.Array) -> jax.Array:
    """`array` as a weakly typed value: no public API sets weak_type (0.10.2, 0.11.2, 0.12.0.1)."""
    from jax._src.lax import lax as lax_internal

    return lax_internal._convert_element_type(array, weak_type=True)


def host_callbacks(lowered: jax.stages.Lowered) -> list:
    """The Python functions a lowering's host callbacks call, by the `index` of their custom calls: what
    jax.jit hands XLA at compile time; no public API exposes them (0.10.2, 0.11.2, 0.12.0.1)."""
    return list(lowered._lowering.compile_args.get("host_callbacks", ()))


def const_args(lowered: jax.stages.Lowered) -> list:
    """The values of a lowering's `jax.const` arguments of main, in order: closed-over arrays over
    `jax_embedded_constants_max_bytes` that jax (with jax_use_simplified_jaxpr_constants, the default from
    0.12.1) passes to the module instead of embedding them. No public API exposes them (0.10.2, 0.11.2,
    0.12.0.1, 0.12.1: the same attribute)."""
    return list(lowered._lowering.const_args)


def release_dce_cache() -> None:
    """Empties jax's cache of dead-code-eliminated jaxprs. Under keep_unused=True (every mnjit lowering), jax
    0.12's `pxla._dce_jaxpr` returns its weakly held key as its value: the entry keeps itself alive, and with it
    the lowering cached under that jaxpr (its MLIR module and constants), until 2048 newer entries push it out.
    A discarded mnjit function held ~0.5 MB for `x * i + 1`, its weights for a model. An entry costs one jaxpr
    walk to recompute. Needed on 0.12.0.1; 0.10.2 returns a new ClosedJaxpr (no cycle) and clearing is harmless.
    """
    from jax._src.interpreters import pxla

    pxla._dce_jaxpr.cache_clear()


def make_ir_context():
    """An MLIR context with exactly the dialects jax emits registered (StableHLO, CHLO, func, VHLO).

    jax's own factory; jax.extend.mlir has no public one (0.10.2, 0.11.2, 0.12.0.1).
    """
    from jax._src.interpreters import mlir as jax_mlir

    return jax_mlir.make_ir_context()


def initialize_lapack() -> None:
    """Points jaxlib's LAPACK kernels at scipy's LAPACK. jax does this while lowering a linalg op; a module
    compiled from saved text skips that, and its LAPACK custom calls then segfault
    (jaxlib.lapack._lapack.initialize, idempotent: 0.10.2, 0.11.2, 0.12.0.1)."""
    from jaxlib import lapack

    lapack._lapack.initialize()


def register_stablehlo_passes() -> None:
    """Registers the StableHLO passes (chlo legalization among them): importing jax does not.

    Global to the MLIR library and idempotent (0.10.2, 0.11.2, 0.12.0.1).
    """
    from jaxlib.mlir._mlir_libs import _stablehlo

    _stablehlo.register_stablehlo_passes()


def hlo_text_to_proto(text: str) -> bytes:
    """A serialized HloModuleProto from XLA HLO text: jaxlib ships no other HLO text parser
    (0.10.2, 0.11.2, 0.12.0.1)."""
    from jaxlib import _hlo

    return _hlo.hlo_module_from_text(text).as_serialized_hlo_module_proto()


# -- ONNX Runtime -----------------------------------------------------------------------------------------
def ort_capi() -> ModuleType:
    """ORT's pybind module: C-level IOBinding, OrtValue and RunOptions, whose public wrappers cost tens of
    microseconds a call. Same classes and methods on 1.31.1 and 1.32.0 (CPU), and onnxruntime-gpu 1.31.1."""
    import onnxruntime

    require("onnxruntime", onnxruntime.__version__, SUPPORTED_ONNXRUNTIME)
    return onnxruntime.capi._pybind_state


def c_session(session):
    """The C-level session inside an onnxruntime.InferenceSession (1.31.1, 1.32.0)."""
    return session._sess
