"""Runs an ONNX model compiled by IREE for the host CPU, with jax/numpy leaves in and jax.Arrays out.

The model goes through IREE's ONNX importer (`iree.compiler.extras.onnx_importer`, what `iree-import-onnx`
runs), then `iree-compile` for llvm-cpu with the host's CPU features, then runs on IREE's `local-task`
driver (its own thread pool). Compiled modules are kept per model in-process (`compiled`), so a model
seen again, by another signature's runner or another mnjit function, is not compiled twice.

Buffers cross by DLPack both ways where IREE allows: jax arrays on the CPU are imported into IREE without
a copy (HalDevice.from_dlpack_capsule), and IREE's results become jax arrays over IREE's buffers
(create_dlpack_capsule). numpy leaves, complex values (float pairs in the model) and dtypes jax's DLPack
does not take are copied once.
"""
from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from typing import Sequence

import jax
import ml_dtypes
import numpy as np
import onnx
import iree.compiler as iree_compiler
import iree.runtime as iree_rt
from iree.compiler.extras import onnx_importer
from iree.compiler.ir import Context

from hlo2onnx import compat
from hlo2onnx.compat import mark_weak
from mnjit.iree_rewrite import for_iree
from mnjit.runtime import complex_as_pairs, host_to_jax, pairs_as_complex

# iree-compile's flags. IREE's torch input pipeline demotes f64 to f32 unless told not to (measured: an f64
# Add came back as f32 bytes); the host CPU's features give the vector width jax's own CPU code uses.
COMPILE_FLAGS = ("--iree-hal-target-device=local", "--iree-hal-local-target-device-backends=llvm-cpu",
                 "--iree-llvmcpu-target-cpu=host", "--iree-input-demote-f64-to-f32=false",
                 "--iree-input-demote-i64-to-i32=false")
# IREE's task-pool driver. Its synchronous one ("local-sync", on the calling thread) was 7x faster on the 64x64
# CFD step (343 small nodes: 0.35x jax.jit against 2.46x) and 10-15% slower on the MLP and transformer block,
# measured at load 8-10 on 2 cores; a per-model choice is left to tiering.
DRIVER = "local-task"
ENTRY = "main"  # the graph is renamed to this before import: the importer names the function after it
_MAX_MODULES = 256  # compiled modules kept (bytes of the .vmfb, weights included)

_BF16 = np.dtype(ml_dtypes.bfloat16)
_COMPLEX = {np.dtype(np.complex64): np.dtype(np.float32), np.dtype(np.complex128): np.dtype(np.float64)}
_ELEMENT = {np.dtype(n): getattr(iree_rt.HalElementType, t) for n, t in (
    ("bool", "BOOL_8"), ("int8", "SINT_8"), ("int16", "SINT_16"), ("int32", "SINT_32"), ("int64", "SINT_64"),
    ("uint8", "UINT_8"), ("uint16", "UINT_16"), ("uint32", "UINT_32"), ("uint64", "UINT_64"),
    ("float16", "FLOAT_16"), ("float32", "FLOAT_32"), ("float64", "FLOAT_64"))}
_ELEMENT[_BF16] = iree_rt.HalElementType.BFLOAT_16


class IreeCompileError(RuntimeError):
    """IREE's ONNX importer or compiler refused a model that the target's op table let through."""


class _Runtime:
    """The process's IREE VM instance, CPU device and HAL module, shared by every compiled model."""

    def __init__(self) -> None:
        self.instance = iree_rt.VmInstance()
        self.device = iree_rt.get_device(DRIVER)
        self.hal = iree_rt.create_hal_module(self.instance, self.device)


_runtime: list[_Runtime] = []
_modules: OrderedDict[str, bytes] = OrderedDict()
_lock = threading.Lock()


def runtime() -> _Runtime:
    with _lock:
        if not _runtime:
            _runtime.append(_Runtime())
        return _runtime[0]


def compiled(proto: onnx.ModelProto) -> bytes:
    """The .vmfb of `proto` (its graph named ENTRY), compiled once per model content in this process."""
    key = hashlib.sha256(proto.SerializeToString(deterministic=True)).hexdigest()
    with _lock:
        if key in _modules:
            _modules.move_to_end(key)
            return _modules[key]
    vmfb = compile_model(proto)
    with _lock:
        _modules[key] = vmfb
        while len(_modules) > _MAX_MODULES:
            _modules.popitem(last=False)
    return vmfb


def import_model(proto: onnx.ModelProto) -> bytes:
    """The model as MLIR bytecode in IREE's ONNX input dialect (what `iree-import-onnx` writes)."""
    try:
        # The importer reads value types from the model: shape inference with data propagation first, as
        # iree-import-onnx does.
        inferred = onnx.shape_inference.infer_shapes(proto, data_prop=True)
        info = onnx_importer.ModelInfo(inferred)
        module = info.create_module(context=Context()).operation
        onnx_importer.NodeImporter.define_function(info.main_graph, module).import_all()
        module.verify()
    except Exception as e:  # the importer raises OnnxImportError, ValueError, MLIRError... on what it lacks
        raise IreeCompileError(f"IREE's ONNX importer refused the model: {_last_line(str(e))}") from e
    return module.get_asm(binary=True)


def compile_model(proto: onnx.ModelProto) -> bytes:
    """The .vmfb of `proto`: imported in-process, compiled by iree-compile in a subprocess (no cache)."""
    try:
        return iree_compiler.compile_str(import_model(proto), input_type="onnx", extra_args=list(COMPILE_FLAGS))
    except iree_compiler.CompilerToolError as e:
        raise IreeCompileError(f"iree-compile could not compile the model: {_first_error(str(e))}") from e


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else text


def _first_error(text: str) -> str:
    """iree-compile's first diagnostic (its output ends with the command line and advice, not the cause)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if "error:" in line]
    if errors:
        return errors[0]
    start = lines.index("Diagnostics:") + 1 if "Diagnostics:" in lines else 0
    return next((line for line in lines[start:] if not line.startswith(("Invoked with", "Need more"))), text)


class IreeRunner:
    """One compiled IREE module; `run` takes flat jax/numpy leaves and returns flat jax.Arrays."""

    def __init__(self, model_bytes: bytes, in_avals: Sequence, out_avals: Sequence):
        self.in_dtypes = [np.dtype(a.dtype) for a in in_avals]
        self.out_avals = list(out_avals)
        for dtype in {*self.in_dtypes, *(np.dtype(a.dtype) for a in self.out_avals)}:
            if dtype not in _ELEMENT and dtype not in _COMPLEX:
                raise TypeError(f"IREE runner: dtype {dtype} cannot cross into IREE")
        proto = onnx.load_from_string(model_bytes)
        if len(proto.graph.input) != len(in_avals) or len(proto.graph.output) != len(out_avals):
            raise ValueError(f"ONNX model has {len(proto.graph.input)} inputs and {len(proto.graph.output)} "
                             f"outputs, the signature {len(in_avals)} and {len(out_avals)}")
        proto = onnx.shape_inference.infer_shapes(proto, data_prop=True)  # the Slice rewrite reads shapes
        for_iree(proto)
        proto.graph.name = ENTRY
        self._rt = runtime()
        self._module = iree_rt.VmModule.copy_buffer(self._rt.instance, compiled(proto))
        self._function = self._module.lookup_function(ENTRY)
        self._contexts = [self._context()]  # idle VM contexts: one per concurrent call (they are not shared)
        self._pool_lock = threading.Lock()
        self._out_dtypes = [np.dtype(a.dtype) for a in self.out_avals]
        self._out_shapes = [tuple(a.shape) for a in self.out_avals]
        # The element type each result must carry: IREE gives unsigned results of arithmetic as signed ones.
        self._out_elements = [_ELEMENT.get(_COMPLEX.get(d, d)) for d in self._out_dtypes]
        self._weak = [i for i, a in enumerate(self.out_avals) if getattr(a, "weak_type", False)]
        self._jax_device = jax.devices("cpu")[0]

    def _context(self) -> iree_rt.VmContext:
        return iree_rt.VmContext(self._rt.instance, [self._rt.hal, self._module])

    def run(self, leaves: Sequence) -> list[jax.Array]:
        args = iree_rt.VmVariantList(len(leaves))
        for leaf, dtype in zip(leaves, self.in_dtypes):
            args.push_ref(self.buffer_view(leaf, dtype))
        results = iree_rt.VmVariantList(len(self._out_dtypes))
        with self._pool_lock:
            context = self._contexts.pop() if self._contexts else None
        if context is None:  # another thread holds the idle context: a VM context serves one call at a time
            context = self._context()
        try:
            context.invoke(self._function, args, results)
        finally:
            with self._pool_lock:
                self._contexts.append(context)
        outputs = [self._to_jax(results.get_as_object(i, iree_rt.HalBufferView), i)
                   for i in range(len(self._out_dtypes))]
        for i in self._weak:
            outputs[i] = mark_weak(outputs[i])
        return outputs

    def buffer_view(self, leaf, dtype: np.dtype) -> iree_rt.HalBufferView:
        device = self._rt.device
        if isinstance(leaf, jax.Array) and leaf.dtype == dtype and dtype not in _COMPLEX \
                and leaf.is_fully_addressable and leaf.devices() == {self._jax_device}:
            # Zero-copy: IREE reads the jax buffer in place (the capsule keeps it alive until IREE lets go).
            return device.from_dlpack_capsule(leaf.__dlpack__())
        # numpy leaves (jax's dtype canonicalization may narrow them: a view when dtypes agree), complex
        # values as float pairs: one copy into an IREE buffer.
        array = np.require(np.asarray(leaf, dtype=dtype), requirements="C")
        if dtype in _COMPLEX:
            array = complex_as_pairs(array)
        element = _ELEMENT[array.dtype]
        if array.dtype == _BF16:
            array = array.view(np.uint16)  # the buffer protocol does not know bf16; the element type does
        return device.allocator.allocate_buffer_copy(
            memory_type=iree_rt.MemoryType.DEVICE_LOCAL, allowed_usage=iree_rt.BufferUsage.DEFAULT,
            device=device, buffer=array, element_type=element)

    def _to_jax(self, view: iree_rt.HalBufferView, i: int) -> jax.Array:
        dtype, shape = self._out_dtypes[i], self._out_shapes[i]
        element = self._out_elements[i]
        if dtype in _COMPLEX:
            shape = (*shape, 2)
        if tuple(view.shape) != shape:
            raise RuntimeError(f"IREE output {i} has shape {list(view.shape)}, expected {list(shape)}")
        if view.element_type != element:
            # Same bytes, another reading (int32 for uint32): a new view of the buffer, not a copy.
            view = iree_rt.HalBufferView(view.get_buffer(), view.shape, element)
        if dtype in _COMPLEX:
            pairs = np.array(view.map().asarray(shape, _COMPLEX[dtype]))  # the one copy
            return host_to_jax(pairs_as_complex(pairs, dtype), self._jax_device)
        # Zero-copy: jax holds IREE's result buffer (copied only when it is not 64-byte aligned).
        capsule = self._rt.device.create_dlpack_capsule(view, compat.KDL_CPU, 0)
        return compat.dlpack_to_buffer(capsule, self._jax_device, None, None, compat.KDL_CPU)

