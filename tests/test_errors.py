"""Error locations: the first frame outside jax and mnjit, from the whole traceback a StableHLO location carries."""
from __future__ import annotations

import importlib.util
import os

import jax
import jax.numpy as jnp
import pytest

import hlo2onnx
import mnjit as mnjit_package
from hlo2onnx.errors import source_frames, source_line
from mnjit import mnjit

MNJIT_API = os.path.join(os.path.dirname(mnjit_package.__file__), "api.py")
JAX_FILE = importlib.util.find_spec("jax").origin


def test_library_and_mnjit_frames_are_skipped():
    location = (f'loc(callsite("trace"("{MNJIT_API}":147:8) at callsite("eigvals"("{JAX_FILE}":10:1) at '
                f'callsite("helper"("/home/u/lib/mylib.py":3:11) at "/home/u/train.py":20:4))))')
    assert source_line(location) == "/home/u/lib/mylib.py:3"
    assert source_frames(location) == ["/home/u/lib/mylib.py:3", "/home/u/train.py:20"]
    assert source_line(f'loc("{MNJIT_API}":147:8)') is None


def test_frames_inside_the_onnx_libraries_hlo2onnx_calls_are_skipped():
    # A fusion's check runs inside onnxscript's rewriter; jax code it traces there is not the user's.
    rewriter = os.path.join(os.path.dirname(importlib.util.find_spec("onnxscript").origin), "rewriter", "_pattern_ir.py")
    location = f'loc(callsite("check"("{rewriter}":978:8) at "/home/u/train.py":20:4))'
    assert source_line(location) == "/home/u/train.py:20"


def test_unsupported_op_in_library_code_names_the_library_line(tmp_path, monkeypatch):
    (tmp_path / "somelib.py").write_text("import jax.lax as lax\n\n\ndef helper(x):\n"
                                         "    return lax.rng_uniform(0.0, 1.0, x.shape) + x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import somelib

    with pytest.raises(hlo2onnx.UnsupportedOpError) as info:
        mnjit(lambda x: somelib.helper(x) * 2)(jnp.eye(3))
    assert f"{tmp_path / 'somelib.py'}:5" in str(info.value)
    assert "mnjit" not in str(info.value).split("(at ")[-1]


def test_deprecated_rng_is_refused_by_name_and_line():
    """lax.rng_uniform lowers to stablehlo.rng, which the legalization pass must not turn into a module error."""
    import inspect

    import numpy as np
    from jax import lax

    def draw():
        return lax.rng_uniform(np.float32(0), np.float32(1), (3,))

    with pytest.raises(hlo2onnx.UnsupportedOpError, match="unsupported op stablehlo.rng: .*use jax.random") as info:
        mnjit(draw)()
    assert info.value.op_name == "stablehlo.rng"
    assert f"{__file__}:{inspect.getsourcelines(draw)[1] + 1}" in str(info.value)


def _apply(model, x):
    return model["scale"] * x + model["act"](x)


@pytest.mark.parametrize("options", [{}, {"max_cache_size": 2}, {"fallback": True}], ids=["fast", "capped", "fallback"])
def test_a_non_array_argument_gets_jax_jits_error(options):
    """An argument jax cannot abstract (a function inside a pytree, as an equinox module holds) is refused with
    jax.jit's own message, which names the user's function and the argument's path, on every call path."""
    model = {"scale": jnp.float32(2.0), "act": jnp.tanh}
    with pytest.raises(TypeError) as expected:
        jax.jit(_apply)(model, jnp.ones(3))
    with pytest.raises(TypeError) as raised:
        mnjit(_apply, **options)(model, jnp.ones(3))
    message = str(raised.value)
    assert "_apply" in message and "model['act']" in message, message
    assert message.splitlines()[0].split(" at 0x")[0] == str(expected.value).splitlines()[0].split(" at 0x")[0]
