"""Complex tensors (held as float (real, imag) pairs in the graph), each case compared with jax.jit."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from harness import Case, rand, run_case
from hlo2onnx.errors import UnsupportedOpError
from mnjit import mnjit
from mnjit.runtime import complex_as_pairs, pairs_as_complex

C64, C128 = np.complex64, np.complex128
ARITH_TOL = {C64: (1e-5, 1e-5), C128: (1e-12, 1e-12)}


def _x(shape, dtype, seed=0, low=-3, high=3):
    return rand(shape, dtype, seed, low, high)


def _max_min(acc, element):
    """(lexicographic max of the first pair, min of the second): the body lax.reduce gets from the harnesses."""
    (a, other_a), (b, other_b) = acc, element
    first = (a.real > b.real) | ((a.real == b.real) & (a.imag > b.imag))
    if jnp.iscomplexobj(other_a):
        second = (other_a.real < other_b.real) | ((other_a.real == other_b.real) & (other_a.imag < other_b.imag))
        return lax.select(first, a, b), lax.select(second, other_a, other_b)
    return lax.select(first, a, b), jnp.minimum(other_a, other_b)


def _per_dtype(dtype) -> list[Case]:
    """The same rows for complex64 and (under x64) complex128."""
    x64 = dtype == C128
    tag = np.dtype(dtype).name
    tol = ARITH_TOL[dtype]
    x, y = _x((3, 4), dtype), _x((3, 4), dtype, 1)
    real = rand((3, 4), np.float64 if x64 else np.float32, 2)
    big = float(np.finfo(real.dtype).max)
    big_log = 1.2 * np.log(big)
    case = lambda name, fn, args, **kw: Case(f"{name}_{tag}", fn, args, x64=x64, **kw)  # noqa: E731
    return [
        # arithmetic
        *[case(name, fn, (x, y)) for name, fn in {
            "add": jnp.add, "sub": jnp.subtract, "mul": jnp.multiply, "neg_sub": lambda a, b: -a - b}.items()],
        case("div", jnp.divide, (x, y), tol=tol),
        case("div_special", jnp.divide, (np.array([1 + 1j, np.nan, 1, np.inf, -2, 3j], dtype),
                                          np.array([0, 0, np.inf, 1 + 1j, -0.0, 1e-30], dtype))),
        case("pow", lambda a, b: a ** b, (x * 0.5, y * 0.3), tol=(tol[0] * 10, tol[1] * 10)),
        case("pow_zero_base", lambda a, b: a ** b,
             (np.array([0, 0, 0, 0, 0, 1 + 1j], dtype), np.array([0, 2, -2, 1j, 1.5 + 1j, 2], dtype)), tol=tol),
        case("reciprocal", lambda a: 1 / a, (x,), tol=tol),
        # functions
        *[case(name, fn, (x,), tol=tol) for name, fn in {
            "abs": jnp.abs, "exp": jnp.exp, "log": jnp.log, "sqrt": jnp.sqrt, "rsqrt": lax.rsqrt,
            "sign": jnp.sign, "sin": jnp.sin, "cos": jnp.cos, "tan": jnp.tan, "tanh": jnp.tanh,
            "square": jnp.square, "conj": jnp.conj, "expm1": jnp.expm1, "log1p": jnp.log1p, "angle": jnp.angle,
            "arctan": jnp.arctan, "sinh": jnp.sinh}.items()],
        case("expm1_log1p_tiny", lambda a: (jnp.expm1(a), jnp.log1p(a)),
             (np.array([1e-8 + 1e-9j, -1e-7j, 1e-3 - 1e-3j, 2 + 0j], dtype),), tol=tol),
        case("atan2_real", jnp.arctan2, (np.array([1, 1, -1, -1, 0, -0.0, 0, -0.0, 3, 1e-30], real.dtype),
                                         np.array([1, -1, 1, -1, -1, -1, 0, -0.0, 0, 5], real.dtype)), tol=tol),
        case("atan2_random", jnp.arctan2, (real, real[::-1] * 10), tol=tol),
        case("sqrt_branch_cut", jnp.sqrt, (np.array([-4 + 0j, complex(-4, -0.0), 0j, 4 + 0j, 1j, -1j], dtype),),
             tol=tol),
        case("log_branch_cut", jnp.log, (np.array([-1 + 0j, complex(-1, -0.0), 1j, -1j, 2 - 2j], dtype),), tol=tol),
        case("abs_huge", jnp.abs, (np.array([3e30 + 4e30j, 1e-30 + 1e-30j, 0j, np.inf + 1j], dtype),), tol=tol),
        # past overflow: exp(a) * sin 0 is no inf * 0 = NaN; |z|, |re| + |z| and a (a + 2) + b^2 overflow at finite z
        case("exp_overflow", lambda a: (jnp.exp(a), jnp.sinh(a), jnp.cosh(a), jnp.expm1(a)),
             (np.array([complex(big_log, 0), complex(big_log, -0.0), complex(-big_log, 0), complex(big_log / 2, 1e-20),
                        complex(np.inf, 0), complex(big_log * 1e10, 0), complex(big_log / 3, 2)], dtype),), tol=tol),
        case("log_sqrt_log1p_huge", lambda a: (jnp.log(a), jnp.sqrt(a), jnp.log1p(a), jnp.log10(a)),
             (np.array([complex(-big, 0), complex(big, 0), complex(-big, 1), complex(big, big), complex(-big, big / 4),
                        1e3j * np.sqrt(big), complex(-1e3 * np.sqrt(big), 5), complex(3, -1e3 * np.sqrt(big))],
                       dtype),), tol=tol),
        # real, imag, complex, convert
        case("real_imag", lambda a: (jnp.real(a), jnp.imag(a)), (x,)),
        case("make_complex", lax.complex, (real, real[::-1])),
        case("real_to_complex", lambda a: a.astype(dtype), (real,)),
        case("int_to_complex", lambda a: a.astype(dtype), (rand((3, 4), np.int32),)),
        case("complex_to_real", lambda a: a.real.astype(np.int32) + jnp.abs(a).astype(np.int32), (x,)),
        case("complex_to_bool", lambda a: a.astype(bool), (np.array([0j, 1j, 1, complex(0, -0.0), np.nan], dtype),)),
        case("real_of_real", lambda a: (jnp.real(a), jnp.imag(a)), (real,)),
        case("compare", lambda a, b: (a == b, a != b), (x, jnp.where(real > 0, x, y))),
        case("select", lambda p, a, b: jnp.where(p, a, b), (real > 0, x, y)),
        # dot
        case("matmul", jnp.matmul, (x, y.T), tol=tol),
        case("matvec", jnp.dot, (x, y[0]), tol=tol),
        case("batched_einsum", lambda a, b: jnp.einsum("bij,bjk->bik", a, b),
             (_x((2, 3, 4), dtype), _x((2, 4, 5), dtype, 1)), tol=tol),
        case("matmul_real_rhs", jnp.matmul, (x, real.T), tol=tol),
        case("vdot", jnp.vdot, (x, y), tol=tol),
        # reductions
        case("sum", jnp.sum, (x,), tol=tol),
        case("sum_axis", lambda a: a.sum(axis=1), (x,), tol=tol),
        case("mean", lambda a: a.mean(axis=0), (x,), tol=tol),
        case("prod", lambda a: a.prod(axis=1), (x * 0.5,), tol=tol),
        case("prod_all", jnp.prod, (_x((7,), dtype, 3, -1, 1),), tol=tol),
        case("cumsum", lambda a: jnp.cumsum(a, axis=1), (x,), tol=tol),
        # data movement
        case("broadcast", lambda a: a[:, None, :] + a[None, :, :], (x,)),
        case("reshape_transpose", lambda a: a.reshape(2, 6).T, (x,)),
        case("slice_reverse", lambda a: a[1:, ::-2], (x,)),
        case("concat", lambda a, b: jnp.concatenate([a, b], axis=1), (x, y)),
        case("pad", lambda a: jnp.pad(a, ((1, 2), (0, 1)), constant_values=1 - 2j), (x,)),
        case("pad_interior", lambda a: lax.pad(a, dtype(3j), [(1, 0, 1), (0, 1, 2)]), (x,)),
        case("dynamic_slice", lambda a, i: lax.dynamic_slice(a, (i, i + 1), (2, 2)), (x, np.int32(1))),
        case("dynamic_update_slice", lambda a, b, i: lax.dynamic_update_slice(a, b[:2, :2], (i, i + 1)),
             (x, y, np.int32(1))),
        case("gather", lambda a, i: a[i], (x, np.array([2, 0, 2], np.int32))),
        case("scatter_set", lambda a, i, b: a.at[i].set(b), (x, np.array([2, 0], np.int32), y[:2])),
        case("scatter_add", lambda a, i, b: a.at[i].add(b), (x, np.array([1, 1], np.int32), y[:2]), tol=tol),
        # mul / max / min: the body applied one index row at a time, in order (duplicates, dropped rows, NaN)
        *[case(f"scatter_{name}", fn, (x, np.array([2, 0, 2, 7], np.int32), _x((4, 4), dtype, 4)), tol=tol)
          for name, fn in {
              "mul": lambda a, i, u: a.at[i].mul(u, mode="drop"),
              "max": lambda a, i, u: a.at[i].max(u, mode="drop"),
              "min": lambda a, i, u: a.at[i].min(u.at[1, 2].set(np.nan), mode="drop"),
              "max_window": lambda a, i, u: a.at[i[:2], 1:3].max(u[:2, :2], mode="drop"),
              "mul_2d_index": lambda a, i, u: a.at[i[:3] % 3, i[1:] % 4].mul(u[0, :3]),
          }.items()],
        case("scatter_max_ties", lambda a, u: a.at[np.array([0, 0, 1])].max(u),
             (np.array([1 + 2j, 3 - 1j], dtype), np.array([1 + 2j, 1 + 5j, 3 - 1j], dtype))),
        case("arange", lambda a: a + jnp.arange(4, dtype=dtype), (x,)),
        # constants and scalars
        case("const_dense", lambda a: a * jnp.array([1 + 2j, -3j, 4, np.nan + 1j], dtype), (x,)),
        case("const_splat", lambda a: a + jnp.full((3, 4), 2 - 1j, dtype), (x,)),
        case("const_big_hex", lambda a: a + jnp.asarray(np.arange(300).astype(dtype) * (1 - 1j)).reshape(3, 100)[:, :4],
             (x,)),
        case("const_inf", lambda a: a * jnp.array(complex(np.inf, -np.inf), dtype), (x,)),
        case("python_scalar", lambda a: a * (2 + 1j) - 1j, (x,)),
        case("weak_scalar_arg", lambda a, s: a * s, (x, 1.5 - 2j)),
        case("scalar_in_out", lambda s: s * s + 1, (dtype(2 - 3j),)),
        case("zero_size", lambda a: a * 2j, (np.zeros((0, 3), dtype),)),
        case("strided_input", lambda a: a * 2, (x[:, ::2],)),
        case("many_outputs", lambda a, b: (a, b * 1j, a.real, jnp.abs(b)), (x, y)),
        # reductions by a lexicographic (real, imag) choice or a product, whole and windowed
        case("reduce_max", lambda a: (a.max(0), a.max(), a.min(1)), (x,)),
        case("reduce_max_ties", lambda a: (a.max(1), a.min(0)),
             (np.array([[1 + 2j, 1 + 3j, 1 - 1j], [2 - 1j, 2 - 1j, -3 + 5j]], dtype),)),
        # variadic: one choice per operand (lexicographic max beside an integer min, or beside a complex min)
        case("reduce_variadic_max_int_min", lambda a, i: lax.reduce((a, i), (dtype(3), np.int32(0)), _max_min, (0,)),
             (x, rand((3, 4), np.int32, 5))),
        case("reduce_variadic_max_min", lambda a, c: lax.reduce((a, c), (dtype(-np.inf), dtype(np.inf)),
                                                                _max_min, (0, 1)), (x, y)),
        case("reduce_window_max", lambda a: lax.reduce_window(a, dtype(-np.inf), lax.max, (2, 2), (1, 1), "VALID"),
             (x,)),
        case("reduce_window_min_padded", lambda a: lax.reduce_window(a, dtype(np.inf), lax.min, (2, 3), (1, 2),
                                                                     ((1, 0), (1, 1))), (x,)),
        case("reduce_window_mul", lambda a: lax.reduce_window(a, dtype(1), lax.mul, (2, 2), (1, 1), "SAME"), (x,),
             tol=tol),
        case("cumprod_cummax", lambda a: (jnp.cumprod(a, axis=1), lax.cummax(a, axis=0), lax.cummin(a, axis=1)),
             (x,), tol=tol),
        # sort: lexicographic (real, imag), the comparator evaluated on all pairs
        case("sort", lambda a: (jnp.sort(a, axis=0), jnp.sort(a, axis=1), jnp.argsort(a, axis=1)), (x,)),
        case("sort_ties_special", lambda a: (jnp.sort(a), jnp.argsort(a, descending=True)),
             (np.array([1 + 2j, 1 - 1j, complex(np.nan, 1), 1 + 2j, -0.0 + 0j, 0j, complex(1, np.nan), -np.inf, 3j],
                       dtype),)),
        case("sort_with_values", lambda a, v: lax.sort((a[0], v), num_keys=1), (x, real[0])),
        # control flow
        case("fori_loop", lambda a: lax.fori_loop(0, 5, lambda i, c: c * (0.5 + 0.5j) + a, a), (x,), tol=tol),
        case("scan_stacked", lambda c, xs: lax.scan(lambda k, v: (k * v + 1j, k.conj()), c, xs), (x[0], y),
             tol=tol),
        case("sharding_constraint", lambda a: jax.lax.with_sharding_constraint(
            a * 2, jax.sharding.SingleDeviceSharding(jax.devices()[0])), (x,)),
        case("cond", lambda p, a: lax.cond(p > 0, lambda v: v * 1j, lambda v: v.conj(), a), (np.float32(1), x)),
    ]


CASES = _per_dtype(C64) + _per_dtype(C128) + [
    # complex64 operands asking for a complex128 product (JAX's dot_general harness "preferred")
    Case("matmul_preferred_c128", lambda a, b: lax.dot_general(a, b, (((1,), (0,)), ((), ())),
                                                                 preferred_element_type=C128),
         (_x((4, 3), C64), _x((3, 6), C64, 1)), x64=True, tol=ARITH_TOL[C128]),
    Case("matmul_real_preferred_c128", lambda a, b: lax.dot_general(a, b, (((1,), (0,)), ((), ())),
                                                                      preferred_element_type=C128),
         (_x((4, 3), C64), rand((3, 6), np.float32, 1)), x64=True, tol=ARITH_TOL[C128]),
]


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_complex(case):
    run_case(case)


def test_inputs_are_float_pairs():
    """Complex graph inputs and outputs are float tensors with a trailing axis of 2."""
    lowered = mnjit(lambda a: a * 2j).lower(np.zeros((3,), C64))
    graph = lowered.onnx_model.graph
    for value in (graph.input[0], graph.output[0]):
        assert value.type.tensor_type.elem_type == 1  # FLOAT
        assert [d.dim_value for d in value.type.tensor_type.shape.dim] == [3, 2]


def test_complex_inputs_are_fed_without_a_copy():
    x = _x((3, 4), C64)
    pairs = complex_as_pairs(x)
    assert pairs.shape == (3, 4, 2) and pairs.dtype == np.float32 and np.shares_memory(pairs, x)
    assert complex_as_pairs(np.asarray(C128(1 - 2j))).tolist() == [1, -2]
    np.testing.assert_array_equal(pairs_as_complex(pairs, np.dtype(C64)), x)


@pytest.mark.parametrize("fn, what", [
    (lambda a: jnp.cumprod(jnp.tile(a, 30)), "reduce_window"),  # a 120-element window is not folded
    (lambda a: jnp.sort(jnp.tile(a, 600)), "sort"),  # 2400^2 comparator pairs: over the limit
    (lambda a: lax.reduce((a, a), (0j, 0j), lambda u, v: (u[0] + v[0], u[1] * v[1]), (0,)), "reduce"),
])
def test_unsupported_complex_ops_name_the_op(fn, what):
    with pytest.raises(UnsupportedOpError, match=what):
        mnjit(fn)(_x((4,), C64))
