"""stablehlo.fft through jnp.fft, each case compared with jax.jit.

Power-of-two lengths run on ONNX's DFT; other lengths up to 1024 multiply by an exact
DFT matrix, longer ones use Bluestein's algorithm (hlo2onnx/ops/complex/fft.py says why), so
all three paths are covered below.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from harness import Case, rand, run_case
from mnjit import mnjit

C64, C128 = np.complex64, np.complex128
# An FFT sums n terms: XLA and ORT round differently, by about log2(n) or sqrt(n) ulps of the largest output.
TOL = {C64: (1e-5, 1e-4), C128: (1e-12, 1e-11)}


def _cases(dtype) -> list[Case]:
    x64 = dtype == C128
    real = np.float64 if x64 else np.float32
    tag = np.dtype(dtype).name
    case = lambda name, fn, arg: Case(f"{name}_{tag}", fn, (arg,), tol=TOL[dtype], x64=x64)  # noqa: E731
    rows = []
    for n in (8, 6, 7):  # a power of two (DFT), even and odd other lengths (matrix)
        z, r = rand((3, n), dtype), rand((3, n), real)
        rows += [
            case(f"fft_{n}", jnp.fft.fft, z),
            case(f"ifft_{n}", jnp.fft.ifft, z),
            case(f"rfft_{n}", jnp.fft.rfft, r),
            case(f"irfft_{n}", jnp.fft.irfft, z),
            case(f"irfft_odd_out_{n}", lambda a: jnp.fft.irfft(a, n=2 * a.shape[-1] - 1), z),
            case(f"fft_axis0_{n}", lambda a: jnp.fft.fft(a, axis=0), z),
            case(f"fft2_{n}", jnp.fft.fft2, z),
            case(f"ifft2_{n}", jnp.fft.ifft2, z),
            case(f"rfft2_{n}", jnp.fft.rfft2, r),
            case(f"irfft2_{n}", jnp.fft.irfft2, z),
        ]
    z3, r3 = rand((2, 4, 6, 8), dtype), rand((2, 4, 6, 8), real)
    rows += [
        case("fftn_3d", jnp.fft.fftn, z3[0]),
        case("ifftn_3d", jnp.fft.ifftn, z3[0]),
        case("rfftn_3d", jnp.fft.rfftn, r3[0]),
        case("irfftn_3d", jnp.fft.irfftn, z3[0]),
        case("fftn_last3_batched", lambda a: jnp.fft.fftn(a, axes=(1, 2, 3)), z3),
        case("rfftn_last2_batched", lambda a: jnp.fft.rfftn(a, axes=(2, 3)), r3),
        case("fft_of_real", jnp.fft.fft, r3[0, 0]),
        case("fft_padded_n", lambda a: jnp.fft.fft(a, n=12), z3[0, 0]),
        case("fft_truncated_n", lambda a: jnp.fft.fft(a, n=4), z3[0, 0]),
        case("fft_ortho", lambda a: jnp.fft.fft(a, norm="ortho"), z3[0, 0]),
        case("roundtrip", lambda a: jnp.fft.irfft(jnp.fft.rfft(a) * 2j, n=a.shape[-1]), r3[0, 0]),
        case("fftshift_spectrum", lambda a: jnp.abs(jnp.fft.fftshift(jnp.fft.fft2(a))), z3[0, 0]),
        case("fft_1024", jnp.fft.fft, rand((2, 1024), dtype)),
        case("rfft_1000", jnp.fft.rfft, rand((2, 1000), real)),
        case("fft_length_1", jnp.fft.fft, rand((3, 1), dtype)),
    ]
    # Bluestein (non-power-of-two lengths over 1024): measured error 4e-7 of the norm in f32, 1e-15 in f64,
    # and at most 6e-5 beyond rtol * |expected| in f32 (n = 3000, outputs up to 460): within TOL.
    for n in ((1031, 1500, 3000) if not x64 else (1500,)):  # an odd prime, an even length, M = 8192
        z, r = rand((2, n), dtype, seed=1), rand((2, n), real, seed=1)
        rows += [
            case(f"fft_{n}", jnp.fft.fft, z),
            case(f"ifft_{n}", jnp.fft.ifft, z),
            case(f"rfft_{n}", jnp.fft.rfft, r),
            case(f"irfft_{n}", lambda a, n=n: jnp.fft.irfft(a, n=n), z[:, : n // 2 + 1]),
        ]
    z2 = rand((2, 1100), dtype, seed=2)
    rows += [
        case("fft_axis0_1100", lambda a: jnp.fft.fft(a.T, axis=0), z2),
        case("fft2_1100", jnp.fft.fft2, z2),
        case("ifft2_1100", jnp.fft.ifft2, z2),
        case("rfft2_1100", jnp.fft.rfft2, z2.real),
        case("irfft2_1100", lambda a: jnp.fft.irfft2(a, s=(2, 1100)), z2[:, :551]),
        case("irfft_odd_out_1101", lambda a: jnp.fft.irfft(a, n=1101), z2[:, :551]),
    ]
    return rows


CASES = _cases(C64) + _cases(C128)


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_fft(case):
    run_case(case)


@pytest.mark.parametrize("n, op", [(8, "DFT"), (6, "MatMul")])
def test_power_of_two_lengths_use_dft(n, op):
    model = mnjit(jnp.fft.fft).lower(rand((n,), C64)).onnx_model
    assert op in {node.op_type for node in model.graph.node}


def test_long_non_power_of_two_uses_bluestein():
    """Length 1100 runs on power-of-two DFTs (of length 4096), with no dense DFT matrix."""
    model = mnjit(jnp.fft.fft).lower(rand((1100,), C64)).onnx_model
    ops = {node.op_type for node in model.graph.node}
    assert "DFT" in ops and "MatMul" not in ops
