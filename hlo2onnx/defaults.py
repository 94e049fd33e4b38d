"""Constants the `hlo2onnx` command's parser shows, in a module that imports nothing: `hlo2onnx --help` and
`--version` answer without loading jax, onnx or the rules (hlo2onnx.cli)."""
from __future__ import annotations

__version__ = "0.1.0"  # setup.cfg's

DEFAULT_OPSET = 21  # ONNX opset of the models written (pipeline.check_opset takes MIN_OPSET..MAX_OPSET)
MIN_OPSET, MAX_OPSET = 18, 26
# The largest batch Triton's dynamic batcher forms, and clients may send, unless told otherwise (serving).
DEFAULT_MAX_BATCH_SIZE = 32
# The default target's name (hlo2onnx.TARGETS lists them all).
DEFAULT_TARGET = "ort-cpu"
