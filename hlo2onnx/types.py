"""Element types: MLIR spelling -> numpy dtype -> ONNX DataType.

numpy dtypes (with ml_dtypes for bf16/fp8) are the one vocabulary used inside
the translator; MLIR and ONNX spellings are converted at the edges.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import ml_dtypes
import numpy as np
import onnx_ir as ir
from jax.extend.mlir import ir as mlir

_MLIR_TO_NUMPY: dict[str, np.dtype] = {
    "f16": np.dtype(np.float16),
    "bf16": np.dtype(ml_dtypes.bfloat16),
    "f32": np.dtype(np.float32),
    "f64": np.dtype(np.float64),
    "i1": np.dtype(np.bool_),
    "i8": np.dtype(np.int8),
    "i16": np.dtype(np.int16),
    "i32": np.dtype(np.int32),
    "i64": np.dtype(np.int64),
    "ui8": np.dtype(np.uint8),
    "ui16": np.dtype(np.uint16),
    "ui32": np.dtype(np.uint32),
    "ui64": np.dtype(np.uint64),
    "complex<f32>": np.dtype(np.complex64),
    "complex<f64>": np.dtype(np.complex128),
    "f8E4M3FN": np.dtype(ml_dtypes.float8_e4m3fn),
    "f8E5M2": np.dtype(ml_dtypes.float8_e5m2),
}


class TensorType(NamedTuple):
    """A static tensor type as the rules see it."""

    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def storage(self) -> "TensorType":
        """How the ONNX graph holds this tensor: complex as a trailing (real, imag) axis of the matching float.

        ORT has no complex kernels; the pair layout is also the one ONNX's DFT reads and writes.
        """
        if not is_complex(self.dtype):
            return self
        return TensorType(self.shape + (2,), real_dtype(self.dtype))


class UnsupportedTypeError(TypeError):
    pass


def element_dtype(element_type: mlir.Type) -> np.dtype:
    name = str(element_type)
    try:
        return _MLIR_TO_NUMPY[name]
    except KeyError:
        raise UnsupportedTypeError(f"element type {name} has no ONNX equivalent here") from None


# StableHLO's token (ordering of side effects) travels as a bool scalar that host callbacks pass along.
TOKEN = TensorType((), np.dtype(np.bool_))


def is_token(mlir_type: mlir.Type) -> bool:
    return str(mlir_type) == "!stablehlo.token"


def tensor_type(mlir_type: mlir.Type) -> TensorType:
    """Reads a ranked tensor type; dynamic dims come back as -1. Tokens read as TOKEN."""
    if is_token(mlir_type):
        return TOKEN
    if not isinstance(mlir_type, mlir.RankedTensorType):
        mlir_type = mlir.RankedTensorType(mlir_type)
    shape = tuple(-1 if mlir_type.is_dynamic_dim(i) else d for i, d in enumerate(mlir_type.shape))
    return TensorType(shape, element_dtype(mlir_type.element_type))


def onnx_dtype(dtype: np.dtype) -> ir.DataType:
    return ir.DataType.from_numpy(np.dtype(dtype))


_FLOAT_VOIDS = (np.dtype(ml_dtypes.bfloat16), np.dtype(ml_dtypes.float8_e4m3fn))  # numpy kind "V"
FLOAT8 = frozenset({np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e5m2)})  # storage-only types


def is_float(dtype: np.dtype) -> bool:
    return np.dtype(dtype).kind == "f" or np.dtype(dtype) in _FLOAT_VOIDS


def is_complex(dtype: np.dtype) -> bool:
    return np.dtype(dtype).kind == "c"


def real_dtype(dtype: np.dtype) -> np.dtype:
    """complex64 -> float32, complex128 -> float64; real dtypes are their own."""
    return np.dtype(np.finfo(dtype).dtype) if is_complex(dtype) else np.dtype(dtype)


def is_unsigned(dtype: np.dtype) -> bool:
    return np.dtype(dtype).kind == "u"


def is_bool(dtype: np.dtype) -> bool:
    return np.dtype(dtype) == np.dtype(np.bool_)


def is_typed_key(dtype) -> bool:
    """Whether `dtype` is a typed PRNG key's (jax.random.key, any impl): modules hold its key data instead."""
    return jax.dtypes.issubdtype(dtype, jax.dtypes.extended)


def set_type(value: ir.Value, ttype: TensorType) -> None:
    """Gives an onnx-ir value the graph type of `ttype` (unknown dims as None)."""
    ttype = ttype.storage  # complex values are float pairs in the graph
    value.type = ir.TensorType(onnx_dtype(ttype.dtype))
    value.shape = ir.Shape([d if d >= 0 else None for d in ttype.shape])
