"""The mnjit decorator: jax.jit's calling conventions, cache, transformations, runtime hand-off and errors."""
from __future__ import annotations

import collections
import copy
import dataclasses
import functools
import gc
import inspect
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import pytest
from jax import export

import hlo2onnx
from harness import assert_same, rand
from mnjit import mnjit
from mnjit.runtime import OrtRunner


def test_cache_hit_does_not_retranslate():
    f = mnjit(lambda x, y: x * y + 1)
    x, y = jnp.ones((3,)), jnp.arange(3.0)
    f(x, y)
    f(x + 1, y)
    assert f.translations == 1


@pytest.mark.parametrize("second", [
    jnp.ones((4,)),                    # new shape
    jnp.ones((3,), jnp.int32),         # new dtype
    2.0,                               # python scalar: weak type, new shape
    np.ones((3,), np.float32),         # numpy: same abstract signature, so a cache hit
])
def test_new_signature_retraces_like_jit(second):
    f = mnjit(lambda x: x * 2)
    f(jnp.ones((3,)))
    assert_same(f(second), jax.jit(lambda x: x * 2)(second))
    hit = isinstance(second, np.ndarray)
    assert f.translations == (1 if hit else 2)


def test_static_argnums_and_argnames():
    def f(x, n, *, mode):
        return x * n if mode == "mul" else x + n
    by_num = mnjit(f, static_argnums=1, static_argnames="mode")
    x = jnp.arange(3.0)
    assert_same(by_num(x, 3, mode="mul"), jax.jit(f, static_argnums=1, static_argnames="mode")(x, 3, mode="mul"))
    assert_same(by_num(x, 3, mode="add"), x + 3)
    assert by_num.translations == 2
    by_name = mnjit(f, static_argnames=("n", "mode"))
    assert_same(by_name(x, n=2, mode="mul"), x * 2)
    with pytest.raises(ValueError, match="non-hashable"):
        by_num(x, [1], mode="mul")


def _by_type(x, n):
    """Branches on the static argument's type, as code dispatching on int/float/bool/tuple does."""
    if isinstance(n, tuple):
        return x * n[1] + 5
    return {bool: -x, int: x * 10, float: x + 100}.get(type(n), x - 1)


# Static arguments that are equal (and hash alike) but are other signatures for jax.jit: a call with each in turn.
STATIC_KEY_CASES = {
    "int_float_bool": ({"static_argnums": 1}, [((2,), {}), ((2.0,), {}), ((True,), {})]),
    "python_numpy": ({"static_argnums": 1}, [((2,), {}), ((np.int64(2),), {})]),
    "keyword_types": ({"static_argnames": "n"}, [((), {"n": 1}), ((), {"n": 1.0})]),
    "positional_tuple_vs_keyword": ({"static_argnums": 1}, [((), {"n": 2}), ((("n", 2),), {})]),
}


@pytest.mark.parametrize("name", list(STATIC_KEY_CASES))
def test_static_arguments_of_other_types_are_other_signatures(name):
    options, calls = STATIC_KEY_CASES[name]
    x = jnp.arange(3.0)
    ours, ref = mnjit(_by_type, **options), jax.jit(_by_type, **options)
    for args, kwargs in calls:
        assert_same(ours(x, *args, **kwargs), ref(x, *args, **kwargs))


# Configuration that changes what a cached signature computes: (a context setting it, function, arguments).
CONFIG_CASES = {
    "threefry_partitionable": (lambda: jax.threefry_partitionable(not jax.config.jax_threefry_partitionable),
                               lambda k: jax.random.normal(k, (5,)), (jax.random.key(0),)),
    "rank_promotion_raise": (lambda: jax.numpy_rank_promotion("raise"), jnp.add, (jnp.ones((2, 3)), jnp.ones(3))),
    "dtype_promotion_strict": (lambda: jax.numpy_dtype_promotion("strict"), jnp.add,
                               (jnp.ones(3), jnp.ones(3, jnp.int32))),
}


def _around_a_config_change(jit, config, fun, args):
    """A cached signature called again under another configuration, then back under the first."""
    fun = jit(fun)
    results = [fun(*args)]
    with config():
        try:
            results.append(fun(*args))
        except (TypeError, ValueError) as e:
            results.append(type(e).__name__)
    return results + [fun(*args)]


@pytest.mark.parametrize("options", [{}, {"max_cache_size": 2}], ids=["fast", "capped"])
@pytest.mark.parametrize("name", list(CONFIG_CASES))
def test_a_config_change_retraces_like_jax_jit(name, options):
    ours = _around_a_config_change(functools.partial(mnjit, **options), *CONFIG_CASES[name])
    ref = _around_a_config_change(jax.jit, *CONFIG_CASES[name])
    assert [type(r) for r in ours] == [type(r) for r in ref]
    for a, b in zip(ours, ref):
        if isinstance(b, str):
            assert a == b
        else:
            assert_same(a, b)


_FLOAT0 = np.zeros((3,), jax.dtypes.float0)
# float0 leaves (the gradients of integer arguments, jax.grad(..., allow_int=True)) in and out.
FLOAT0_CASES = {
    "grad_returns_float0": (jax.grad(lambda x, i: (x * i).sum(), argnums=(0, 1), allow_int=True), (jnp.ones(3), 2)),
    "float0_in_and_out": (lambda x, g: (x * 2, g), (jnp.ones(3), _FLOAT0)),
    "float0_in_a_pytree": (lambda x, g: x + 1, (jnp.ones(3), {"step": _FLOAT0})),
}


@pytest.mark.parametrize("options", [{}, {"max_cache_size": 2}, {"fallback": True}], ids=["fast", "capped", "fallback"])
@pytest.mark.parametrize("name", list(FLOAT0_CASES))
def test_float0_leaves_like_jax_jit(name, options):
    fun, args = FLOAT0_CASES[name]
    ours, ref = mnjit(fun, **options)(*args), jax.jit(fun)(*args)
    assert jax.tree_util.tree_structure(ours) == jax.tree_util.tree_structure(ref)
    for a, b in zip(jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(ref)):
        if b.dtype == jax.dtypes.float0:  # jax.jit gives a numpy array (no jax.Array holds float0)
            assert isinstance(a, np.ndarray) and (a.dtype, a.shape) == (b.dtype, b.shape)
        else:
            assert_same(a, b)


def test_unused_arguments_do_not_shift_inputs():
    def f(a, unused, b):
        return a - b
    a, u, b = jnp.ones((2,)), jnp.zeros((5,)), jnp.arange(2.0)
    assert_same(mnjit(f)(a, u, b), jax.jit(f)(a, u, b))


Point = collections.namedtuple("Point", "x y")


@functools.partial(jax.tree_util.register_dataclass, data_fields=["value"], meta_fields=["scale"])
@dataclasses.dataclass
class Scaled:
    value: jax.Array
    scale: float


def test_pytrees_in_and_out():
    def f(p: Point, s: Scaled, d: dict):
        return {"sum": p.x + p.y, "scaled": Scaled(s.value * s.scale, s.scale), "list": [d["k"], d["k"] * 2]}
    args = (Point(jnp.ones(2), jnp.arange(2.0)), Scaled(jnp.ones(3), 2.5), {"k": jnp.int32(7)})
    out = mnjit(f)(*args)
    assert_same(out, jax.jit(f)(*args))
    assert isinstance(out["scaled"], Scaled) and out["scaled"].scale == 2.5
    # Static data is part of the key: another scale is another trace.
    g = mnjit(f)
    g(*args)
    g(args[0], Scaled(jnp.ones(3), 3.0), args[2])
    assert g.translations == 2


def test_weak_types_and_dtypes_match_jit():
    def f(x, s):
        return x * s, s + 1, jnp.float32(2) * s, x.astype(jnp.int8)
    for args in [(jnp.ones(3), 2.0), (jnp.ones(3, jnp.float16), 3), (np.ones(3, np.float32), np.float32(2))]:
        assert_same(mnjit(f)(*args), jax.jit(f)(*args))


def test_grad_vmap_and_outer_jit_trace_through():
    f = mnjit(lambda w, x: jnp.tanh(x @ w).sum())
    w, x = rand((4, 3)), rand((5, 4), seed=1)
    ref = jax.jit(lambda w, x: jnp.tanh(x @ w).sum())
    assert_same(jax.grad(f)(w, x), jax.grad(ref)(w, x), tol=(1e-5, 1e-6))
    assert_same(jax.vmap(f, in_axes=(None, 0))(w, x[:, None, :]), jax.vmap(ref, in_axes=(None, 0))(w, x[:, None, :]),
                tol=(1e-5, 1e-6))
    assert_same(jax.jit(lambda w: f(w, x) * 2)(w), ref(w, x) * 2, tol=(1e-5, 1e-6))
    assert f.translations == 0  # all traced through, none ran on ORT


def _effects_per_call(jit):
    """How many times an effect inside jit(g) runs over three calls of an outer jit closing over g's argument."""
    calls = []

    def g(x):
        jax.debug.callback(lambda _: calls.append(1), x)
        return x * 2
    x = jnp.arange(3.0)
    outer = jax.jit(lambda y: jit(g)(x) + y)
    for _ in range(3):
        outer(jnp.ones(3)).block_until_ready()
    return len(calls)


def _checkify_failure(jit):
    from jax.experimental import checkify

    def f(x):
        checkify.check(jnp.all(x > 0), "not positive: {}", x.sum())
        return x * 2
    error, out = checkify.checkify(jit(f))(jnp.arange(3.0) - 5)
    return error.get(), np.asarray(out).tolist()


# Concrete arguments under a trace (an outer jit's closure, checkify's, make_jaxpr's): jax.jit stages the call there.
CLOSED_OVER_CASES = {
    "effects_run_per_call": _effects_per_call,
    "checkify_functionalizes_checks": _checkify_failure,
    "make_jaxpr_stages_the_call": lambda jit: len(jax.make_jaxpr(functools.partial(jit(jnp.sin), jnp.arange(3.0)))().eqns),
}


@pytest.mark.parametrize("name", list(CLOSED_OVER_CASES))
def test_concrete_arguments_under_a_trace_are_staged_like_jax_jit(name):
    case = CLOSED_OVER_CASES[name]
    assert case(mnjit) == case(jax.jit)


def test_nested_mnjit_and_grad_of_mnjit_under_mnjit():
    inner = mnjit(lambda x: jnp.sin(x) * 2)
    outer = mnjit(lambda x: inner(x).sum() + inner(x * 2).max())
    x = rand((6,))
    assert_same(outer(x), jax.jit(lambda x: (jnp.sin(x) * 2).sum() + (jnp.sin(x * 2) * 2).max())(x))
    grad_outer = mnjit(jax.grad(lambda x: inner(x).sum()))
    assert_same(grad_outer(x), 2 * jnp.cos(x), tol=(1e-6, 1e-6))
    assert outer.translations == 1 and inner.translations == 0


def test_awkward_inputs():
    f = mnjit(lambda b, s, i, u: (jnp.logical_not(b), s * 2, i + 1, u * 2))
    buffer = np.zeros(4 * 8 + 4, np.uint8)
    unaligned = np.frombuffer(buffer.data, np.float32, count=8, offset=4)  # 4 bytes off 64-byte alignment
    unaligned[:] = np.arange(8)
    args = (np.array([True, False]), np.float32(3), np.arange(3, dtype=np.int64), unaligned)
    out = f(*args)
    assert_same(out, jax.jit(lambda b, s, i, u: (jnp.logical_not(b), s * 2, i + 1, u * 2))(*args))
    assert out[2].dtype == jnp.int32  # int64 canonicalized as jit does with x64 off


def test_returned_arrays_are_never_overwritten():
    f = mnjit(lambda x: x * 2)
    first = f(jnp.ones(1000))
    kept = np.array(first)
    for i in range(5):
        f(jnp.full(1000, float(i)))
    np.testing.assert_array_equal(np.asarray(first), kept)


class _RecordingBinding:
    """Wraps ORT's IOBinding to record the addresses mnjit binds."""

    def __init__(self, binding):
        self.binding, self.addresses = binding, []

    def bind_input(self, name, device, dtype, shape, address):
        self.addresses.append(address)
        self.binding.bind_input(name, device, dtype, shape, address)

    def __getattr__(self, name):
        return getattr(self.binding, name)


def test_zero_copy_both_ways():
    fn = lambda x, y: x * y  # noqa: E731
    x, y = jnp.arange(64.0, dtype=jnp.float32), jnp.ones(64, jnp.float32)
    lowered = mnjit(fn).lower(x, y)
    out_avals = [jax.ShapeDtypeStruct((64,), jnp.float32)]
    runner = OrtRunner(lowered.model, [x, y], out_avals)
    binding = _RecordingBinding(runner._binding)
    capsules = runner._run_bound(binding, [x, y], runner._run_options)
    assert binding.addresses == [x.unsafe_buffer_pointer(), y.unsafe_buffer_pointer()]  # bound in place
    ort_pointer = np.from_dlpack(_Capsule(capsules[0])).ctypes.data
    (first,) = runner.run([x, y])
    (second,) = runner.run([x, y])
    assert first.unsafe_buffer_pointer() != second.unsafe_buffer_pointer()  # fresh outputs every call
    np.testing.assert_array_equal(first, np.asarray(x * y))  # not overwritten by the second call
    assert ort_pointer % 64 == 0 and first.unsafe_buffer_pointer() % 64 == 0  # jax imports aligned buffers as-is


class _Capsule:
    def __init__(self, capsule):
        self.capsule = capsule

    def __dlpack__(self, **_):
        return self.capsule

    def __dlpack_device__(self):
        return (1, 0)


def test_lower_introspection(tmp_path):
    f = mnjit(lambda x: jnp.exp(x).sum())
    lowered = f.lower(jnp.ones((2, 3)))
    assert "stablehlo.exponential" in lowered.as_text()
    assert "exp" in str(lowered.jaxpr)
    assert isinstance(lowered.onnx_model, onnx.ModelProto)
    path = tmp_path / "f.onnx"
    lowered.save(str(path))
    onnx.checker.check_model(onnx.load(str(path)), full_check=True)


LINE_OF_CALLBACK = None


def test_unsupported_op_names_op_and_source_line():
    def f(x):
        global LINE_OF_UNSUPPORTED
        LINE_OF_UNSUPPORTED = inspect.currentframe().f_lineno + 1
        return jax.lax.rng_uniform(jnp.float32(0), jnp.float32(1), x.shape) + x
    with pytest.raises(hlo2onnx.UnsupportedOpError) as info:
        mnjit(f)(jnp.ones(3))
    message = str(info.value)
    assert "stablehlo.rng" in message
    assert f"test_mnjit_api.py:{LINE_OF_UNSUPPORTED}" in message


def test_not_callable_is_a_clear_error():
    with pytest.raises(TypeError, match="callable"):
        mnjit(3)


class _Scaler:
    """Methods decorated as jax's docs do: `self` static (hashable by its scale), or an array argument."""

    def __init__(self, scale: float):
        self.scale = scale

    def __hash__(self):
        return hash(self.scale)

    def __eq__(self, other):
        return isinstance(other, _Scaler) and other.scale == self.scale

    def apply(self, x):
        return x * self.scale + 1.0

    def not_static(self, x):
        return x


@pytest.mark.parametrize("jit", [jax.jit, mnjit])
def test_decorated_methods_bind_like_jax_jit(jit):
    cls = type("Scaler", (_Scaler,), {"apply": functools.partial(jit, static_argnums=0)(_Scaler.apply),
                                      "not_static": jit(_Scaler.not_static)})
    x = rand((3, 2))
    for scale in (2.0, 3.0):  # the static self is part of the signature
        assert_same(cls(scale).apply(x), jax.jit(lambda v: v * scale + 1.0)(x))
    assert_same(cls.apply(cls(2.0), x), cls(2.0).apply(x))  # looked up on the class: unbound
    with pytest.raises(TypeError, match="not_static"):  # self traced as an array: jax.jit's own error
        cls(2.0).not_static(x)


@pytest.mark.parametrize("copy", [copy.copy, copy.deepcopy], ids=["copy", "deepcopy"])
def test_copies_call_like_jax_jits(copy):
    """A model object holding a jitted function is copied whole (a training state's deepcopy)."""
    state = {"step": mnjit(lambda x: jnp.sin(x) * 2), "x": rand((3,))}
    state["step"](state["x"])
    copied = copy(state)
    assert_same(copied["step"](copied["x"]), jax.jit(lambda x: jnp.sin(x) * 2)(state["x"]))


def test_a_symbolic_lowering_does_not_compile():
    (b,) = jax.export.symbolic_shape("b")
    lowered = mnjit(jnp.sin).lower(jax.ShapeDtypeStruct((b, 3), jnp.float32))
    with pytest.raises(ValueError, match="symbolic dims"):
        lowered.compile()


@pytest.mark.parametrize("options", [{"keep_unused": True}, {"inline": True}, {"backend": "cpu"},
                                     {"device": jax.devices("cpu")[0]}, {"in_shardings": None},
                                     {"compiler_options": {"xla_cpu_enable_fast_math": False}}],
                         ids=lambda o: next(iter(o)))
def test_jax_jit_options_are_accepted(options):
    """jax.jit's own options, swapped in with one line: placement that names the target's device, and what
    applies where jax.jit runs the function (inline, compiler_options)."""
    def f(x, unused):
        return jnp.tanh(x) * 2.0
    x = rand((3,))
    assert_same(mnjit(f, **options)(x, x), jax.jit(f, **options)(x, x))
    if "compiler_options" not in options:  # jax 0.10 refuses them on a jit nested under grad, as it would mnjit's
        assert_same(jax.grad(lambda x: mnjit(f, **options)(x, x).sum())(x),
                    jax.grad(lambda x: jax.jit(f, **options)(x, x).sum())(x))


@pytest.mark.parametrize("options, message", [({"backend": "gpu"}, "backend='gpu'"),
                                              ({"out_shardings": jax.sharding.SingleDeviceSharding(jax.devices()[0])},
                                               "shard")])
def test_placement_mnjit_cannot_give_is_refused(options, message):
    with pytest.raises(ValueError, match=message):
        mnjit(jnp.sin, **options)


@pytest.mark.parametrize("symbolic", [False, True], ids=["call", "symbolic-lower"])
def test_a_discarded_function_releases_its_lowering(symbolic):
    """jax 0.12 cached every keep_unused=True lowering (all of mnjit's) for 2048 more lowerings: a discarded
    function kept its constants and MLIR module. Each translation lets the previous ones go."""
    x = jnp.ones(4)
    spec = jax.ShapeDtypeStruct(export.symbolic_shape("b, 4"), jnp.float32)
    constants = []
    for i in range(3):
        constant = np.full((4,), float(i), np.float32)
        constants.append(weakref.ref(constant))
        fun = mnjit(lambda a, c=constant: a * c)
        fun.lower(spec) if symbolic else assert_same(fun(x), jax.jit(lambda a: a * float(i))(x))
        del constant, fun
    gc.collect()
    assert [c() for c in constants[:-1]] == [None, None]
