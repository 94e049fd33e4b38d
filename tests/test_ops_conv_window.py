"""convolution, reduce_window and select_and_scatter, each compared with jax.jit."""
from __future__ import annotations

import contextlib
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from harness import Case, rand, run_case

F16, F32, F64 = np.float16, np.float32, np.float64
# Conv sums dozens of products; ORT and XLA order them differently.
CONV_TOL = (1e-5, 1e-5)
CONV_TOL_F16 = (1e-2, 1e-2)


def conv(strides=(1, 1), padding="SAME", dn=("NHWC", "HWIO", "NHWC"), **kw):
    return lambda x, w: lax.conv_general_dilated(x, w, strides, padding, dimension_numbers=dn, **kw)


def shaped(spec: str, sizes: dict[str, int]) -> tuple[int, ...]:
    return tuple(sizes[c] for c in spec)


def dn_case(name, lhs, rhs, out, spatial=(7, 6), kernel=(3, 2), **kw):
    """A 2-D conv with the dimension numbers written as layout strings."""
    n, c, o = 2, 3, 4
    x = rand(shaped(lhs, {"N": n, "C": c, "H": spatial[0], "W": spatial[1]}))
    w = rand(shaped(rhs, {"O": o, "I": c // kw.get("feature_group_count", 1), "H": kernel[0], "W": kernel[1]}),
             seed=1)
    return Case(name, conv(dn=(lhs, rhs, out), **{"strides": (1, 1), "padding": "SAME", **kw}), (x, w),
                tol=CONV_TOL)


def pool(reducer, init, window, strides, padding, **kw):
    return lambda a: lax.reduce_window(a, init, reducer, window, strides, padding, **kw)


def grad_maxpool(window, strides, padding):
    return jax.grad(lambda a: jnp.sum(jnp.sin(lax.reduce_window(a, -jnp.inf, lax.max, window, strides, padding))))


x_nhwc, w_hwio = rand((2, 9, 8, 3)), rand((3, 3, 3, 4), seed=1)
x_1d, w_1d = rand((2, 11, 3)), rand((3, 3, 5), seed=1)
x_3d, w_3d = rand((1, 5, 6, 4, 2)), rand((2, 3, 2, 2, 3), seed=1)
img = rand((2, 8, 7, 3))
seq = rand((5, 7))
nan_img = np.where(rand((1, 6, 6, 2), seed=3) > 2.0, np.nan, rand((1, 6, 6, 2), seed=4)).astype(F32)
ties = np.array([[1, 1, 1, 2, 2, 0, 0, 3]], F32)

def pool_jvp(x, t, op, window=(2, 2), strides=(1, 1), padding=((0, 0), (0, 0)), base_dilation=(1, 1),
             window_dilation=(1, 1)):
    init = -jnp.inf if op is lax.max else jnp.inf

    def pool(v):
        return lax.reduce_window(v, jnp.asarray(init, v.dtype), op, window, strides, padding, base_dilation,
                                 window_dilation)
    return jax.jvp(pool, (x,), (t,))


CASES = [
    # -- convolution: layouts -------------------------------------------------------
    Case("conv_nhwc_same", conv(), (x_nhwc, w_hwio), tol=CONV_TOL),
    Case("conv_nhwc_valid_stride2", conv((2, 2), "VALID"), (x_nhwc, w_hwio), tol=CONV_TOL),
    Case("conv_nhwc_stride_asym", conv((2, 1), ((1, 2), (0, 1))), (x_nhwc, w_hwio), tol=CONV_TOL),
    dn_case("conv_dn_nchw_oihw", "NCHW", "OIHW", "NCHW"),
    dn_case("conv_dn_nchw_hwio_nhwc", "NCHW", "HWIO", "NHWC"),
    dn_case("conv_dn_hwnc_iohw_chwn", "HWNC", "IOHW", "CHWN"),
    dn_case("conv_dn_cnwh_wiho_whnc", "CNWH", "WIHO", "WHNC"),
    dn_case("conv_dn_nwhc_ohwi_ncwh", "NWHC", "OHWI", "NCWH", padding="VALID"),
    # -- padding, dilation, reversal ----------------------------------------------------
    Case("conv_negative_padding", conv(padding=((-1, 2), (1, -2))), (x_nhwc, w_hwio), tol=CONV_TOL),
    Case("conv_padding_beyond_kernel", conv(padding=((4, 3), (0, 5))), (x_nhwc, w_hwio), tol=CONV_TOL),
    Case("conv_rhs_dilation", conv(rhs_dilation=(2, 3)), (x_nhwc, w_hwio), tol=CONV_TOL),
    Case("conv_lhs_dilation", conv(padding=((2, 1), (0, 2)), lhs_dilation=(2, 3)), (x_nhwc, w_hwio), tol=CONV_TOL),
    Case("conv_lhs_dilation_big_pad", conv(padding=((5, -1), (3, 4)), lhs_dilation=(2, 2)), (x_nhwc, w_hwio),
         tol=CONV_TOL),
    Case("conv_lhs_dilation_strided", conv((2, 3), ((1, 1), (2, 0)), lhs_dilation=(2, 2)), (x_nhwc, w_hwio),
         tol=CONV_TOL),
    Case("conv_lhs_rhs_dilation", conv(padding=((2, 2), (1, 3)), lhs_dilation=(3, 1), rhs_dilation=(1, 2)),
         (x_nhwc, w_hwio), tol=CONV_TOL),
    # -- groups ---------------------------------------------------------------------------
    Case("conv_grouped", conv(feature_group_count=3), (rand((2, 6, 5, 6)), rand((3, 3, 2, 9), seed=1)),
         tol=CONV_TOL),
    Case("conv_depthwise", conv(feature_group_count=3), (x_nhwc, rand((3, 3, 1, 6), seed=1)), tol=CONV_TOL),
    Case("conv_batch_group", conv(padding="VALID", batch_group_count=2),
         (rand((4, 6, 5, 3)), rand((3, 3, 3, 6), seed=1)), tol=CONV_TOL),
    Case("conv_grouped_lhs_dilation", conv(padding=((1, 2), (2, 1)), lhs_dilation=(2, 2), feature_group_count=3),
         (rand((2, 5, 4, 6)), rand((3, 3, 2, 6), seed=1)), tol=CONV_TOL),
    # -- 1-D and 3-D --------------------------------------------------------------------------
    Case("conv1d_nwc", conv((2,), "SAME", ("NWC", "WIO", "NWC")), (x_1d, w_1d), tol=CONV_TOL),
    Case("conv1d_ncw_dilated", conv((1,), ((3, 0),), ("NCW", "OIW", "NCW"), rhs_dilation=(2,)),
         (rand((2, 3, 10)), rand((4, 3, 3), seed=1)), tol=CONV_TOL),
    Case("conv3d_ndhwc", conv((1, 2, 1), "SAME", ("NDHWC", "DHWIO", "NDHWC")), (x_3d, w_3d), tol=CONV_TOL),
    Case("conv3d_transposed", lambda x, w: lax.conv_transpose(x, w, (2, 1, 2), "SAME",
                                                              dimension_numbers=("NDHWC", "DHWIO", "NDHWC")),
         (x_3d, w_3d), tol=CONV_TOL),
    Case("conv_no_spatial", conv((), "VALID", ("NC", "IO", "NC")), (rand((3, 5)), rand((5, 4), seed=1)),
         tol=CONV_TOL),
    # -- gradients: lhs_dilation, reversal, batch groups --------------------------------------
    Case("conv_grad_input", jax.grad(lambda x, w: jnp.sum(jnp.tanh(conv((2, 2))(x, w)))), (x_nhwc, w_hwio),
         tol=CONV_TOL),
    Case("conv_grad_weight", jax.grad(lambda x, w: jnp.sum(jnp.tanh(conv((2, 2))(x, w))), argnums=1),
         (x_nhwc, w_hwio), tol=CONV_TOL),
    Case("conv_grad_weight_depthwise",
         jax.grad(lambda x, w: jnp.sum(jnp.tanh(conv(feature_group_count=3)(x, w))), argnums=1),
         (x_nhwc, rand((3, 3, 1, 6), seed=1)), tol=CONV_TOL),
    Case("conv_grad_input_depthwise_strided",
         jax.grad(lambda x, w: jnp.sum(jnp.tanh(conv((2, 2), "VALID", feature_group_count=3)(x, w)))),
         (x_nhwc, rand((3, 3, 1, 6), seed=1)), tol=CONV_TOL),
    Case("conv_grad_both_dilated",
         jax.grad(lambda x, w: jnp.sum(conv((1, 2), ((1, 0), (2, 1)), rhs_dilation=(2, 1))(x, w) ** 2), (0, 1)),
         (x_nhwc, w_hwio), tol=(1e-4, 1e-4)),
    Case("conv_transpose_api", lambda x, w: lax.conv_transpose(x, w, (2, 2), "SAME",
                                                               dimension_numbers=("NHWC", "HWIO", "NHWC")),
         (x_nhwc, w_hwio), tol=CONV_TOL),
    Case("conv_transpose_kernel_flip", lambda x, w: lax.conv_transpose(
        x, w, (3, 2), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC"), transpose_kernel=True),
         (x_nhwc, rand((3, 3, 4, 3), seed=1)), tol=CONV_TOL),
    # -- jnp.convolve ---------------------------------------------------------------------------
    Case("convolve_full", jnp.convolve, (rand((10,)), rand((3,), seed=1)), tol=CONV_TOL),
    Case("convolve_same", lambda a, v: jnp.convolve(a, v, mode="same"), (rand((9,)), rand((4,), seed=1)),
         tol=CONV_TOL),
    Case("correlate_valid", lambda a, v: jnp.correlate(a, v, mode="valid"), (rand((12,)), rand((5,), seed=1)),
         tol=CONV_TOL),
    # -- dtypes -----------------------------------------------------------------------------------
    Case("conv_f16", conv((2, 1)), (x_nhwc.astype(F16), w_hwio.astype(F16)), tol=CONV_TOL_F16),
    Case("conv_f16_grad_input", jax.grad(lambda x, w: jnp.sum(conv((2, 2))(x, w).astype(F32))),
         (x_nhwc.astype(F16), w_hwio.astype(F16)), tol=CONV_TOL_F16),
    Case("conv_f16_to_f32", conv(preferred_element_type=jnp.float32), (x_nhwc.astype(F16), w_hwio.astype(F16)),
         tol=CONV_TOL),
    Case("conv_f64", conv((2, 1), ((1, -1), (2, 0)), rhs_dilation=(1, 2)),
         (x_nhwc.astype(F64), w_hwio.astype(F64)), x64=True),
    Case("conv_f64_grouped_lhs_dilation", conv(padding=((1, 2), (2, 1)), lhs_dilation=(2, 2), feature_group_count=3),
         (rand((2, 5, 4, 6), F64), rand((3, 3, 2, 6), F64, seed=1)), x64=True),
    Case("conv_f64_grads", jax.grad(lambda x, w: jnp.sum(jnp.tanh(conv((2, 2))(x, w))), (0, 1)),
         (x_nhwc.astype(F64), w_hwio.astype(F64)), x64=True),
    Case("conv_f64_grad_depthwise", jax.grad(lambda x, w: jnp.sum(conv(feature_group_count=3)(x, w) ** 2), (0, 1)),
         (x_nhwc.astype(F64), rand((3, 3, 1, 6), F64, seed=1)), x64=True),
    Case("conv_f64_reversal_3d", lambda x, w: lax.conv_transpose(x, w, (2, 1, 2), "SAME", transpose_kernel=True,
                                                                 dimension_numbers=("NDHWC", "DHWOI", "NDHWC")),
         (x_3d.astype(F64), w_3d.astype(F64)), x64=True),
    # bf16 made inside: mnjit's runtime does not take bf16 arguments yet.
    Case("conv_bf16", lambda x, w: conv((1, 2))(x.astype(jnp.bfloat16), w.astype(jnp.bfloat16)).astype(F32),
         (x_nhwc, w_hwio), tol=(5e-2, 5e-2)),
    Case("conv_i32", conv((1, 2), "VALID"), (rand((2, 6, 5, 3), np.int32), rand((2, 2, 3, 4), np.int32, seed=1))),
    Case("conv_i8_to_i32", conv(preferred_element_type=jnp.int32),
         (rand((1, 5, 5, 2), np.int8), rand((3, 3, 2, 3), np.int8, seed=1))),
    Case("convolve_i32", jnp.convolve, (rand((8,), np.int32), rand((3,), np.int32, seed=1))),

    # -- reduce_window: pools ---------------------------------------------------------------------
    Case("maxpool_same", pool(lax.max, -jnp.inf, (1, 3, 3, 1), (1, 2, 2, 1), "SAME"), (img,)),
    Case("maxpool_valid", pool(lax.max, -jnp.inf, (1, 2, 2, 1), (1, 2, 2, 1), "VALID"), (img,)),
    Case("maxpool_nchw_dilated", pool(lax.max, -jnp.inf, (1, 1, 2, 3), (1, 1, 1, 2), ((0, 0), (0, 0), (1, 1), (2, 2)),
                                      window_dilation=(1, 1, 2, 2)), (rand((2, 3, 8, 9)),)),
    Case("maxpool_pad_beyond_window", pool(lax.max, -jnp.inf, (2, 2), (1, 1), ((3, 2), (0, 4))), (rand((3, 4)),)),
    Case("maxpool_negative_padding", pool(lax.max, -jnp.inf, (2, 3), (1, 2), ((-1, 1), (2, -2))), (rand((5, 7)),)),
    Case("maxpool_nan", pool(lax.max, -jnp.inf, (1, 2, 2, 1), (1, 1, 1, 1), "SAME"), (nan_img,)),
    Case("minpool_nan", pool(lax.min, jnp.inf, (1, 3, 2, 1), (1, 2, 1, 1), "VALID"), (nan_img,)),
    Case("maxpool_init_not_identity", pool(lax.max, 0.5, (3, 3), (1, 1), "SAME"), (rand((5, 6)),)),
    Case("maxpool_i32", pool(lax.max, np.int32(np.iinfo(np.int32).min), (2, 2), (2, 1), "SAME"),
         (rand((5, 6), np.int32),)),
    Case("maxpool_u8", pool(lax.max, np.uint8(0), (3, 2), (1, 2), ((1, 1), (0, 1))), (rand((6, 5), np.uint8),)),
    Case("maxpool_i8", pool(lax.max, np.int8(-128), (2, 2), (1, 1), "SAME"), (rand((4, 5), np.int8),)),
    Case("minpool_i16", pool(lax.min, np.int16(32767), (2, 3), (1, 1), "SAME"), (rand((4, 5), np.int16),)),
    Case("maxpool_f16", pool(lax.max, -jnp.inf, (1, 3, 3, 1), (1, 2, 2, 1), "SAME"), (img.astype(F16),)),
    Case("maxpool_f64", pool(lax.max, -jnp.inf, (1, 3, 3, 1), (1, 2, 2, 1), "SAME"), (img.astype(F64),), x64=True),
    Case("maxpool_3d", pool(lax.max, -jnp.inf, (2, 2, 2), (2, 1, 2), "SAME"), (rand((5, 4, 6)),)),
    Case("sumpool_same", pool(lax.add, 0.0, (1, 3, 3, 1), (1, 1, 1, 1), "SAME"), (img,)),
    Case("avgpool_strided", lambda a: pool(lax.add, 0.0, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")(a) / 4, (img,)),
    Case("sumpool_dilated_padded", pool(lax.add, 0.0, (2, 3), (1, 1), ((2, 1), (1, 1)), window_dilation=(2, 1)),
         (rand((6, 7)),)),
    Case("sumpool_init", pool(lax.add, 10.0, (2, 2), (1, 1), ((1, 1), (1, 0))), (rand((4, 5)),)),
    # XLA accumulates f16 windows in f16; ours is the f32 sum rounded once.
    Case("sumpool_f16", pool(lax.add, 0.0, (3, 3), (1, 1), "SAME"), (rand((6, 7), F16),), tol=(1e-2, 1e-2)),
    Case("sumpool_f64", pool(lax.add, 0.0, (3, 3), (2, 1), "SAME"), (rand((6, 7), F64),), x64=True),
    Case("sumpool_i32", pool(lax.add, np.int32(0), (3, 2), (1, 1), "SAME"), (rand((6, 7), np.int32),)),
    Case("prodpool", pool(lax.mul, 1.0, (2, 2), (1, 1), "SAME"), (rand((5, 6), low=0.5, high=1.5),)),
    Case("prodpool_init", pool(lax.mul, 2.0, (2, 1), (1, 1), ((1, 1), (0, 0))), (rand((4, 3), low=0.5, high=1.5),)),
    Case("pool_base_dilation", pool(lax.add, 0.0, (2, 3), (1, 2), ((1, 0), (2, 2)), base_dilation=(2, 3)),
         (rand((4, 5)),)),
    Case("maxpool_base_dilation_init", pool(lax.max, -1.0, (3, 2), (2, 1), ((0, 1), (1, 0)), base_dilation=(2, 1)),
         (rand((4, 5)),)),
    Case("pool_window_one", pool(lax.max, -jnp.inf, (1, 1), (2, 3), "VALID"), (rand((5, 7)),)),
    Case("pool_all_ones", pool(lax.add, 0.0, (1, 1), (1, 1), "VALID"), (rand((3, 4)),)),
    Case("pool_long_window_strided", pool(lax.max, -jnp.inf, (1, 13), (1, 4), ((0, 0), (3, 2))), (rand((2, 30)),)),
    Case("pool_long_window_dilated", pool(lax.mul, 1.0, (11,), (2,), ((1, 1),), window_dilation=(2,)),
         (rand((40,), low=0.8, high=1.25),), tol=(1e-5, 1e-6)),
    Case("pool_and_bool", pool(lax.bitwise_and, True, (2, 2), (1, 1), "SAME"), (rand((4, 5)) > -1,)),
    Case("pool_or_bool", pool(lax.bitwise_or, False, (3,), (2,), "SAME"), (rand((9,)) > 2,)),
    Case("pool_and_i32", pool(lax.bitwise_and, np.int32(-1), (2,), (1,), "VALID"), (rand((9,), np.int32),)),
    Case("pool_or_u8", pool(lax.bitwise_or, np.uint8(0), (3,), (1,), "SAME"), (rand((9,), np.uint8),)),
    Case("pool_init_argument", lambda a, i: lax.reduce_window(a, i, lax.add, (2, 2), (1, 1), "SAME"),
         (rand((4, 5)), np.float32(1.5))),
    Case("pool_empty_windows", pool(lax.max, -jnp.inf, (2,), (1,), ((3, 3),)), (rand((2,)),)),
    # -- reduce_window: cumulative ops -------------------------------------------------------------------
    Case("cumsum", jnp.cumsum, (seq,)),
    Case("cumsum_axis0", lambda a: jnp.cumsum(a, axis=0), (seq,)),
    Case("cumsum_reverse", lambda a: lax.cumsum(a, axis=1, reverse=True), (seq,)),
    Case("cumsum_i32", lambda a: jnp.cumsum(a, axis=1), (rand((4, 9), np.int32),)),
    Case("cumsum_i8", lambda a: lax.cumsum(a, axis=1), (rand((3, 9), np.int8),)),
    Case("cumsum_f16", lambda a: jnp.cumsum(a, axis=1), (rand((3, 9), F16),), tol=(4e-3, 4e-3)),
    Case("cumsum_f64", lambda a: jnp.cumsum(a, axis=0), (rand((9, 3), F64),), x64=True),
    Case("cumprod", lambda a: jnp.cumprod(a, axis=1), (rand((3, 20), low=0.7, high=1.4),), tol=(1e-5, 1e-6)),
    Case("cumprod_reverse", lambda a: lax.cumprod(a, axis=0, reverse=True), (rand((7, 3), low=0.7, high=1.4),),
         tol=(1e-5, 1e-6)),
    Case("cumprod_i32", lambda a: jnp.cumprod(a), (rand((12,), np.int32, low=-0.3, high=0.3),)),
    Case("cummax", lambda a: lax.cummax(a, axis=1), (seq,)),
    Case("cummin_reverse", lambda a: lax.cummin(a, axis=0, reverse=True), (seq,)),
    Case("cummax_long", lambda a: lax.cummax(a, axis=0), (rand((37, 2)),)),
    Case("cummax_nan", lambda a: lax.cummax(a, axis=1), (np.array([[1, np.nan, 3, 2], [4, 1, 5, np.nan]], F32),)),
    Case("cummin_i32", lambda a: lax.cummin(a), (rand((10,), np.int32),)),
    # -- reduce_window: bodies other than one op (holes are masked, not filled) ---------------------------
    Case("cumlogsumexp", lambda a: lax.cumlogsumexp(a, axis=1), (seq,), tol=(1e-5, 1e-5)),
    Case("cumlogsumexp_reverse_long", lambda a: lax.cumlogsumexp(a, axis=0, reverse=True), (rand((29, 2)),),
         tol=(1e-5, 1e-5)),
    Case("logaddexp_pool_padded", pool(jnp.logaddexp, -jnp.inf, (2, 3), (2, 1), ((1, 2), (2, 0))), (rand((5, 6)),),
         tol=(1e-5, 1e-5)),
    Case("logaddexp_pool_init_base_dilation", pool(jnp.logaddexp, 0.5, (3,), (2,), ((2, 1),), base_dilation=(2,)),
         (rand((6,)),), tol=(1e-5, 1e-5)),
    Case("logaddexp_pool_empty_windows", pool(jnp.logaddexp, 1.0, (2,), (1,), ((3, 2),)), (rand((2,)),),
         tol=(1e-5, 1e-5)),
    Case("logaddexp_pool_long_dilated", pool(jnp.logaddexp, -jnp.inf, (10,), (3,), ((4, 4),), window_dilation=(2,)),
         (rand((30,)),), tol=(1e-5, 1e-5)),

    # -- select_and_scatter: max-pool gradients ----------------------------------------------------------
    Case("maxpool_grad_same", grad_maxpool((1, 3, 3, 1), (1, 2, 2, 1), "SAME"), (img,)),
    Case("maxpool_grad_valid_overlap", grad_maxpool((1, 2, 2, 1), (1, 1, 1, 1), "VALID"), (img,)),
    Case("maxpool_grad_ties", grad_maxpool((1, 2), (1, 1), "VALID"), (ties,)),
    Case("maxpool_grad_nan", grad_maxpool((1, 2, 2, 1), (1, 1, 1, 1), "SAME"), (nan_img,)),
    Case("maxpool_grad_f16", grad_maxpool((1, 2, 2, 1), (1, 2, 2, 1), "VALID"), (img.astype(F16),)),
    Case("maxpool_grad_f64", grad_maxpool((3, 3), (2, 1), ((1, 1), (0, 2))), (rand((7, 6), F64),), x64=True),
    Case("maxpool_grad_3d", grad_maxpool((2, 2, 3), (1, 2, 2), "SAME"), (rand((3, 5, 6)),)),
    Case("minpool_grad", jax.grad(lambda a: jnp.sum(lax.reduce_window(a, jnp.inf, lax.min, (2, 2), (1, 1), "SAME")
                                                    * jnp.arange(20.0).reshape(4, 5))), (rand((4, 5)),)),
    # variadic reduce_window: the tangent of a max/min reduce_window is _select_and_gather_add
    *[Case(f"select_and_gather_add_{name}", partial(pool_jvp, op=op, **kw), (rand(shape, dt), rand(shape, dt, seed=1)),
           x64=x64)
      for name, op, shape, dt, kw, x64 in [
          ("max_2x2", lax.max, (4, 6), F32, {}, False),
          ("min_2x3_stride", lax.min, (5, 7), F32, dict(window=(2, 3), strides=(2, 2)), False),
          ("max_padded", lax.max, (4, 6), F32, dict(padding=((0, 1), (1, 1))), False),
          ("max_dilated", lax.max, (6, 7), F32, dict(window=(2, 2), window_dilation=(2, 1), base_dilation=(1, 2)),
           False),
          ("max_f16", lax.max, (4, 6), np.float16, {}, False),
          ("max_f64", lax.max, (4, 6), np.float64, dict(padding=((1, 0), (0, 2))), True),
          ("max_f32_x64", lax.max, (3, 5), F32, {}, True),
      ]],
]


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_op(case: Case) -> None:
    run_case(case)


def _select_and_scatter_padded(operand, source):
    """select_and_scatter with its own padding attribute (JAX pads explicitly instead)."""
    from jax._src.lax.windowed_reductions import _select_and_scatter  # the only route to a padded form

    return _select_and_scatter(operand, lax.ge, (2, 3), (2, 2), ((1, 1), (2, 0)), source,
                               jnp.zeros((), operand.dtype), lax.add)


def _select_and_scatter_bool(operand, source, scatter, init):
    """On bool (JAX's harness select_and_scatter_add over bool): or / and as the scatter."""
    from jax._src.lax.windowed_reductions import _select_and_scatter

    return _select_and_scatter(operand, lax.ge, (2, 2, 2), (1, 1, 1), ((0, 0),) * 3, source, np.bool_(init), scatter)


_BOOLS = (rand((2, 4, 6), seed=3) > 0, rand((1, 3, 5), seed=4) > 0)


@pytest.mark.parametrize("case", [
    Case("select_and_scatter_padding", _select_and_scatter_padded, (rand((5, 6)), rand((3, 3), seed=2))),
    Case("select_and_scatter_bool_or", partial(_select_and_scatter_bool, scatter=lax.bitwise_or, init=False),
         _BOOLS),
    Case("select_and_scatter_bool_and", partial(_select_and_scatter_bool, scatter=lax.bitwise_and, init=True),
         _BOOLS),
], ids=repr)
def test_select_and_scatter_padding(case: Case) -> None:
    run_case(case)


def _op_types(fun, *args) -> set[str]:
    from mnjit import mnjit

    return {node.op_type for node in mnjit(fun).lower(*args).onnx_model.graph.node}


@pytest.mark.parametrize("fun, args, expected, absent", [
    (conv(), (x_nhwc, w_hwio), "Conv", "Gather"),
    (jax.grad(lambda x, w: jnp.sum(conv((2, 2))(x, w))), (x_nhwc, w_hwio), "ConvTranspose", "Gather"),
    (conv(), (x_nhwc.astype(F64), w_hwio.astype(F64)), "MatMul", "Conv"),
    (jnp.cumsum, (seq,), "CumSum", "Slice"),
    (pool(lax.add, 0.0, (1, 3, 3, 1), (1, 2, 2, 1), "SAME"), (img,), "AveragePool", "Slice"),
    (pool(lax.max, np.int8(-128), (2, 2), (1, 1), "SAME"), (rand((4, 5), np.int8),), "MaxPool", "Slice"),
    (grad_maxpool((1, 2, 2, 1), (1, 2, 2, 1), "VALID"), (img,), "ScatterElements", "Loop"),
], ids=["conv", "conv_grad_input", "conv_f64", "cumsum", "sumpool", "maxpool_i8", "maxpool_grad"])
def test_idiomatic_op(fun, args, expected, absent) -> None:
    """The ONNX op the pattern calls for is used (the values are checked by the table above)."""
    scope = jax.enable_x64(True) if any(np.asarray(a).dtype == F64 for a in args) else contextlib.nullcontext()
    with scope:
        ops = _op_types(fun, *args)
    assert expected in ops and absent not in ops, sorted(ops)
