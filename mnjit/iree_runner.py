"""Runs an ONNX model compiled by IREE, for the host CPU (`iree-cpu`) or an NVIDIA GPU (`iree-cuda`), with
jax/numpy leaves in and jax.Arrays out.

The model goes through IREE's ONNX importer (`iree.compiler.extras.onnx_importer`, what `iree-import-onnx`
runs), then `iree-compile` for the backend (`Backend`: llvm-cpu with the host's CPU features, or CUDA for the
GPU's architecture), then runs on IREE's driver for it (`local-task`, its own thread pool, or `cuda`).
Compiled modules are kept per model and flags in-process (`compiled`), so a model seen again, by another
signature's runner or another mnjit function, is not compiled twice.

Buffers cross by DLPack both ways where IREE allows: jax arrays on the backend's device are imported into
IREE without a copy (HalDevice.from_dlpack_capsule). On the CPU, IREE's results become jax arrays over IREE's
buffers (create_dlpack_capsule); on a GPU, whose driver exports no result buffer, each is copied on the device
into one jax allocates. numpy leaves, complex values (float pairs in the model) and dtypes jax's DLPack does
not take are copied once.
"""
from __future__ import annotations

import atexit
import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import onnx
import iree.runtime as iree_rt
from iree.runtime import _binding as iree_binding  # disable_leak_checker (in iree.runtime's _binding.pyi)

from hlo2onnx import compat
from hlo2onnx.compat import mark_weak
from hlo2onnx.targets.iree import COMPILE_FLAGS  # the flags every model for the IREE targets records
from mnjit import background, persist
from mnjit.runtime import complex_as_pairs, host_to_jax, pairs_as_complex

# The CUDA architectures iree-compile 3.13 has target details for (it refuses sm_90 with "missing GPU target";
# measured): a newer GPU gets the newest of these at or below its own, whose PTX its driver compiles.
CUDA_ARCHS = (89, 86, 80, 75, 70, 61, 60)


@dataclass(frozen=True)
class Backend:
    """Where IREE compiles for and runs: iree-compile's flags, the runtime driver, and the jax platform of the
    arrays that cross."""

    driver: str
    flags: tuple[str, ...]
    platform: str


# The host CPU's features give the vector width jax's own CPU code uses. IREE's task-pool driver: its
# synchronous one ("local-sync", on the calling thread) was 7x faster on the 64x64 CFD step (343 small nodes:
# 0.35x jax.jit against 2.46x) and 10-15% slower on the MLP and transformer block, measured at load 8-10 on
# 2 cores.
# Convolutions as im2col + matmul: IREE's direct convolution codegen for llvm-cpu made the CNN row 25-34x
# jax.jit, im2col 2.4-3.2x in the same processes (8-11x faster, load 5.5-6.7; 2.0x at load 1.6), outputs the
# same to 1e-7 relative (benchmarks/bench_iree_flags.py; the other flags tried: docs/performance.md). Models
# without a convolution compile to the same code.
_CPU_FLAGS = ("--iree-hal-target-device=local", "--iree-hal-local-target-device-backends=llvm-cpu",
              "--iree-llvmcpu-target-cpu=host", "--iree-global-opt-use-im2col-for-convs")
CPU = Backend("local-task", (*_CPU_FLAGS, *COMPILE_FLAGS), "cpu")


def cuda_backend(device: jax.Device) -> Backend:
    """The CUDA backend for jax's GPU `device` (its compute capability picks the architecture)."""
    major, minor = (int(part) for part in str(device.compute_capability).split("."))
    arch = next((a for a in CUDA_ARCHS if a <= 10 * major + minor), None)
    if arch is None:
        raise IreeCompileError(f"IREE compiles for CUDA sm_{CUDA_ARCHS[-1]} and newer; {device} is "
                               f"sm_{major}{minor}")
    return Backend("cuda", ("--iree-hal-target-device=cuda", f"--iree-cuda-target=sm_{arch}", *COMPILE_FLAGS),
                   "gpu")


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
    """The process's IREE VM instance, one driver's device and its HAL module, shared by every compiled
    model for that driver."""

    def __init__(self, driver: str) -> None:
        self.instance = iree_rt.VmInstance()
        self.device = iree_rt.get_device(driver)
        self.hal = iree_rt.create_hal_module(self.instance, self.device)


_runtimes: dict[str, _Runtime] = {}
_modules: OrderedDict[str, bytes] = OrderedDict()
_lock = threading.Lock()


def _quiet_abandoned_objects() -> None:
    """At exit, target="auto" does not wait for a compile or trial under way in mnjit's background thread
    (mnjit/background.py): the IREE objects its frame holds are reclaimed with the process, and nanobind would
    print a screenful of "leaked instances/types/functions" about them."""
    if background.WORKER.busy:
        iree_binding.disable_leak_checker()


atexit.register(_quiet_abandoned_objects)


def runtime(driver: str = CPU.driver) -> _Runtime:
    with _lock:
        if driver not in _runtimes:
            _runtimes[driver] = _Runtime(driver)
        return _runtimes[driver]


def compiled(proto: onnx.ModelProto, backend: Backend = CPU) -> bytes:
    """The .vmfb of `proto` (its graph named ENTRY) for `backend`, compiled once per model content and
    flags in this process, and read from mnjit's persistent cache where another process compiled it."""
    digest = hashlib.sha256(proto.SerializeToString(deterministic=True))
    digest.update("\0".join(backend.flags).encode())
    key = digest.hexdigest()
    with _lock:
        if key in _modules:
            _modules.move_to_end(key)
            return _modules[key]
    disk_key = persist.iree_key(digest.digest())  # the persistent cache (mnjit/persist.py): other processes'
    vmfb = persist.load_module(disk_key)
    if vmfb is None:
        vmfb = compile_model(proto, backend)
        persist.store_module(disk_key, vmfb)
    with _lock:
        _modules[key] = vmfb
        while len(_modules) > _MAX_MODULES:
            _modules.popitem(last=False)
    return vmfb


def import_model(proto: onnx.ModelProto) -> bytes:
    """The model as MLIR bytecode in IREE's ONNX input dialect (what `iree-import-onnx` writes)."""
    # IREE's compiler is imported where a model is compiled: a module read from the cache needs only its runtime
    # (the compiler's import took 37 ms of a warm process's first call, measured).
    from iree.compiler.extras import onnx_importer  # noqa: PLC0415
    from iree.compiler.ir import Context  # noqa: PLC0415

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


def compile_model(proto: onnx.ModelProto, backend: Backend = CPU) -> bytes:
    """The .vmfb of `proto`: imported in-process, compiled by iree-compile in a subprocess (no cache)."""
    import iree.compiler as iree_compiler  # noqa: PLC0415 (see import_model)

    try:
        imported = import_model(proto)
        with background.WORKER.unguarded():  # a subprocess: exit need not wait for it
            return iree_compiler.compile_str(imported, input_type="onnx", extra_args=list(backend.flags))
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
    """One compiled IREE module; `run` takes flat jax/numpy leaves and returns flat jax.Arrays on the backend's
    device."""

    def __init__(self, model_bytes: bytes, in_avals: Sequence, out_avals: Sequence, backend: Backend = CPU):
        self.in_dtypes = [np.dtype(a.dtype) for a in in_avals]
        self.out_avals = list(out_avals)
        for dtype in {*self.in_dtypes, *(np.dtype(a.dtype) for a in self.out_avals)}:
            if dtype not in _ELEMENT and dtype not in _COMPLEX:
                raise TypeError(f"IREE runner: dtype {dtype} cannot cross into IREE")
        proto = onnx.load_from_string(model_bytes)
        if len(proto.graph.input) != len(in_avals) or len(proto.graph.output) != len(out_avals):
            raise ValueError(f"ONNX model has {len(proto.graph.input)} inputs and {len(proto.graph.output)} "
                             f"outputs, the signature {len(in_avals)} and {len(out_avals)}")
        # Run as written: the pipeline wrote it for the target, rewrites included (hlo2onnx/targets/iree_rewrite.py).
        proto.graph.name = ENTRY
        self.backend = backend
        self._rt = runtime(backend.driver)
        self._module = iree_rt.VmModule.copy_buffer(self._rt.instance, compiled(proto, backend))
        self._function = self._module.lookup_function(ENTRY)
        self._contexts = [self._context()]  # idle VM contexts: one per concurrent call (they are not shared)
        self._pool_lock = threading.Lock()
        self._out_dtypes = [np.dtype(a.dtype) for a in self.out_avals]
        self._out_shapes = [tuple(a.shape) for a in self.out_avals]
        # The element type each result must carry: IREE gives unsigned results of arithmetic as signed ones.
        self._out_elements = [_ELEMENT.get(_COMPLEX.get(d, d)) for d in self._out_dtypes]
        self._weak = [i for i, a in enumerate(self.out_avals) if getattr(a, "weak_type", False)]
        self._jax_device = jax.devices(backend.platform)[0]
        # Whether DLPack crosses in each direction; set to the reason once it fails, and copies are made instead.
        self.copy_reason: dict[str, str] = {}

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
            # Synchronous: the module's entry point waits for its device work (IREE's sync wrapper of the
            # async function), so results are complete when it returns, on any driver.
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
                and "in" not in self.copy_reason and leaf.is_fully_addressable \
                and leaf.devices() == {self._jax_device}:
            # Zero-copy: IREE reads the jax buffer in place (the capsule keeps it alive until IREE lets go).
            # IREE does not wait on jax's stream: the value must be written first.
            leaf.block_until_ready()
            try:
                return device.from_dlpack_capsule(leaf.__dlpack__())
            except (RuntimeError, ValueError) as e:  # this IREE build or driver imports no such buffer
                self.copy_reason["in"] = f"{type(e).__name__}: {e}"
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
        on_cpu = self.backend.platform == "cpu"
        if dtype not in _COMPLEX:
            if on_cpu:  # zero-copy: jax holds IREE's result buffer (copied only when it is not 64-byte aligned)
                capsule = self._rt.device.create_dlpack_capsule(view, compat.KDL_CPU, 0)
                return compat.dlpack_to_buffer(capsule, self._jax_device, None, None, compat.KDL_CPU)
            if 0 in shape:  # nothing to copy (IREE refuses empty copies)
                return jnp.zeros(shape, dtype, device=self._jax_device)
            if "out" not in self.copy_reason:
                try:
                    return self._device_copy(view, dtype, shape)
                except (RuntimeError, ValueError) as e:  # the driver imports no jax buffer: through the host
                    self.copy_reason["out"] = f"{type(e).__name__}: {e}"
        # Complex values (pairs in the model), or a device buffer IREE cannot hand over: one copy through the host.
        if on_cpu:
            host = np.array(view.map().asarray(shape, _COMPLEX.get(dtype, dtype)))
        else:
            host = np.asarray(iree_rt.DeviceArray(self._rt.device, view, implicit_host_transfer=True).to_host())
        if dtype in _COMPLEX:
            host = pairs_as_complex(host.view(_COMPLEX[dtype]), dtype)
        return host_to_jax(host, self._jax_device) if on_cpu else jax.device_put(host, self._jax_device)

    def _device_copy(self, view: iree_rt.HalBufferView, dtype: np.dtype, shape: tuple) -> jax.Array:
        """The result copied on the device into a new jax array's buffer. IREE's CUDA driver (3.13) exports
        none of its result buffers by DLPack ("CUDA buffer type is not supported for export", measured on an
        H100), but it imports jax's, and a device-to-device copy is far cheaper than a trip through the host."""
        target = jnp.empty(shape, dtype, device=self._jax_device)
        target.block_until_ready()  # jax's stream has finished allocating it before IREE's writes
        device = self._rt.device
        imported = device.from_dlpack_capsule(target.__dlpack__())
        semaphore = device.create_semaphore(0)
        device.queue_copy(view.get_buffer(), imported.get_buffer(), iree_rt.HalFence.create_at(semaphore, 0),
                          iree_rt.HalFence.create_at(semaphore, 1))
        iree_rt.HalFence.create_at(semaphore, 1).wait()
        return target
