"""What a newcomer meets first: the helpers' top-level names (the README's `from mnjit import mnjit` shadows the
package), the target table's printout, a quick `hlo2onnx --help`/`--version`, what --check compared against,
report()'s signature and placement, and target="auto"'s pending state explained where it is printed."""
from __future__ import annotations

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax import export

import hlo2onnx
import mnjit as package
from mnjit import mnjit, runtime, tiering

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_python(code: str) -> str:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_helpers_have_top_level_names():
    assert package.set_intra_op_threads is runtime.set_intra_op_threads
    assert package.intra_op_threads is runtime.intra_op_threads
    assert package.settle is tiering.settle
    assert package.TierPolicy is tiering.TierPolicy and package.TierStatus is tiering.TierStatus


def test_readme_spelling_runs_after_from_mnjit_import_mnjit():
    # As a README writes it: the function's name shadows the package, the helpers are imported by name.
    out = run_python("from mnjit import mnjit, set_intra_op_threads, intra_op_threads, settle\n"
                     "set_intra_op_threads(2)\n"
                     "import jax.numpy as jnp\n"
                     "print(float(mnjit(jnp.sin)(jnp.float32(1.0))), intra_op_threads())\n")
    value, threads = out.split()
    assert abs(float(value) - np.sin(1.0)) < 1e-6 and threads == "2"


def test_target_table_prints_one_line_per_target():
    text = repr(hlo2onnx.TARGETS)
    assert str(hlo2onnx.TARGETS) == text
    lines = text.splitlines()
    assert len(lines) == len(hlo2onnx.TARGETS) and len(text) < 200 * len(lines)
    for line, (name, target) in zip(lines, hlo2onnx.TARGETS.items()):
        assert line.startswith(name) and f"{target.runtime} on {target.device}" in line
    assert repr(hlo2onnx.TARGETS["ort-cpu"]) == "Target('ort-cpu', runtime='onnxruntime', device='cpu')"


def test_help_and_version_load_neither_jax_nor_onnx():
    out = run_python("import sys\n"
                     "from hlo2onnx.cli import main\n"
                     "for argv in (['--help'], ['--version']):\n"
                     "    assert main(argv) == 0\n"
                     "print(sorted(m for m in ('jax', 'onnx', 'onnx_ir', 'ml_dtypes', 'numpy') if m in sys.modules))\n")
    assert "usage: hlo2onnx" in out and "--input-names" in out and "--list-targets" in out
    assert f"hlo2onnx {hlo2onnx.defaults.__version__}" in out
    assert out.strip().splitlines()[-1] == "[]"


def test_check_states_its_tolerance_and_the_sizes_tried():
    b = export.symbolic_shape("b")[0]
    exported = export.export(jax.jit(lambda x: jnp.tanh(x) * 2))(jax.ShapeDtypeStruct((b, 3), jnp.float32))
    result = hlo2onnx.convert(exported, dynamic=True).check(sizes=(2, 7))
    assert result.sizes == [2, 7] and result.tolerances == {"float32": (1e-4, 1e-5)}
    assert "over 2 runs (symbolic dims = 2, 7), tolerance float32 rtol=0.0001 atol=1e-05: ok" in result.summary()


def test_report_gives_signature_placement_and_tier():
    def classify(inputs):
        return {"probs": jax.nn.softmax(inputs["image"])}

    text = mnjit(classify).lower({"image": np.ones((2, 3), np.float32)}).report()
    first, second = text.splitlines()[:2]
    assert first == "signature: classify(image: float[2,3]) -> (probs: float[2,3])"
    assert second == "runs on: ort-cpu (onnxruntime on cpu)"
    assert "StableHLO ops" in text
    conversion = hlo2onnx.convert(jax.jit(classify).lower({"image": np.ones((2, 3), np.float32)}))
    assert conversion.report().splitlines()[0] == "signature: jit_classify(image: float[2,3]) -> (probs: float[2,3])"


def test_tier_status_explains_pending_and_decided():
    pending = tiering.TierStatus("ort-cpu", False, "pending: iree-cpu compiling in the background")
    assert "calls never wait" in str(pending) and "mnjit.settle(f, *args)" in repr(pending)
    decided = tiering.TierStatus("iree-cpu", True, "faster (0.1 ms against 0.3 ms)")
    assert str(decided) == "iree-cpu: faster (0.1 ms against 0.3 ms) (decided)"
