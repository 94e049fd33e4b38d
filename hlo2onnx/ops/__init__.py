"""Translation rules, one module per op family. Importing this fills RULES."""
from hlo2onnx.ops import constant, control, dot, elementwise, reduce, shape  # noqa: F401
