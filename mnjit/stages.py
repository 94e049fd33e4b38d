"""What mnjit's AOT stages hand back, as jax.stages does: a lowered signature and its compiled form."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import onnx
import onnx_ir as ir

import hlo2onnx
from hlo2onnx import names
from hlo2onnx.files import save_model
from mnjit import host_callbacks, tiering


def _of_trace(name: str) -> property:
    return property(lambda self: getattr(self.traced, name), doc=f"The trace's `{name}` (jax.stages.Traced).")


class TracedInfo:
    """jax.stages' description of a signature, read from the trace the stage was made from (`traced`), as jax's
    Lowered and Compiled give it."""

    traced: Any
    args_info = _of_trace("args_info")
    in_avals = _of_trace("in_avals")
    in_tree = _of_trace("in_tree")
    out_info = _of_trace("out_info")
    out_tree = _of_trace("out_tree")


@dataclass
class MnjitLowered(TracedInfo):
    """One captured signature: its jaxpr, StableHLO and ONNX model."""

    traced: Any
    lowered: Any
    model: ir.Model
    conversion: hlo2onnx.ConversionReport | None = None
    # Keeps the signature's Python callbacks callable (mnjit/host_callbacks.py).
    callbacks: host_callbacks.Registration | None = None
    # A lowering over symbolic dims goes through jax.export (its StableHLO is the artifact's).
    exported: Any = None
    tier: Callable[[], tiering.TierStatus] | None = None  # target="auto": which tier serves the signature
    compiler: Callable[[], Compiled] | None = None  # set by MnjitFunction.lower for concrete signatures
    # The key of its translation in mnjit's persistent cache (None: not stored there), and whether the
    # translation was read from it (mnjit/persist.py).
    cache_key: str | None = None
    from_cache: bool = False

    def report(self) -> str:
        """Under target="auto" first which tier serves the signature and whether that is decided; the signature
        (the ONNX inputs and outputs, by name) and where the model runs; then per StableHLO op kind the ONNX op
        types it became, the fusions that fired, node counts before/after, and the nodes the target runs on its
        fallback."""
        lines = [f"auto: {self.tier()}"] if self.tier is not None else []
        lines.append(f"signature: {names.signature(self.model)}")
        target = self.conversion.target if self.conversion is not None else None
        if target is not None:
            fallback = f", nodes it lacks on {target.fallback.name}" if target.fallback is not None else ""
            # Under "auto" the model below is the base tier's, which serves until the line above says otherwise.
            label = "base tier" if self.tier is not None else "runs on"
            lines.append(f"{label}: {target.name} ({target.runtime} on {target.device}{fallback})")
        return "\n".join(lines) + "\n" + str(self.conversion)

    def compile(self, compiler_options: dict | None = None) -> Compiled:
        """The signature ready to call (`compiler_options`, XLA's, are accepted as jax.jit's are)."""
        return compile_lowered(self)

    @property
    def jaxpr(self):
        return self.traced.jaxpr

    def compiler_ir(self, dialect: str = "stablehlo"):
        """jax's lowering's IR (jax.stages.Lowered.compiler_ir); the ONNX model is `model`."""
        if self.lowered is None:
            raise ValueError("a lowering with symbolic dims keeps jax.export's module: see as_text()")
        return self.lowered.compiler_ir(dialect)

    def cost_analysis(self) -> Any:
        """jax's estimate for the program (jax.stages.Lowered.cost_analysis): flops and bytes of the StableHLO
        mnjit translated."""
        if self.lowered is None:
            raise ValueError("a lowering with symbolic dims has no cost analysis")
        return self.lowered.cost_analysis()

    def as_text(self, dialect: str | None = None, *, debug_info: bool = False) -> str:
        """jax's lowering as text (jax.stages.Lowered.as_text); the ONNX model is `model`."""
        if self.exported is not None:
            if dialect not in (None, "stablehlo"):
                raise ValueError("a lowering with symbolic dims keeps jax.export's StableHLO only")
            return self.exported.mlir_module()
        return self.lowered.as_text(dialect, debug_info=debug_info)

    @property
    def onnx_model(self) -> onnx.ModelProto:
        """The model as an onnx.ModelProto (built on each access: the cache keeps only the onnx-ir model)."""
        return ir.to_proto(self.model)

    @property
    def model_bytes(self) -> bytes:
        return self.onnx_model.SerializeToString()

    def save(self, path: str | os.PathLike, external_data: str | None = None, *,
             input_names: Sequence[str] | str | None = None, output_names: Sequence[str] | str | None = None,
             inputs_as_nchw: Sequence[str] | str = (), outputs_as_nchw: Sequence[str] | str = ()) -> None:
        """Writes the model to `path`, atomically: a failure leaves any existing file as it was.

        Weights go to the file `external_data` (a name relative to `path`'s folder) when given, and always
        when they exceed protobuf's 2 GB limit (then beside `path`, as `<name>.data`).
        A model holding Python host callbacks is refused: no runtime but mnjit's can call them.
        `input_names`, `output_names`, `inputs_as_nchw` and `outputs_as_nchw` are hlo2onnx.convert's: they change
        the saved file only, not the model this lowering runs.
        """
        host_callbacks.refuse_saving(self.callbacks, self.model)
        model = self.model
        if names.wanted(input_names, output_names, inputs_as_nchw, outputs_as_nchw):
            model = names.copy(model)
            names.apply(model, input_names=input_names, output_names=output_names, inputs_as_nchw=inputs_as_nchw,
                        outputs_as_nchw=outputs_as_nchw)
        save_model(model, path, external_data)


def compile_lowered(lowered: Any) -> Compiled:
    """`lowered.compile()`: the signature translated, its session made and cached, ready to call."""
    if lowered.compiler is None:
        raise ValueError("only a lowering of concrete arguments compiles (one with symbolic dims is for save(); "
                         "one made under a jax transformation runs as jax.jit does)")
    return lowered.compiler()


@dataclass
class Compiled(TracedInfo):
    """jax.stages.Compiled's counterpart: one signature ready to run, called (as jax's is) with the dynamic
    arguments only, the static ones being the lowering's; another signature is refused with a TypeError."""

    lowered: Any  # MnjitLowered or fallback.PartitionedLowered
    call: Callable[[tuple, dict], Any]

    def __call__(self, *args, **kwargs):
        return self.call(args, kwargs)

    @property
    def traced(self) -> Any:
        return self.lowered.traced

    def cost_analysis(self) -> Any:
        """The lowering's (jax's estimate: ONNX Runtime gives none)."""
        return self.lowered.cost_analysis()

    def as_text(self) -> str:
        """The ONNX model in ONNX's text syntax."""
        return onnx.printer.to_text(self.lowered.onnx_model)
