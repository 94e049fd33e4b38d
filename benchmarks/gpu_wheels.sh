#!/usr/bin/env bash
# Prepares, on a machine with a package index, the wheels benchmarks/gpu_check.sh installs on a GPU machine
# that has none, as chunks small enough to be carried one per command (the lent machines take at most
# 64 MiB a command, with the working tree). Writes .gpu/ (git-ignored through .git/info/exclude):
#   .gpu/SHA256SUMS          the whole wheels' checksums, checked after reassembly
#   .gpu/<wheel>.part-NN     the chunks
# Then carry .gpu/SHA256SUMS with each chunk in turn: `benchmarks/gpu_check.sh stage` for all but the last,
# plain `benchmarks/gpu_check.sh` with the last (benchmarks/README section in docs/runtime.md).
#   benchmarks/gpu_wheels.sh [CHUNK_BYTES] [PACKAGE==VERSION ...]
# The default is onnxruntime-gpu 1.31.1 (CUDA 13, cuDNN 9) for CPython 3.12, what the GPU machine's jax
# 0.11.2 with jax-cuda13-plugin pairs with; it brings its numpy, onnx and CUDA libraries itself.
set -euo pipefail
cd "$(dirname "$0")/.."
chunk=${1:-64000000}
shift || true
packages=("${@:-onnxruntime-gpu==1.31.1}")
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
rm -rf .gpu .gpu-download
mkdir -p .gpu .gpu-download
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .gpu-download "${packages[@]}"
(cd .gpu-download && sha256sum ./*.whl > ../.gpu/SHA256SUMS)
for wheel in .gpu-download/*.whl; do
  split -b "$chunk" -d -a 2 "$wheel" ".gpu/$(basename "$wheel").part-"
done
rm -rf .gpu-download
ls -l .gpu
