"""OpenVINO's usage telemetry forks at openvino's import, and JAX warns about the fork: mnjit records OpenVINO's
documented opt-out first where the user has not decided, keeps a decision made, and leaves JAX's warning on for
other forks. Each case runs in a child whose HOME is a temporary folder (the consent file lives there)."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

# Looked up, not imported: importing openvino here would send its event from a fork of the test process.
if importlib.util.find_spec("openvino") is None or importlib.util.find_spec("openvino_telemetry") is None:
    pytest.skip("needs openvino and openvino-telemetry", allow_module_level=True)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FORK_WARNING = "os.fork() was called"


def run_child(code: str, home) -> subprocess.CompletedProcess:
    env = dict(os.environ, HOME=str(home), PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    env.pop("CI", None)  # openvino's own tools decline in CI: the case here is a user's machine
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_first_openvino_use_declines_telemetry_and_does_not_fork(tmp_path):
    done = run_child(
        "import os, jax.numpy as jnp\n"
        "from mnjit import mnjit\n"
        "print(float(mnjit(lambda x: jnp.sin(x) * 2, target='openvino-cpu')(jnp.float32(1.0))))\n"
        "import sys; sys.stderr.write('--- a fork of our own:\\n'); sys.stderr.flush()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os._exit(0)\n"
        "os.waitpid(pid, 0)\n", tmp_path)
    assert abs(float(done.stdout) - 1.682942) < 1e-5
    before, after = done.stderr.split("--- a fork of our own:")
    assert FORK_WARNING not in before  # openvino's import sent nothing, from no fork
    assert FORK_WARNING in after  # JAX still warns about any other fork
    assert (tmp_path / "intel" / "openvino_telemetry").read_text() == "0"


@pytest.mark.parametrize("decision", ["1", "0"])
def test_a_users_decision_is_kept(tmp_path, decision):
    (tmp_path / "intel").mkdir()
    (tmp_path / "intel" / "openvino_telemetry").write_text(decision)
    done = run_child("from mnjit import openvino_consent\nprint(openvino_consent.decline_unless_decided())\n",
                     tmp_path)
    assert done.stdout.strip() == "False"
    assert (tmp_path / "intel" / "openvino_telemetry").read_text() == decision
