"""hlo2onnx's Python API refuses wrong arguments where they come in, with a TypeError or ValueError naming what it
takes: never an AttributeError from deep inside, a failure only when the model is saved, or a vacuous result."""
from __future__ import annotations

import io

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

import hlo2onnx


def _lowered():
    return jax.jit(lambda x: jnp.tanh(x) * 2).lower(np.ones((2, 3), np.float32))


def _symbolic():
    spec = jax.ShapeDtypeStruct(export.symbolic_shape("b, 3"), np.float32)
    return hlo2onnx.convert(export.export(jax.jit(lambda x: x * 2))(spec), dynamic=True)


# (the call, the exception, what its message says)
BAD_CALLS = {
    "convert-int": (lambda: hlo2onnx.convert(3), TypeError, "got int"),
    "convert-jitted-function": (lambda: hlo2onnx.convert(jax.jit(jnp.sin)), TypeError, r"jax.jit\(f\).lower"),
    "convert-file-object": (lambda: hlo2onnx.convert(io.BytesIO(b"")), TypeError, "got BytesIO"),
    # accepted, and refused by onnx_ir only in save() (a SerdeError)
    "convert-name-int": (lambda: hlo2onnx.convert(_lowered(), name=3), TypeError, "graph name must be a str"),
    # AttributeError: 'str' object has no attribute 'context'
    "translate-text": (lambda: hlo2onnx.translate(_lowered().as_text()), TypeError, "mlir.Module.*got str"),
    # (a Lowered translates, with its constant arguments: tests/test_const_args.py; an Exported goes to convert)
    "translate-exported": (lambda: hlo2onnx.translate(export.export(jax.jit(jnp.tanh))(np.ones(3, np.float32))),
                           TypeError, "got Exported"),
    "translate-report-none": (lambda: hlo2onnx.translate_report(None), TypeError, "got NoneType"),
    # no run at all: the check passed having compared nothing
    "check-no-sizes-static": (lambda: hlo2onnx.convert(_lowered()).check(sizes=()), ValueError, "non-empty"),
    "check-no-sizes-symbolic": (lambda: _symbolic().check(sizes=[]), ValueError, "non-empty"),
    "check-negative-size": (lambda: _symbolic().check(sizes=(-1,)), ValueError, "integers >= 0"),
    "check-float-size": (lambda: _symbolic().check(sizes=(2.5,)), ValueError, "integers >= 0"),
    "check-size-not-sequence": (lambda: _symbolic().check(sizes=3), ValueError, "sequence"),
}


@pytest.mark.parametrize("case", list(BAD_CALLS))
def test_bad_arguments_are_refused_at_the_boundary(case):
    call, error, message = BAD_CALLS[case]
    with pytest.raises(error, match=message):
        call()


@pytest.mark.parametrize("sizes", [(2,), [1, 4], (0,)], ids=["one", "list", "zero"])
def test_check_sizes_still_run(sizes):
    result = hlo2onnx.convert(_lowered()).check(sizes=sizes)
    assert result.ok and result.runs == 1
