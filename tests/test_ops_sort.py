"""sort (jnp.sort, argsort, lax.sort with several operands and keys), top_k, argmax/argmin ties, TOTALORDER."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax
from jax._src.lax.lax import eq_to_p, le_to_p, lt_to_p  # the only way to emit a bare TOTALORDER compare

from harness import Case, rand, run_case
from hlo2onnx.ops.core.order import BITCAST_OPSET
from hlo2onnx.ops.sort import sort as sort_module
from mnjit import mnjit

F32, F16, F64 = np.float32, np.float16, np.float64
BF16 = ml_dtypes.bfloat16
# No subnormals: XLA on CPU flushes them to zero (ORT does not), in sort as in every other op.
SPECIAL = [3.0, np.nan, -0.0, 0.0, -np.inf, np.inf, 1.0, np.nan, 1.0, -2.5, 1e-3, -1e-3, 0.0, -0.0, 2.0]


def special(dtype, shape=(15,)) -> np.ndarray:
    return np.array(SPECIAL, dtype=dtype).reshape(shape)


def ties(dtype, shape, seed=0) -> np.ndarray:
    """Few distinct values, so that stability shows."""
    return rand(shape, dtype, seed, low=-0.3, high=0.3) if np.dtype(dtype).kind in "iu" else \
        np.round(rand(shape, np.float32, seed, low=-3, high=3)).astype(dtype)


def desc(x, axis=-1):
    return jnp.sort(x, axis=axis, descending=True)


def argdesc(x, axis=-1):
    return jnp.argsort(x, axis=axis, descending=True)


INT_DTYPES = [np.int32, np.uint8, np.int8, np.int16, np.uint16, np.uint32]
X64_INT_DTYPES = [np.int64, np.uint64]

CASES = [
    # floats: NaNs last, -0 == 0 (ties keep input order), infinities, subnormals
    *[Case(f"sort_special_{np.dtype(d).name}", jnp.sort, (special(d),), tol=(0, 0)) for d in (F32, F16)],
    *[Case(f"argsort_special_{np.dtype(d).name}", jnp.argsort, (special(d),)) for d in (F32, F16)],
    # bf16 arrays cannot cross into ORT (mnjit's runtime), so bf16 lives inside the function
    Case("sort_special_bfloat16", lambda a: jnp.sort(a.astype(BF16)).astype(F32), (special(F32),), tol=(0, 0)),
    Case("argsort_special_bfloat16", lambda a: jnp.argsort(a.astype(BF16)), (special(F32),)),
    Case("sort_special_f64", jnp.sort, (special(F64),), tol=(0, 0), x64=True),
    Case("argsort_special_f64", jnp.argsort, (special(F64),), x64=True),
    Case("argsort_desc_special_f32", argdesc, (special(F32),)),
    Case("argsort_desc_special_f64", argdesc, (special(F64),), x64=True),
    Case("sort_desc_special_f16", desc, (special(F16),), tol=(0, 0)),
    Case("sort_f32_axis0", lambda a: jnp.sort(a, axis=0), (rand((6, 5)),)),
    Case("sort_f32_axis1_3d", lambda a: jnp.sort(a, axis=1), (rand((2, 7, 3)),)),
    Case("argsort_f32_3d_ties", lambda a: jnp.argsort(a, axis=2), (ties(F32, (2, 3, 9)),)),
    Case("argsort_f32_large_ties", jnp.argsort, (ties(F32, (3000,)),)),
    Case("argsort_f64_ties_axis0", lambda a: jnp.argsort(a, axis=0), (ties(F64, (9, 4)),), x64=True),
    Case("sort_desc_f32_axis0", lambda a: desc(a, 0), (rand((6, 5)),)),
    Case("sort_len1", jnp.sort, (rand((3, 1)),)),
    Case("argsort_len1_axis0", lambda a: jnp.argsort(a, axis=0), (rand((1, 4)),)),
    Case("sort_empty", jnp.sort, (np.zeros((2, 0), F32),)),
    # integers and bool
    *[Case(f"sort_{np.dtype(d).name}", jnp.sort, (rand((4, 9), d),)) for d in INT_DTYPES],
    *[Case(f"argsort_{np.dtype(d).name}", jnp.argsort, (ties(d, (4, 9)),)) for d in INT_DTYPES],
    *[Case(f"argsort_desc_{np.dtype(d).name}", argdesc, (ties(d, (4, 9), 1),)) for d in (np.int8, np.uint8)],
    Case("sort_int32_extremes", jnp.sort, (np.array([2**31 - 1, -2**31, 0, -1, 5, -2**31, 2**31 - 1], np.int32),)),
    Case("sort_uint32_extremes", jnp.sort, (np.array([2**32 - 1, 0, 2**31, 2**31 - 1, 7], np.uint32),)),
    Case("sort_uint64_extremes", jnp.sort, (np.array([2**64 - 1, 0, 2**63, 2**63 - 1, 7, 2**63 + 1], np.uint64),),
         x64=True),
    *[Case(f"sort_{np.dtype(d).name}", jnp.sort, (rand((3, 8), d),), x64=True) for d in X64_INT_DTYPES],
    *[Case(f"argsort_desc_{np.dtype(d).name}", argdesc, (ties(d, (3, 8)),), x64=True) for d in X64_INT_DTYPES],
    Case("sort_bool", jnp.sort, (rand((3, 8), bool),)),
    Case("argsort_bool", jnp.argsort, (rand((3, 8), bool, 2),)),
    Case("argsort_desc_bool", argdesc, (rand((3, 8), bool, 3),)),
    # several operands, several keys (lexicographic), unstable sort on distinct keys
    Case("sort_kv_num_keys1", lambda k, v: lax.sort((k, v), num_keys=1), (ties(F32, (12,)), rand((12,), np.int32))),
    Case("sort_kv_num_keys2", lambda k, v: lax.sort((k, v), num_keys=2),
         (ties(F32, (12,)), ties(np.int32, (12,), 1))),
    Case("sort_3ops_num_keys2_axis0", lambda a, b, c: lax.sort((a, b, c), dimension=0, num_keys=2),
         (ties(np.int32, (10, 3)), ties(F32, (10, 3), 1), rand((10, 3)))),
    Case("sort_3keys_mixed", lambda a, b, c: lax.sort((a, b, c), num_keys=3),
         (rand((20,), bool), ties(np.uint8, (20,), 1), ties(F16, (20,), 2))),
    Case("sort_keys_special_f32_i32", lambda a, b: lax.sort((a, b), num_keys=2),
         (special(F32), ties(np.int32, (15,)))),
    Case("sort_keys_f64_special", lambda a, b: lax.sort((a, b), num_keys=2), (special(F64), ties(F64, (15,))),
         x64=True),
    Case("sort_unstable_distinct", lambda k, v: lax.sort((k, v), num_keys=1, is_stable=False),
         (np.random.default_rng(0).permutation(16).astype(F32), rand((16,)))),
    Case("lexsort", lambda a, b: jnp.lexsort((a, b)), (ties(np.int32, (14,)), ties(np.int32, (14,), 1))),
    Case("sort_then_math", lambda a: jnp.sort(a * 2, axis=0)[::-1] + 1, (rand((5, 3)),)),
    # top_k (chlo.top_k, expanded to a GT sort and a slice); +NaN only, see the module docstring
    Case("top_k_f32", lambda a: lax.top_k(a, 3), (rand((4, 10)),)),
    Case("top_k_f32_ties_special", lambda a: lax.top_k(a, 7), (special(F32),)),
    Case("top_k_f16_special", lambda a: lax.top_k(a, 15), (special(F16),)),
    Case("top_k_f64_special", lambda a: lax.top_k(a, 9), (special(F64),), x64=True),
    Case("top_k_i32_ties", lambda a: lax.top_k(a, 5), (ties(np.int32, (3, 12)),)),
    Case("top_k_u8", lambda a: lax.top_k(a, 4), (rand((2, 9), np.uint8),)),
    Case("top_k_i64", lambda a: lax.top_k(a, 4), (rand((2, 9), np.int64),), x64=True),
    Case("top_k_3d", lambda a: lax.top_k(a, 2), (rand((2, 3, 5)),)),
    Case("top_k_large", lambda a: lax.top_k(a, 5), (ties(F32, (2, 5000)),)),
    # ApproxTopK custom call: exact (is_fallback) on CPU
    Case("approx_max_k_f32", lambda a: lax.approx_max_k(a, 4), (rand((3, 40)),)),
    Case("approx_min_k_f32_dim0", lambda a: lax.approx_min_k(a, 3, reduction_dimension=0), (rand((20, 5)),)),
    Case("approx_max_k_f16", lambda a: lax.approx_max_k(a, 5), (rand((2, 64), F16),)),
    Case("approx_max_k_bf16_distinct", lambda a: lax.approx_max_k(a, 4),
         (np.random.default_rng(1).permutation(200).reshape(2, 100).astype(BF16),)),
    Case("approx_min_k_f64", lambda a: lax.approx_min_k(a, 6), (rand((4, 50), F64),), x64=True),
    Case("approx_max_k_f32_x64", lambda a: lax.approx_max_k(a, 2), (rand((3, 30)),), x64=True),
    Case("approx_max_k_ties_f32", lambda a: lax.approx_max_k(a, 6), (ties(F32, (3, 12)),)),
    # a sort whose results are only sliced: prefixes are sorted alone, other slices see the whole sort
    Case("sort_prefix_slices", lambda a: (lambda s: (s[:3], s[:5]))(jnp.sort(a)), (special(F32),), tol=(0, 0)),
    Case("sort_mixed_slices", lambda a: (lambda s: (s[:3], s[2:]))(jnp.sort(a)), (special(F32),), tol=(0, 0)),
    Case("sort_other_axis_slice", lambda a: jnp.sort(a, axis=0)[:2, :3], (rand((6, 5)),)),
    # argmax/argmin: first extreme wins, NaN wins for floats
    *[Case(f"argmax_ties_{np.dtype(d).name}", lambda a: (jnp.argmax(a, 1), jnp.argmin(a, 1), jnp.argmax(a, 0)),
           (ties(d, (5, 7)),)) for d in (np.int8, np.uint8, np.int16, np.uint32, np.int32, bool, F16, F32)],
    *[Case(f"argmax_nan_{np.dtype(d).name}", lambda a: (jnp.argmax(a, 1), jnp.argmin(a, 1)),
           (special(d, (3, 5)),)) for d in (F16, F32)],
    Case("argmax_nan_f64", lambda a: (jnp.argmax(a, 1), jnp.argmin(a, 0)), (special(F64, (3, 5)),), x64=True),
    Case("argmax_ties_i64", lambda a: (jnp.argmax(a, 1), jnp.argmin(a, 1)), (ties(np.int64, (4, 6)),), x64=True),
    Case("argmax_ties_u64", lambda a: (jnp.argmax(a, 0), jnp.argmin(a, 0)),
         (np.array([[2**64 - 1, 3], [2**64 - 1, 0], [5, 0]], np.uint64),), x64=True),
    # bare TOTALORDER compares
    *[Case(f"total_order_{np.dtype(d).name}",
           lambda a, b: (lt_to_p.bind(a, b), le_to_p.bind(a, b), eq_to_p.bind(a, b), lt_to_p.bind(b, a)),
           (special(d), special(d)[::-1].copy())) for d in (F32, F16)],
    Case("total_order_f64", lambda a, b: (lt_to_p.bind(a, b), eq_to_p.bind(a, b), le_to_p.bind(b, a)),
         (special(F64), special(F64)[::-1].copy()), x64=True),
]


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_sort(case: Case) -> None:
    run_case(case)


# The generic path: the comparator evaluated on all pairs, forced here on JAX's own comparators.
GENERIC = [
    Case("generic_sort_special_f32", jnp.sort, (special(F32),), tol=(0, 0)),
    Case("generic_argsort_ties_axis0", lambda a: jnp.argsort(a, axis=0), (ties(F32, (9, 4)),)),
    Case("generic_sort_kv_num_keys2", lambda k, v: lax.sort((k, v), num_keys=2),
         (ties(F16, (12,)), ties(np.int32, (12,), 1))),
    Case("generic_top_k_special_f64", lambda a: lax.top_k(a, 6), (special(F64),), x64=True),
    Case("generic_argsort_desc_u8", argdesc, (ties(np.uint8, (3, 10)),)),
]


@pytest.mark.parametrize("case", GENERIC, ids=repr)
def test_sort_generic_comparator(case: Case, monkeypatch) -> None:
    monkeypatch.setattr(sort_module, "comparator_keys", lambda block: None)
    run_case(case)


def test_comparator_keys_of_lexsort() -> None:
    """The reader sees JAX's num_keys=3 comparator as three keys (so the TopK path is taken)."""
    from hlo2onnx.mlir_io import prepare

    module = jax.jit(lambda a, b, c: lax.sort((a, b, c), num_keys=3)).lower(
        special(F32), ties(np.int32, (15,)), rand((15,), bool)).compiler_ir("stablehlo")
    with module.context:
        prepared = prepare(module)
        sort_op = next(op for op in prepared.regions[0].blocks[0].operations[0].regions[0].blocks[0].operations
                       if op.operation.name == "stablehlo.sort")
        keys = sort_module.comparator_keys(sort_op.regions[0].blocks[0])
    assert [(k.operand, k.descending, k.kind) for k in keys] == [(0, False, "canonical"), (1, False, "int"),
                                                                 (2, False, "int")]


# jnp functions built on sort, top_k and argmax.
COMPOSITE = [
    pytest.param(Case("partition", lambda a: jnp.partition(a, 3), (rand((9,)),)), id="partition"),
    pytest.param(Case("searchsorted_compare_all", lambda a, v: jnp.searchsorted(a, v, method="compare_all"),
                      (np.sort(rand((9,))), rand((4,), seed=3))), id="searchsorted_compare_all"),
    pytest.param(Case("nanargmax", lambda a: (jnp.nanargmax(a, axis=0), jnp.nanargmin(a, axis=1)),
                      (np.array([[np.nan, 1], [2, np.nan], [0, 5]], F32),)), id="nanargmax"),
    pytest.param(Case("isin", jnp.isin, (ties(F32, (8,)), np.array([1, 2], F32))), id="isin"),
    pytest.param(Case("median", lambda a: jnp.median(a, axis=1), (rand((3, 7)),)), id="median"),
    pytest.param(Case("quantile", lambda a: jnp.quantile(a, 0.3), (rand((11,)),)), id="quantile"),
    pytest.param(Case("argpartition", lambda a: jnp.argpartition(a, 3), (rand((9,)),)), id="argpartition"),
    # top_k(-x) (x's NaNs, +NaN, become -NaN: last from the top, as in XLA), not NaNs among the k smallest
    *[pytest.param(Case(f"partition_nan_{np.dtype(d).name}", lambda a: (jnp.partition(a, 1, axis=-1),
                                                                     jnp.argpartition(a, 3, axis=-1),
                                                                     lax.top_k(-a, 4)), (special(d, (3, 5)),),
                        x64=d == F64), id=f"partition_nan_{np.dtype(d).name}") for d in (F32, F16, F64)],
    pytest.param(Case("searchsorted_sort", lambda a, v: jnp.searchsorted(a, v, method="sort"),
                      (np.sort(rand((9,))), rand((4,), seed=3))), id="searchsorted_sort"),
    pytest.param(Case("top_k_grad", jax.grad(lambda a: lax.top_k(a, 3)[0].sum()), (rand((7,)),)),
                 id="top_k_grad"),
    pytest.param(Case("sort_grad", jax.grad(lambda a: (jnp.sort(a) * jnp.arange(7.0)).sum()), (rand((7,)),)),
                 id="sort_grad"),
    pytest.param(Case("unique", lambda a: jnp.unique(a, size=6, fill_value=-1), (ties(F32, (10,)),)),
                 id="unique"),
]


@pytest.mark.parametrize("case", COMPOSITE)
def test_sort_composite(case: Case) -> None:
    run_case(case)


def _with_negative_nans(dtype) -> np.ndarray:
    x = special(F32)
    x[7] = -np.nan  # sign bit set: XLA's total order puts it below -inf
    return x.astype(dtype)


NEGATIVE_NAN = [
    *[Case(f"top_k_negative_nan_{np.dtype(d).name}", lambda a: lax.top_k(a, 15), (_with_negative_nans(d),))
      for d in (F32, F16, BF16)],
    Case("top_k_negative_nan_f64", lambda a: lax.top_k(a, 15), (_with_negative_nans(F64),), x64=True),
    *[Case(f"total_order_negative_nan_{np.dtype(d).name}",
           lambda a, b: (lt_to_p.bind(a, b), eq_to_p.bind(a, b), le_to_p.bind(b, a)),
           (_with_negative_nans(d), _with_negative_nans(d)[::-1].copy())) for d in (F32, F64)],
]


@pytest.mark.parametrize("case", NEGATIVE_NAN, ids=repr)
def test_negative_nan_order_from_opset_26(case: Case) -> None:
    """A NaN's sign bit is readable only through BitCast (opset 26): there top_k and TOTALORDER match XLA."""
    with jax.enable_x64(case.x64):
        args = case.args
        expected = jax.jit(case.fun)(*args)
        actual = mnjit(case.fun, opset=BITCAST_OPSET)(*args)
    for a, e in zip(jax.tree_util.tree_leaves(actual), jax.tree_util.tree_leaves(expected)):
        a, e = np.asarray(a), np.asarray(e)
        bits = np.dtype(f"u{a.dtype.itemsize}")  # bit for bit: a NaN's sign is the point
        np.testing.assert_array_equal(a.view(bits), e.view(bits))
