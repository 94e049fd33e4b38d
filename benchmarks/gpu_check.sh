#!/usr/bin/env bash
# The GPU check: ort-cuda's and iree-cuda's tests and benchmark on a lent GPU machine, in a few minutes.
#
# Such a machine has jax with its CUDA plugin but no package index and takes at most 64 MiB per command, so
# onnxruntime-gpu (255 MB) and IREE (99 MB) arrive in chunks made here by benchmarks/gpu_wheels.sh, one chunk
# per command:
#   benchmarks/gpu_check.sh stage    # carrying .gpu/ with one chunk: keeps it under $STAGE, prints the machine
#   benchmarks/gpu_check.sh          # carrying the last chunk: reassembles, installs, checks, benchmarks
# The stage lives in /tmp, which outlasts a command while the machine is held (not once it is given back).
# Without a GPU or without the chunks it says so and exits non-zero; `FULL=1` also runs the whole suite
# there (informational: the machine lacks the samples' jax-md and jax-cfd). Output also goes to
# $OUT/gpu_check.log when OUT is set.
set -uo pipefail
cd "$(dirname "$0")/.."
STAGE=${STAGE:-/tmp/mnjit-gpu-stage}
SITE=${SITE:-/tmp/mnjit-site}
PYTHON=${PYTHON:-python3}
mkdir -p "$STAGE"
[ -d .gpu ] && cp -f .gpu/* "$STAGE"/ 2>/dev/null
probe() {
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1
  "$PYTHON" -c 'import sys, jax; print("Python", sys.version.split()[0], "| jax", jax.__version__, jax.devices())' 2>&1 | tail -1
}
if [ "${1:-}" = stage ]; then
  ls -l "$STAGE"
  probe
  exit 0
fi
[ -n "${OUT:-}" ] && exec > >(tee "$OUT/gpu_check.log") 2>&1

step() { echo; echo "== $* ($(date +%T))"; }

step "assembling the wheels"
if [ ! -f "$STAGE/SHA256SUMS" ] || [ ! -f "$STAGE/PARTS" ]; then
  echo "no .gpu/SHA256SUMS and .gpu/PARTS carried: run benchmarks/gpu_wheels.sh here first"
  exit 2
fi
(
  cd "$STAGE" || exit 1
  have=$(ls wheels.tar.part-* 2>/dev/null | wc -l)
  [ "$have" = "$(cat PARTS)" ] || { echo "$have of $(cat PARTS) chunks here"; exit 1; }
  [ -f .unpacked ] || { cat wheels.tar.part-* | tar -xf - && touch .unpacked; }
  sha256sum -c SHA256SUMS
) || { echo "a chunk is missing or damaged: carry each .gpu/wheels.tar.part-NN once with 'stage', then run again"; exit 2; }
# Once per machine: a rerun (while the machine is held) starts at the checks.
[ -f "$SITE/.installed" ] || { "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
  --upgrade --target "$SITE" "$STAGE"/*.whl && touch "$SITE/.installed"; } || exit 2
# Several test processes share the GPU: jax must not take 75% of its memory in each.
export PYTHONPATH="$SITE:$PWD" JAX_PLATFORMS=cuda,cpu PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false

step "machine"
probe
"$PYTHON" -c 'import onnxruntime as ort, onnx, iree.runtime as rt
print("onnx", onnx.__version__, "| onnxruntime", ort.__version__, ort.__file__, ort.get_available_providers())
print("IREE runtime drivers", rt.query_available_drivers())'

status=0
step "tests/test_cuda.py and tests/test_compat.py"
timeout 120 "$PYTHON" -m pytest -q -p no:cacheprovider -rs tests/test_cuda.py tests/test_compat.py || status=1

step "tests/test_iree_cuda.py: IREE's CUDA backend (the iree-cuda target)"
timeout 180 "$PYTHON" -m pytest -q -p no:cacheprovider -rs -n 8 tests/test_iree_cuda.py || status=1

# One process per target: a runtime that fails hard takes only its own numbers with it.
for target in ort-cuda iree-cuda; do
  step "benchmarks/bench_device.py, $target against jax.jit on the GPU"
  timeout 150 "$PYTHON" benchmarks/bench_device.py --targets $target --models mlp,cnn,transformer --rounds 3 \
    || status=1
done

if [ "${FULL:-0}" = 1 ]; then
  step "the whole suite on this machine's jax (CPU arrays; informational)"
  JAX_PLATFORMS=cpu timeout 300 "$PYTHON" -m pytest -q -p no:cacheprovider -n 12 -x --maxfail=20 tests || status=1
fi
step "done: status $status"
exit $status
