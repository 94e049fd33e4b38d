"""`python -m hlo2onnx`: the same as the `hlo2onnx` command."""
import sys

from hlo2onnx.cli import main

sys.exit(main())
