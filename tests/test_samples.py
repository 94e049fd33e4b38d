"""The seed workloads in short configurations: each must agree with jax.jit (the full runs are `make samples`)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path


SAMPLES = Path(__file__).resolve().parent.parent / "samples"


def run_sample(name: str, *args: str) -> str:
    # A subprocess: the FIRE sample enables x64 at import, which must not leak into other tests.
    result = subprocess.run([sys.executable, str(SAMPLES / name), *args, "--check"], capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "OK: matches jax.jit" in result.stdout
    return result.stdout


def test_jaxmd_fire_minimization_agrees():
    out = run_sample("jaxmd_minimize.py", "--n", "200", "--steps", "40")
    assert "final energy" in out


def test_jaxcfd_channel_flow_agrees():
    run_sample("jaxcfd_channel_flow.py", "--inner-steps", "5", "--outer-steps", "3")
