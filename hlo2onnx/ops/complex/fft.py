"""stablehlo.fft (FFT, IFFT, RFFT, IRFFT over the last 1-3 dims) on the float-pair layout of complex tensors.

ONNX's DFT reads and writes that layout directly. ORT's DFT kernel is accurate for
power-of-two lengths only (measured, onnxruntime 1.31: relative error ~n*eps in f32
at other lengths, 2e-4 at n = 1000, and f32-level error for every f64 inverse of
such a length), so those lengths multiply by an exact DFT matrix instead, up to
MATRIX_LIMIT; longer ones use Bluestein's chirp-z algorithm, which writes the length-n
DFT as a convolution done by power-of-two DFTs.
"""
from __future__ import annotations

import numpy as np
import onnx_ir as ir
from jax.extend.mlir.dialects import stablehlo

from hlo2onnx.ops.core.shape import reshape_to
from hlo2onnx.registry import register_complex
from hlo2onnx.translator import RuleContext
from hlo2onnx.types import real_dtype

# Longest non-power-of-two length done by matrix: its (2n x 2n) matrix is 16 MiB in f32.
MATRIX_LIMIT = 1024


@register_complex("stablehlo.fft")
def fft(ctx: RuleContext, x, *, fft_type, fft_length):
    kind = stablehlo.FftTypeAttr(fft_type).value
    b = ctx.b
    dtype = real_dtype(ctx.in_types[0].dtype)
    lengths = list(fft_length)
    shape = list(ctx.in_types[0].shape)
    rank = len(shape)
    axes = list(range(rank - len(lengths), rank))
    if kind in ("FFT", "IFFT"):
        for axis, n in zip(axes, lengths):
            x = _complex_dft(b, x, shape, axis, n, kind == "IFFT", dtype)
        return x
    if kind == "RFFT":
        x = _rfft(b, x, shape, lengths[-1], dtype)
        shape[-1] = lengths[-1] // 2 + 1
        for axis, n in zip(axes[:-1], lengths[:-1]):
            x = _complex_dft(b, x, shape, axis, n, False, dtype)
        return x
    if kind == "IRFFT":
        for axis, n in zip(axes[:-1], lengths[:-1]):
            x = _complex_dft(b, x, shape, axis, n, True, dtype)
        return _irfft(b, x, shape, lengths[-1], dtype)
    raise NotImplementedError(f"fft_type {kind}")


def _by_matrix(n: int) -> bool:
    return bool(n & (n - 1)) and n <= MATRIX_LIMIT


def _by_bluestein(n: int) -> bool:
    return bool(n & (n - 1)) and n > MATRIX_LIMIT


def _twiddles(rows: int, cols: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of 2*pi*j*k/n for j < rows, k < cols, exact to float64 (j*k reduced mod n first)."""
    angle = 2 * np.pi * (np.outer(np.arange(rows), np.arange(cols)) % n) / n
    return np.cos(angle), np.sin(angle)


def _complex_dft(b, x: ir.Value, shape: list[int], axis: int, n: int, inverse: bool, dtype) -> ir.Value:
    """The DFT of pair tensor `x` (complex shape `shape`) along `axis`."""
    if not _by_matrix(n) and not _by_bluestein(n):
        return b.op("DFT", x, None, b.const(np.int64(axis)), inverse=int(inverse))
    last = len(shape) - 1
    if axis != last:  # swap the axis to the end (before the pair axis) and back
        perm = list(range(len(shape) + 1))
        perm[axis], perm[last] = last, axis
        x = b.op("Transpose", x, perm=perm)
    swapped = list(shape)
    swapped[axis], swapped[last] = shape[last], shape[axis]
    if _by_bluestein(n):
        y = _bluestein(b, x, len(shape) + 1, n, n, n, inverse, dtype)
        return b.op("Transpose", y, perm=perm) if axis != last else y
    # Interleaved (re, im) rows and columns: y_k = sum_j x_j (c -+ i s)_{jk}, divided by n if inverse.
    cos, sin = _twiddles(n, n, n)
    sign = 1 if inverse else -1
    matrix = np.empty((n, 2, n, 2))
    matrix[:, 0, :, 0], matrix[:, 1, :, 0] = cos, -sign * sin
    matrix[:, 0, :, 1], matrix[:, 1, :, 1] = sign * sin, cos
    if inverse:
        matrix /= n
    flat = reshape_to(b, x, swapped[:-1] + [2 * n])
    y = b.typed("MatMul", flat, b.const(matrix.reshape(2 * n, 2 * n).astype(dtype)), dtype=dtype)
    y = reshape_to(b, y, swapped + [2])
    return b.op("Transpose", y, perm=perm) if axis != last else y


def _rfft(b, x: ir.Value, shape: list[int], n: int, dtype) -> ir.Value:
    """Real [..., n] -> pairs [..., n//2 + 1, 2] along the last axis."""
    m = n // 2 + 1
    if _by_bluestein(n):  # a real signal times the complex chirp is a pair tensor already
        x = b.op("Unsqueeze", x, b.shape_const([-1]))
        return _bluestein(b, x, len(shape) + 1, n, n, m, False, dtype, real=True)
    if not _by_matrix(n):
        return b.op("DFT", b.op("Unsqueeze", x, b.shape_const([-1])), None, b.const(np.int64(-2)), onesided=1)
    cos, sin = _twiddles(n, m, n)
    matrix = np.stack([cos, -sin], axis=-1).reshape(n, 2 * m)
    y = b.typed("MatMul", x, b.const(matrix.astype(dtype)), dtype=dtype)
    return reshape_to(b, y, shape[:-1] + [m, 2])


def _irfft(b, x: ir.Value, shape: list[int], n: int, dtype) -> ir.Value:
    """Pairs [..., n//2 + 1, 2] -> real [..., n]; like XLA, the imaginary parts of bins 0 and n/2 are ignored."""
    m = n // 2 + 1
    if _by_bluestein(n):
        # y = Re(IDFT_n(weight * X zero-padded to n)): the mirrored bins are the conjugates of the doubled
        # ones, and the imaginary parts of bins 0 and n/2 drop out of the real part by themselves.
        y = _bluestein(b, x, len(shape) + 1, n, m, n, True, dtype, _irfft_weights(n))
        y = b.op("Gather", y, b.const(np.int64(0)), axis=-1)
        return reshape_to(b, y, shape[:-1] + [n])
    if not _by_matrix(n):
        y = b.op("DFT", x, b.const(np.int64(n)), b.const(np.int64(-2)), inverse=1, onesided=1)
        return reshape_to(b, y, shape[:-1] + [n])
    cos, sin = _twiddles(m, n, n)
    weight = _irfft_weights(n)
    matrix = np.stack([weight[:, None] * cos, -weight[:, None] * sin], axis=1) / n  # (m, 2, n)
    matrix[0, 1] = 0
    if n % 2 == 0:
        matrix[-1, 1] = 0
    flat = reshape_to(b, x, shape[:-1] + [2 * m])
    return b.typed("MatMul", flat, b.const(matrix.reshape(2 * m, n).astype(dtype)), dtype=dtype)


def _irfft_weights(n: int) -> np.ndarray:
    """How often each of the n//2 + 1 stored bins counts in a real length-n signal: the others mirror them."""
    weight = np.full(n // 2 + 1, 2.0)
    weight[0] = 1
    if n % 2 == 0:
        weight[-1] = 1
    return weight


def _times(b, x: ir.Value, c: np.ndarray, dtype, real: bool = False) -> ir.Value:
    """Pairs `x` [..., L, 2] (or real [..., L, 1]) times complex constants `c` [L], elementwise."""
    re, im = c.real, c.imag
    if real:
        return b.op("Mul", x, b.const(np.stack([re, im], axis=-1).astype(dtype)))
    # (a + ib)(re + i im) = [a re, b re] + [b, a] * [-im, im]
    swapped = b.op("Gather", x, b.const(np.array([1, 0], dtype=np.int64)), axis=-1)
    return b.op("Add", b.op("Mul", x, b.const(np.stack([re, re], axis=-1).astype(dtype))),
                b.op("Mul", swapped, b.const(np.stack([-im, im], axis=-1).astype(dtype))))


def _bluestein(b, x: ir.Value, rank: int, n: int, in_len: int, out_len: int, inverse: bool, dtype,
               weight: np.ndarray | None = None, real: bool = False) -> ir.Value:
    """The first `out_len` bins of the length-n DFT along axis -2 of `x` [..., in_len, 2], zeros beyond.

    With w_k = exp(-i pi k^2 / n), jk = (k^2 + j^2 - (k-j)^2) / 2 gives
    y_k = w_k sum_j (x_j w_j) conj(w)_{k-j}: a convolution, done circularly by
    power-of-two DFTs of length M >= 2n - 1. The chirps and the DFT of conj(w)
    are computed exactly in float64 here, so only the runtime's DFTs round.
    `weight` scales the input bins (the irfft's doubling); `real`: `x` is [..., in_len, 1], real.
    """
    k = np.arange(n)
    chirp = np.exp((1j if inverse else -1j) * np.pi * ((k * k) % (2 * n)) / n)  # k^2 mod 2n: exact angle
    size = 1 << (2 * n - 2).bit_length()
    kernel = np.zeros(size, dtype=np.complex128)
    kernel[:n] = chirp.conj()
    kernel[size - n + 1:] = chirp[1:].conj()[::-1]
    pre = chirp[:in_len] * (1 if weight is None else weight)
    post = chirp[:out_len] / (n if inverse else 1)
    pads = [0] * (2 * rank)
    pads[rank + rank - 2] = size - in_len
    a = b.op("Pad", _times(b, x, pre, dtype, real), b.const(np.array(pads, dtype=np.int64)))
    spectrum = _times(b, b.op("DFT", a, None, b.const(np.int64(-2))), np.fft.fft(kernel), dtype)
    conv = b.op("DFT", spectrum, None, b.const(np.int64(-2)), inverse=1)
    conv = b.op("Slice", conv, b.shape_const([0]), b.shape_const([out_len]), b.shape_const([-2]))
    return _times(b, conv, post, dtype)
