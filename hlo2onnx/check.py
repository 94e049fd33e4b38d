"""The numerical check behind `hlo2onnx --check`: the ONNX model in ONNX Runtime against the source in JAX.

    print(hlo2onnx.convert("model.mlir").check().summary())
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import jax
import numpy as np
import onnx_ir as ir
from jax.extend.mlir import ir as mlir

from hlo2onnx import compat
from hlo2onnx.errors import Hlo2OnnxError
from hlo2onnx.loading import Loaded, function
from hlo2onnx.types import element_dtype, is_typed_key


class CheckError(Hlo2OnnxError):
    """--check could not run the model (as opposed to finding a mismatch)."""


# (rtol, atol): ONNX Runtime and XLA may order float arithmetic differently.
TOLERANCE = {"float16": (1e-2, 1e-2), "bfloat16": (5e-2, 5e-2), "float32": (1e-4, 1e-5),
             "float64": (1e-10, 1e-12), "complex64": (1e-4, 1e-5), "complex128": (1e-10, 1e-12)}


@dataclass
class CheckResult:
    """ONNX Runtime against JAX on the same inputs."""

    max_abs_error: float
    runs: int
    outputs: int
    problems: list[str]
    tolerances: dict[str, tuple[float, float]] = field(default_factory=dict)  # dtype -> (rtol, atol) compared at
    sizes: list[int] = field(default_factory=list)  # the values symbolic dims took, one run each (none: no such dim)

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        runs = f" over {self.runs} runs" if self.runs > 1 else ""
        sizes = f" (symbolic dims = {', '.join(map(str, self.sizes))})" if self.sizes else ""
        tolerance = "; ".join(f"{dtype} rtol={r:g} atol={a:g}" for dtype, (r, a) in self.tolerances.items())
        tolerance = f", tolerance {tolerance}" if tolerance else ""
        verdict = "ok" if self.ok else "MISMATCH: " + "; ".join(self.problems)
        return (f"check: max abs error {self.max_abs_error:.3g} on {self.outputs} output(s){runs}{sizes}"
                f"{tolerance}: {verdict}")


def check(model: ir.Model, loaded: Loaded, inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray] | None = None, *,
          nchw: tuple[Sequence[int], Sequence[int]] = ((), ()), sizes: Sequence[int] = (2, 5),
          seed: int = 0) -> CheckResult:
    """Runs the ONNX `model` in ONNX Runtime and the source module it was converted from (`loaded`) in JAX;
    compares the outputs. `nchw`: the positions of the inputs and outputs the model takes and gives as NCHW
    where the source has NHWC (Conversion.nchw).

    Without `inputs`, random ones are made from the signature; symbolic dims
    take each value of `sizes` in turn (one run per size).
    """
    import onnxruntime as ort

    if isinstance(sizes, (str, bytes)) or not isinstance(sizes, Sequence) or not sizes \
            or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in sizes):
        # () made no run at all, and the check passed having compared nothing
        raise ValueError(f"sizes must be a non-empty sequence of integers >= 0, got {sizes!r}")
    specs = [(v.name, tuple(v.shape), v.dtype.numpy()) for v in model.graph.inputs]
    tried: list[int] = []
    if inputs is not None:
        feeds = [_given_inputs(specs, inputs)]
    else:
        symbolic = {d.value for _, shape, _ in specs for d in shape if isinstance(d, ir.SymbolicDim)}
        if None in symbolic or any(not s.isidentifier() for s in symbolic if s is not None):
            raise CheckError("cannot make inputs for dynamic dims without plain names; give the inputs")
        rng = np.random.default_rng(seed)
        tried = list(sizes) if symbolic else []
        try:
            feeds = [[_random(rng, _concrete(shape, size), dtype) for _, shape, dtype in specs]
                     for size in (sizes if symbolic else sizes[:1])]
        except MemoryError:  # a valid module may declare inputs no machine holds (tensor<99999999999xf32>)
            raise CheckError("not enough memory for random inputs of the model's shapes: "
                             + ", ".join(f"{name} {dtype}[{','.join(map(str, shape))}]"
                                         for name, shape, dtype in specs)) from None
    try:
        session = ort.InferenceSession(ir.to_proto(model).SerializeToString(),
                                       providers=["CPUExecutionProvider"])
    except Exception as e:  # ORT's errors are one long line with a code prefix
        raise CheckError(f"ONNX Runtime rejected the model: {' '.join(str(e).split())}") from None
    reference = reference_runner(loaded)
    complex_inputs = _complex_inputs(loaded)
    max_error, problems, outputs, tolerances = 0.0, [], 0, {}
    # Inputs and outputs made NCHW at the boundary (convert's inputs_as_nchw): JAX's module takes and gives NHWC.
    nchw_in, nchw_out = nchw
    for arrays in feeds:
        try:
            results = session.run_with_ort_values(None, {name: _ort_value(a, ort)
                                                         for (name, _, _), a in zip(specs, arrays)})
        except Exception as e:  # ORT's failures (an allocation past memory, say) are one long line too
            raise CheckError(f"ONNX Runtime failed to run the model: {' '.join(str(e).split())[:300]}") from None
        actual = [_from_ort_value(value) for value in results]
        # The model holds complex values as (real, imag) pairs on a trailing axis; JAX as complex.
        arrays = [np.moveaxis(a, 1, -1) if i in nchw_in else a for i, a in enumerate(arrays)]
        expected = [_as_pairs(e) for e in reference([_as_complex(a) if i in complex_inputs else a
                                                     for i, a in enumerate(arrays)])]
        expected = [np.moveaxis(e, -1, 1) if i in nchw_out else e for i, e in enumerate(expected)]
        outputs = len(expected)
        if len(actual) != len(expected):
            problems.append(f"{len(actual)} outputs, JAX gives {len(expected)}")
            continue
        for i, (a, e) in enumerate(zip(actual, expected)):
            error, problem = compare(np.asarray(a), np.asarray(e))
            if np.asarray(a).dtype.kind in "fc":
                tolerances[np.asarray(a).dtype.name] = TOLERANCE.get(np.asarray(a).dtype.name, (1e-4, 1e-5))
            max_error = max(max_error, error)
            if problem:
                problems.append(f"output {i}: {problem}")
    return CheckResult(max_error, len(feeds), outputs, problems, tolerances, tried)


def _complex_inputs(loaded: Loaded) -> set[int]:
    """Positions of the source's complex inputs (the ONNX model takes them as float pairs)."""
    if loaded.exported is not None:
        # (a typed PRNG key's dtype is no numpy dtype: read as its key data, uint32)
        dtypes = [np.dtype(np.uint32 if is_typed_key(a.dtype) else a.dtype) for a in loaded.exported.in_avals]
    else:
        with loaded.module.context:
            arguments = function(loaded.module, "main").regions[0].blocks[0].arguments
            dtypes = [element_dtype(mlir.RankedTensorType(a.type).element_type) for a in arguments]
    return {i for i, dtype in enumerate(dtypes) if dtype.kind == "c"}


def _as_complex(pairs: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(pairs).view(np.result_type(pairs.dtype, np.complex64))[..., 0]


def _as_pairs(array: np.ndarray) -> np.ndarray:
    array = np.asarray(array)
    return np.stack([array.real, array.imag], axis=-1) if array.dtype.kind == "c" else array


def _ort_value(array: np.ndarray, ort):
    """An ORT input; numpy-only ORT cannot take ml_dtypes arrays (bfloat16 is "Numpy_type 256"), so those
    go in as their bits with the ONNX type named."""
    array = np.require(array, requirements="C")  # not ascontiguousarray: it makes a 0-d input 1-d
    if array.dtype.kind == "V" or array.dtype.type.__module__.startswith("ml_dtypes"):
        onnx_type = int(ir.DataType.from_numpy(array.dtype))
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(array.view(f"u{array.dtype.itemsize}"), onnx_type)
    return ort.OrtValue.ortvalue_from_numpy(array)


def _from_ort_value(value) -> np.ndarray:
    """An ORT output as numpy; ml_dtypes outputs go through DLPack (ORT's .numpy() cannot make them)."""
    try:
        return np.asarray(value.numpy())
    except Exception:  # bfloat16 and the float8 types: jax reads their DLPack type
        return np.asarray(jax.dlpack.from_dlpack(value))


def _given_inputs(specs, inputs) -> list[np.ndarray]:
    if isinstance(inputs, Mapping):
        names = [name for name, _, _ in specs]
        if all(name in inputs for name in names):
            keys = names
        elif all(f"arr_{i}" in inputs for i in range(len(names))):  # np.savez(path, *arrays)
            keys = [f"arr_{i}" for i in range(len(names))]
        else:
            raise CheckError(f"the inputs must be named {', '.join(names)} (or arr_0 ... arr_{len(names) - 1})")
        # An array the model does not take means another model's inputs (or one argument too many): the
        # check would run on a prefix of them and could pass.
        extra = sorted(set(inputs) - set(keys))
        if extra:
            raise CheckError(f"the model takes {len(names)} inputs ({', '.join(names)}); also given: "
                             f"{', '.join(extra)}")
        arrays = [inputs[key] for key in keys]
    else:
        arrays = list(inputs)
    if len(arrays) != len(specs):
        raise CheckError(f"the model takes {len(specs)} inputs, {len(arrays)} given")
    arrays = [np.asarray(a) for a in arrays]
    for (name, shape, dtype), a in zip(specs, arrays):
        fits = len(shape) == a.ndim and all(not isinstance(d, int) or d == n for d, n in zip(shape, a.shape))
        if a.dtype != dtype or not fits:
            want = f"{dtype}[{','.join(str(d) for d in shape)}]"
            raise CheckError(f"input {name} must be {want}, got {a.dtype}[{','.join(map(str, a.shape))}]")
    return arrays


def _concrete(shape, size: int) -> tuple[int, ...]:
    return tuple(d if isinstance(d, int) else size for d in shape)


def _random(rng: np.random.Generator, shape, dtype: np.dtype) -> np.ndarray:
    if dtype == np.bool_:
        return rng.random(shape) > 0.5
    if dtype.kind in "iu":
        return rng.integers(0, 4, shape).astype(dtype)  # small: may be indices or shifts
    if dtype.kind == "c":
        return (rng.uniform(-1, 1, shape) + 1j * rng.uniform(-1, 1, shape)).astype(dtype)
    return rng.uniform(-1, 1, shape).astype(dtype)


def reference_runner(loaded: Loaded) -> Callable[[list[np.ndarray]], list[np.ndarray]]:
    """A function running the source module in JAX, on the flat ONNX inputs."""
    exported = loaded.exported
    if exported is not None:
        def run_exported(arrays):
            # Typed PRNG keys cross as their key data, as the model holds them (jax has no public reader
            # of a key dtype's implementation but this attribute; mnjit/api.py reads it too).
            arrays = [jax.random.wrap_key_data(a, impl=aval.dtype._impl) if is_typed_key(aval.dtype) else a
                      for a, aval in zip(arrays, exported.in_avals)]
            args, kwargs = jax.tree_util.tree_unflatten(exported.in_tree, arrays)
            with jax.enable_x64(True):
                results = jax.tree_util.tree_leaves(exported.call(*args, **kwargs))
                return [np.asarray(jax.random.key_data(x) if is_typed_key(x.dtype) else x) for x in results]
        return _reference_errors(run_exported)
    # A plain module: compiled by jax's own backend, as jax.jit would.
    import jax.extend.backend as jax_backend

    with loaded.module.context:
        main = function(loaded.module, "main")
        signature = mlir.FunctionType(mlir.TypeAttr(main.attributes["function_type"]).value)
        other = [str(t) for t in [*signature.inputs, *signature.results] if not isinstance(t, mlir.RankedTensorType)]
        if other:  # the model drops tokens; jax's executable would need them (was a ValueError: "Cannot cast")
            raise CheckError(f"--check runs modules whose @main takes and returns tensors only, not {other[0]}")
        if not all(t.has_static_shape for t in signature.inputs):
            raise CheckError("--check on dynamic shapes needs a jax.export artifact (or give static inputs)")
        text = str(loaded.module)
    compat.initialize_lapack()  # the module may call LAPACK (jnp.linalg), which jax initializes lazily
    with jax.enable_x64(True):
        backend = jax_backend.get_backend("cpu")
        try:
            executable = backend.compile_and_load(text, backend.devices()[:1], jax_backend.get_compile_options(1, 1))
        except Exception as e:
            raise CheckError(f"JAX cannot compile the module: {' '.join(str(e).split())[:300]}") from None

    def run_module(arrays):
        with jax.enable_x64(True):
            device = backend.devices()[0]
            results = executable.execute_sharded([jax.device_put(a, device) for a in arrays])
            return [np.asarray(shards[0]) for shards in results.disassemble_into_single_device_arrays()]
    return _reference_errors(run_module)


def _reference_errors(run: Callable[[list[np.ndarray]], list[np.ndarray]]):
    def guarded(arrays):
        try:
            return run(arrays)
        except Exception as e:
            raise CheckError(f"JAX failed to run the module: {' '.join(str(e).split())[:300]}") from None
    return guarded


def compare(actual: np.ndarray, expected: np.ndarray, scaled: bool = False) -> tuple[float, str | None]:
    """The largest difference, and what is wrong (None: they agree). Integers and bools must be equal, floats
    within TOLERANCE (NaNs in the same places); `scaled` multiplies the absolute tolerance by the largest
    finite magnitude expected (at least 1): for whole programs, where rounding grows with the values summed."""
    if actual.shape != expected.shape:
        return 0.0, f"shape {actual.shape}, JAX gives {expected.shape}"
    if actual.dtype != expected.dtype:
        return 0.0, f"dtype {actual.dtype}, JAX gives {expected.dtype}"
    if actual.size == 0:
        return 0.0, None
    if actual.dtype.kind in "biu":
        error = float(np.max(np.abs(actual.astype(np.float64) - expected.astype(np.float64))))
        return error, None if error == 0 else f"{int(np.sum(actual != expected))} elements differ"
    a = actual.astype(np.complex128 if actual.dtype.kind == "c" else np.float64)
    e = expected.astype(a.dtype)
    both_nan = np.isnan(a) & np.isnan(e)
    diff = np.where(both_nan, 0, np.abs(a - e))
    error = float(np.nanmax(np.where(np.isnan(diff), np.inf, diff)))
    rtol, atol = TOLERANCE.get(actual.dtype.name, (1e-4, 1e-5))
    if scaled:
        finite = np.abs(e[np.isfinite(e)])
        atol *= max(1.0, float(finite.max())) if finite.size else 1.0
    bad = int(np.sum(~np.isclose(a, e, rtol=rtol, atol=atol, equal_nan=True)))
    return error, f"{bad} elements beyond rtol={rtol:g}, atol={atol:g}" if bad else None
