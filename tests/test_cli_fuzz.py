"""A mutation fuzzer for the `hlo2onnx` command: valid models in all five input formats, corrupted.

Mutations: one byte of an op or dialect name made non-UTF-8 (what made jaxlib's readers abort), seeded
random byte flips, and truncations. Every run must end with exit 0, or with status 1 or 2 and exactly one
`hlo2onnx: error:` line; never a signal, a Python traceback or an "internal error", and a failed run leaves
the existing output file as it was. Each case is one real command run (a subprocess, ~1.5 s of start-up),
so the default set is small; `make stress` runs the larger one.
"""
from __future__ import annotations

import functools
import io
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

from hlo2onnx.files import TEMP_PREFIX

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = sys.executable  # the leg's own interpreter: each CI leg has its own jax
OLD = b"the user's previous model"


def _model(x, w):
    return jnp.tanh(x @ w).sum(axis=0)


ARGS = (np.ones((4, 3), np.float32), np.ones((3, 2), np.float32))
FORMATS = ["stablehlo-text", "mlir-bytecode", "portable-artifact", "jax-export", "hlo-text"]
# Names the corpus's ops and dialects carry, in text or as bytecode strings.
NAMES = [b"stablehlo", b"func", b"tanh", b"dot_general", b"vhlo", b"builtin", b"reduce", b"add"]


@functools.lru_cache(maxsize=None)
def valid(fmt: str) -> bytes:
    lowered = jax.jit(_model).lower(*ARGS)
    if fmt == "stablehlo-text":
        return lowered.as_text().encode()
    if fmt == "hlo-text":
        return lowered.as_text(dialect="hlo").encode()
    if fmt == "mlir-bytecode":
        buffer = io.BytesIO()
        lowered.compiler_ir("stablehlo").operation.write_bytecode(buffer)
        return buffer.getvalue()
    exported = export.export(jax.jit(_model))(*ARGS)
    return bytes(exported.mlir_module_serialized if fmt == "portable-artifact" else exported.serialize())


def name_corruption(data: bytes, index: int) -> bytes | None:
    """The index-th name occurrence found, its second byte made 0xFF (not UTF-8); None when there is none."""
    found = [i for name in NAMES for i in _occurrences(data, name)]
    if index >= len(found):
        return None
    position = sorted(found)[index] + 1
    return data[:position] + b"\xff" + data[position + 1:]


def _occurrences(data: bytes, name: bytes) -> list[int]:
    positions, start = [], 0
    while (i := data.find(name, start)) >= 0:
        positions.append(i)
        start = i + 1
    return positions[:3]


def byte_flip(data: bytes, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    position = int(rng.integers(len(data)))
    return data[:position] + bytes([data[position] ^ int(rng.integers(1, 256))]) + data[position + 1:]


def truncation(data: bytes, seed: int) -> bytes:
    return data[:int(np.random.default_rng(seed).integers(1, len(data)))]


MUTATIONS = {"name": name_corruption, "flip": byte_flip, "truncate": truncation}


def mutated(fmt: str, kind: str, index: int) -> bytes:
    data = valid(fmt)
    if kind == "valid":
        return data
    result = MUTATIONS[kind](data, index)
    if result is None:
        pytest.skip(f"{fmt} has fewer than {index + 1} name occurrences")
    return result


def cases(names: int, flips: int, truncations: int) -> list:
    return [pytest.param(fmt, kind, i, id=f"{fmt}-{kind}-{i}") for fmt in FORMATS
            for kind, count in (("name", names), ("flip", flips), ("truncate", truncations)) for i in range(count)]


def assert_contained(fmt: str, kind: str, index: int, tmp_path) -> None:
    source = tmp_path / "input.bin"
    source.write_bytes(mutated(fmt, kind, index))
    output = tmp_path / "model.onnx"
    output.write_bytes(OLD)
    done = subprocess.run([PYTHON, "-m", "hlo2onnx", str(source), "-o", str(output)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    err = done.stderr
    assert done.returncode >= 0, f"killed by signal {-done.returncode}: {err[-500:]}"
    assert "Traceback" not in err and "internal error" not in err, err
    if done.returncode == 0:
        assert output.read_bytes() != OLD
    else:
        assert done.returncode in (1, 2), err
        assert err.count("\n") == 1 and err.startswith("hlo2onnx: error: "), err
        assert output.read_bytes() == OLD
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(TEMP_PREFIX)]


@pytest.mark.parametrize("fmt", FORMATS)
def test_valid_inputs_convert(fmt, tmp_path):
    """The corpus is valid before mutation (else the fuzzer tests only error paths)."""
    assert_contained(fmt, "valid", 0, tmp_path)
    assert (tmp_path / "model.onnx").read_bytes() != OLD


# About 20 runs: under a minute on one core.
@pytest.mark.parametrize("fmt, kind, index", cases(names=2, flips=1, truncations=0)
                         + [pytest.param(f, "truncate", 0, id=f"{f}-truncate-0") for f in FORMATS[1:4]])
def test_mutations_are_contained(fmt, kind, index, tmp_path):
    assert_contained(fmt, kind, index, tmp_path)


def test_a_parse_that_never_ends_is_stopped(tmp_path):
    """A 3 KB corrupted jax.export artifact (a byte-flipped one, from a probe) keeps jaxlib's MLIR bytecode
    reader busy for good, on jaxlib 0.10 and 0.12: the command gives up after --parse-limit with one line, the
    old output intact."""
    output = tmp_path / "model.onnx"
    output.write_bytes(OLD)
    done = subprocess.run([PYTHON, "-m", "hlo2onnx", os.path.join(ROOT, "tests", "data", "mlir_reader_hangs.bin"),
                           "-o", str(output), "--parse-limit", "3"], cwd=ROOT, capture_output=True, text=True,
                          timeout=90)
    assert done.returncode == 1, done.stderr
    assert done.stderr.count("\n") == 1 and "the parser did not finish within 3 s" in done.stderr, done.stderr
    assert output.read_bytes() == OLD
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(TEMP_PREFIX)]


@pytest.mark.stress
@pytest.mark.parametrize("fmt, kind, index", cases(names=12, flips=40, truncations=10))
def test_mutations_are_contained_stress(fmt, kind, index, tmp_path):
    assert_contained(fmt, kind, 1000 + index if kind != "name" else index, tmp_path)
