"""mnjit's ahead-of-time stages (lower, compile, Lowered, Compiled) and its static options, against jax.jit's."""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import hlo2onnx

from harness import assert_same, rand
from mnjit import mnjit
from mnjit.capture import Capture


# -- ahead-of-time stages, as jax.jit's ------------------------------------------------------------------------
def _scaled(x, y, *, power):
    return jnp.sin(x) * y ** power


@pytest.mark.parametrize("options", [{}, {"fallback": True}, {"max_cache_size": 2}],
                         ids=["default", "fallback", "capped"])
def test_lower_compile_call_matches_jax_jit(options, monkeypatch):
    f = mnjit(_scaled, static_argnames="power", **options)
    x, y = rand((3, 2)), np.float32(1.5)
    spec = jax.ShapeDtypeStruct((3, 2), jnp.float32)
    lowered = f.lower(spec, y, power=2)
    monkeypatch.setattr(Capture, "lower", lambda *a: pytest.fail("compile() translated again"))
    compiled = lowered.compile()
    assert f.translations == 1  # compile() cached the lowering's translation; the calls below reuse it
    assert "stablehlo.sine" in lowered.as_text()  # the caller's lowering keeps its StableHLO
    # Called with the dynamic arguments only, as jax's Compiled is.
    assert_same(compiled(x, y), jax.jit(_scaled, static_argnames="power").lower(spec, y, power=2).compile()(x, y))
    assert_same(f(x, y, power=2), compiled(x, y))
    assert f.translations == 1
    assert "Sin" in compiled.as_text()


def _scaled_positional(x, y, power):
    return _scaled(x, y, power=power)


def test_compiled_refuses_another_signature():
    compiled = mnjit(_scaled_positional, static_argnums=2).lower(rand((3, 2)), np.float32(1.5), 2).compile()
    assert_same(compiled(rand((3, 2)), np.float32(1.5)), jax.jit(_scaled_positional, static_argnums=2)(rand((3, 2)), np.float32(1.5), 2))
    with pytest.raises(TypeError, match=r"compiled for .*float32\[3, 2\].* called with .*float32\[4, 2\]"):
        compiled(rand((4, 2)), np.float32(1.5))
    with pytest.raises(TypeError, match="structure"):
        compiled(rand((3, 2)))


@pytest.mark.parametrize("power", [2, 3], ids=["same_value", "other_value"])
@pytest.mark.parametrize("options", [{}, {"fallback": True}], ids=["whole", "fallback"])
def test_compiled_refuses_a_static_argument_passed_again(power, options):
    """A static keyword given to the compiled signature again: jax's Compiled refuses it (another pytree); mnjit
    ran the lowering's power=2 whatever was passed (x * 1.5**2 for power=3)."""
    spec, x, y = jax.ShapeDtypeStruct((3, 2), jnp.float32), rand((3, 2)), np.float32(1.5)
    with pytest.raises(TypeError):
        jax.jit(_scaled, static_argnames="power").lower(spec, y, power=2).compile()(x, y, power=power)
    compiled = mnjit(_scaled, static_argnames="power", **options).lower(spec, y, power=2).compile()
    with pytest.raises(TypeError, match="static argument.* power"):
        compiled(x, y, power=power)


@pytest.mark.parametrize("lowered_with, called_with", [
    (2.0, np.float32(3.0)),  # lowered with a Python float, called with a float32 scalar
    (np.float32(2.0), 3.0),  # and the other way round: jax's Compiled checks types without weakness
    (2, jnp.int32(3)),
], ids=["weak_lowered", "weak_called", "weak_int_lowered"])
@pytest.mark.parametrize("fallback", [False, True], ids=["whole", "fallback"])
def test_compiled_accepts_another_weak_type_and_runs_its_own_signature(lowered_with, called_with, fallback):
    def fun(x, y):
        return y * 2, x + y
    x = rand((3,))
    compiled = mnjit(fun, fallback=fallback).lower(x, lowered_with).compile()
    expected = jax.jit(fun).lower(x, lowered_with).compile()(x, called_with)
    assert_same(compiled(x, called_with), expected)  # weak types as the lowering's, as jax's


def test_compiled_runs_under_another_x64_mode():
    def fun(x):
        return x * 2, jnp.arange(3) + x.astype(int)
    x = rand((3,))
    compiled, expected = mnjit(fun).lower(x).compile(), jax.jit(fun).lower(x).compile()
    with jax.enable_x64(True):
        assert_same(compiled(x), expected(x))
        with pytest.raises(TypeError, match=r"called with .*float64\[3\]"):
            compiled(x.astype(np.float64))


@pytest.mark.parametrize("static", [False, True], ids=["no_static", "static"])
def test_compiled_without_static_arguments_takes_its_own_signature(static):
    """jax's Compiled called with the lowering's own signature runs (the arguments' tuple is the cache key's
    structure whether or not static positions are put back into it)."""
    fun = _scaled_positional if static else (lambda x, y: _scaled(x, y, power=2))
    options = {"static_argnums": 2} if static else {}
    extra = (2,) if static else ()
    x, y = rand((3, 2)), rand((3, 2), seed=1)
    spec = jax.ShapeDtypeStruct((3, 2), jnp.float32)
    compiled = mnjit(fun, **options).lower(spec, y, *extra).compile()
    expected = jax.jit(fun, **options).lower(spec, y, *extra).compile()
    assert_same(compiled(x, y), expected(x, y))
    by_keyword = mnjit(lambda x, y: x - y).lower(x, y=y).compile()
    assert_same(by_keyword(x, y=y), jax.jit(lambda x, y: x - y).lower(x, y=y).compile()(x, y=y))


def _affine(x, *rest):
    return x * rest[0] + rest[1]


X3 = rand((3,))
# static_argnums, the call's arguments, the positions that stay dynamic
VARARGS_CASES = {
    "last_of_3": (-1, (X3, 2.0, 3), (0, 1)),
    "last_of_4": (-1, (X3, np.float32(2), 4.0, 5), (0, 1, 2)),
    "two_last": ((-1, -2), (X3, 2, 3), (0,)),
    "positive": (2, (X3, 2.0, 3), (0, 1)),
}


@pytest.mark.parametrize("name", list(VARARGS_CASES))
def test_negative_static_argnums_with_varargs_count_from_the_call(name):
    """With *args, jax.jit counts a negative static position from the end of each call's arguments."""
    argnums, args, dynamic = VARARGS_CASES[name]
    f, ref = mnjit(_affine, static_argnums=argnums), jax.jit(_affine, static_argnums=argnums)
    assert_same(f(*args), ref(*args))
    assert_same(f.lower(*args).compile()(*[args[i] for i in dynamic]), ref(*args))


def _three(x, n, b=1.0):
    return x * n + b


# Static positions and names jax.jit refuses when it wraps the function: mnjit refuses them too, in its words.
BAD_STATIC = [{"static_argnums": -5}, {"static_argnums": (1, -4)}, {"static_argnums": 7}, {"static_argnames": "zz"}]


@pytest.mark.parametrize("options", BAD_STATIC, ids=str)
def test_static_options_jax_jit_refuses_are_refused(options):
    with pytest.raises(ValueError) as expected:
        jax.jit(_three, **options)
    with pytest.raises(ValueError, match=re.escape(str(expected.value))):
        mnjit(_three, **options)


# jax_debug_nans / jax_debug_infs: (the context turning it on, a function making the value, one that does not).
DEBUG_CHECKS = {
    "nans": (jax.debug_nans, lambda a: jnp.log(a - 1), lambda a: jnp.log(a + 1)),
    "infs": (jax.debug_infs, lambda a: 1 / a, lambda a: (1 / (a + 1), a.astype(jnp.int32))),
}


@pytest.mark.parametrize("options", [{}, {"max_cache_size": 2}, {"fallback": True}],
                         ids=["fast", "capped", "fallback"])
@pytest.mark.parametrize("name", list(DEBUG_CHECKS))
def test_debug_nans_and_infs_raise_like_jax_jit(name, options):
    debug, bad, good = DEBUG_CHECKS[name]
    x = jnp.arange(3.0)
    ours = mnjit(bad, **options)
    ours(x)  # cached before the check is turned on
    with debug(True):
        with pytest.raises(FloatingPointError) as expected:
            jax.jit(bad)(x)
        with pytest.raises(FloatingPointError, match=re.escape(str(expected.value))):
            ours(x)
        assert_same(mnjit(good, **options)(x), jax.jit(good)(x))


def test_trace_eval_shape_and_compiler_ir_are_jax_jits():
    f, jitted = mnjit(_scaled, static_argnames="power"), jax.jit(_scaled, static_argnames="power")
    x, y = rand((3, 2)), np.float32(1.5)
    assert str(f.trace(x, y, power=2).jaxpr) == str(jitted.trace(x, y, power=2).jaxpr)
    assert f.eval_shape(x, y, power=2) == jitted.eval_shape(x, y, power=2)
    assert str(f.lower(x, y, power=2).compiler_ir("stablehlo")) == str(
        jitted.lower(x, y, power=2).compiler_ir("stablehlo"))


def test_disable_jit_runs_the_function_op_by_op():
    """Under jax.disable_jit(), as jax.jit's function does: concrete values inside (float() of one works), and
    nothing translated."""
    def f(x, n):
        return x * float(x.sum()) + n

    g = mnjit(f, static_argnums=1)
    x = jnp.asarray(rand((3,)))
    with jax.disable_jit():
        assert_same(g(x, 2), jax.jit(f, static_argnums=1)(x, 2))
    assert g.translations == 0
    with pytest.raises(jax.errors.ConcretizationTypeError):
        g(x, 2)


@pytest.mark.parametrize("fallback", [False, True])
def test_stage_descriptions_are_jax_jits(fallback):
    """args_info, in_avals, in/out trees and out_info of the Lowered and the Compiled, as jax.jit's give them;
    as_text takes jax's dialect, compile jax's compiler_options."""
    f, jitted = mnjit(_scaled, static_argnames="power", fallback=fallback), jax.jit(_scaled, static_argnames="power")
    x, y = rand((3, 2)), np.float32(1.5)
    theirs = jitted.lower(x, y, power=2)
    ours = f.lower(x, y, power=2)
    for stage in (ours, ours.compile(compiler_options={})):
        for name in ("in_avals", "in_tree", "out_tree"):
            assert getattr(stage, name) == getattr(theirs, name), name
        assert str(stage.args_info) == str(theirs.args_info)
        assert str(stage.out_info) == str(theirs.out_info)
    if not fallback:
        assert ours.as_text("hlo") == theirs.as_text("hlo")
        assert "loc(" in ours.as_text(debug_info=True) and "loc(" not in ours.as_text()


@pytest.mark.parametrize("fallback", [False, True])
def test_cost_analysis_is_jax_jits(fallback):
    f, jitted = mnjit(_scaled, static_argnames="power", fallback=fallback), jax.jit(_scaled, static_argnames="power")
    x, y = rand((3, 2)), np.float32(1.5)
    expected = jitted.lower(x, y, power=2).cost_analysis()
    lowered = f.lower(x, y, power=2)
    assert lowered.cost_analysis()["flops"] == expected["flops"] > 0
    assert lowered.compile().cost_analysis()["flops"] == expected["flops"]


@pytest.mark.parametrize("target, backend, ok", [("ort-cuda", "gpu", True), ("ort-cuda", "cuda", True),
                                                 ("ort-cuda", "cpu", False), ("ort-cpu", "cpu", True),
                                                 ("ort-cpu", "gpu", False), ("iree-cuda", "gpu", True)])
def test_placement_names_the_target_device(target, backend, ok):
    from mnjit import jit_options

    target = hlo2onnx.targets.get(target)
    if ok:
        jit_options.check_placement(target, None, backend, None, None)
    else:
        with pytest.raises(ValueError, match=f"backend='{backend}'"):
            jit_options.check_placement(target, None, backend, None, None)
