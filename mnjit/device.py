"""Where a target runs: the runtime package, its providers and device, checked once when mnjit is asked for it.

A target whose runtime or device is missing is refused with one error that
says what to install or which device is absent; mnjit never runs it somewhere
else instead.
"""
from __future__ import annotations

import dataclasses
import importlib.util
from typing import TYPE_CHECKING, Protocol, Sequence

import jax
import onnx_ir as ir

from hlo2onnx import Target
from mnjit import openvino_consent

if TYPE_CHECKING:
    from mnjit.ffi import FfiSession


class TargetUnavailableError(RuntimeError):
    """The target's runtime package, execution provider or device is not on this machine."""


class Runner(Protocol):
    def run(self, leaves: Sequence) -> list[jax.Array]: ...


_INSTALL = {
    "CUDAExecutionProvider": "pip install -e '.[cuda]' from mnjit's checkout (onnxruntime-gpu and jax's CUDA plugin, in place of "
                             "onnxruntime)",
    "TensorrtExecutionProvider": "pip install -e '.[cuda]' from mnjit's checkout, and NVIDIA TensorRT",
}


def own_ort_cpu(target: Target) -> bool:
    """Whether mnjit's own ORT CPU session (mnjit/ffi.py) runs `target`: ONNX Runtime's CPU provider alone,
    without options or a runner of the target's own."""
    return (target.runtime == "onnxruntime" and target.device == "cpu" and target.runner is None
            and tuple(target.providers) == ("CPUExecutionProvider",) and not target.provider_options)


def require(target: Target) -> None:
    """Raises TargetUnavailableError unless this machine can run `target` (a declared target's own runner
    is taken as able to)."""
    if target.runner is not None:
        return
    if target.runtime == "openvino":
        if importlib.util.find_spec("openvino") is None:
            raise TargetUnavailableError(f"target {target.name} runs on OpenVINO, which is not installed: "
                                         "pip install openvino")
    elif target.runtime == "iree":
        if any(importlib.util.find_spec(name) is None for name in ("iree", "iree.compiler", "iree.runtime")):
            raise TargetUnavailableError(f"target {target.name} runs on IREE, which is not installed: "
                                         "pip install 'mnjit[iree]' (iree-base-compiler, iree-base-runtime)")
    elif target.runtime == "onnxruntime":
        import onnxruntime as ort

        wanted = target.providers[0]
        if wanted not in ort.get_available_providers():
            hint = _INSTALL.get(wanted, f"an onnxruntime build with {wanted}")
            raise TargetUnavailableError(
                f"target {target.name} needs ONNX Runtime's {wanted}, which this onnxruntime "
                f"({ort.__version__}: {', '.join(ort.get_available_providers())}) lacks: {hint}")
    else:
        raise TargetUnavailableError(f"target {target.name}: unknown runtime {target.runtime!r}")
    if target.device != "cpu":
        try:
            devices = jax.devices(target.device)
        except RuntimeError:
            devices = []
        if not devices:
            raise TargetUnavailableError(f"target {target.name} runs on a {target.device.upper()}, and jax sees "
                                         f"none on this machine (jax.devices(): {jax.devices()})")


def make_runner(target: Target, model: ir.Model, in_avals: Sequence, out_avals: Sequence,
                session: FfiSession | None = None, *, iree_driver: str | None = None) -> Runner:
    """The runner for one translated signature on `target` (its availability already checked); `session`,
    mnjit's C session of the model when one was made already (ort-cpu, core); `iree_driver`, IREE's runtime
    driver instead of the target's own (target="auto" times both of IREE's CPU drivers)."""
    if not out_avals:
        from mnjit.runtime import DroppedOutputs, NoOutputRunner

        if not model.graph.outputs:
            return NoOutputRunner()
        # Run for host callbacks' effects only: the model's one output is their order token (hlo2onnx.host_calls).
        token = jax.ShapeDtypeStruct((), bool)
        return DroppedOutputs(make_runner(target, model, in_avals, [token], session, iree_driver=iree_driver))
    if target.runner is not None:  # a declared target's own (hlo2onnx.targets.declare)
        return target.runner(ir.to_proto(model).SerializeToString(), in_avals, out_avals)
    if target.runtime == "openvino":
        openvino_consent.decline_unless_decided()  # before openvino's import sends its event from a fork
        from mnjit.openvino_runner import OpenVinoRunner

        return OpenVinoRunner(ir.to_proto(model).SerializeToString(), in_avals, out_avals)
    if target.runtime == "iree":
        from mnjit.iree_runner import CPU, IreeRunner, cuda_backend

        backend = CPU if target.device == "cpu" else cuda_backend(jax.devices(target.device)[0])
        if iree_driver is not None:
            backend = dataclasses.replace(backend, driver=iree_driver)  # the same compiled module
        return IreeRunner(ir.to_proto(model).SerializeToString(), in_avals, out_avals, backend)
    if target.device != "cpu":
        from mnjit.cuda_runner import CudaOrtRunner

        return CudaOrtRunner(model, in_avals, out_avals, target.providers)
    from mnjit.runtime import OrtRunner

    if not own_ort_cpu(target):  # a declared target's providers, with their options
        providers = list(zip(target.providers, target.provider_options)) if target.provider_options \
            else target.providers
        return OrtRunner(model, in_avals, out_avals, providers)
    from mnjit import ffi

    if session is None:
        session = ffi.create(model, in_avals, out_avals)  # mnjit's own ORT environment and thread pool
    if session is not None:
        return ffi.FfiRunner(session, in_avals, out_avals)
    return OrtRunner(model, in_avals, out_avals, target.providers)
