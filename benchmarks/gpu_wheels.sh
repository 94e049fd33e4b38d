#!/usr/bin/env bash
# Prepares, on a machine with a package index, the wheels benchmarks/gpu_check.sh installs on a GPU machine
# that has none, as chunks small enough to be carried one per command (the lent machines take at most
# 64 MiB a command, with the working tree). Writes .gpu/ (git-ignored through .git/info/exclude):
#   .gpu/SHA256SUMS          the wheels' checksums, checked after reassembly
#   .gpu/wheels.tar.part-NN  one uncompressed tar of all the wheels (wheels are zip files already), cut in
#                            chunks: one stream rather than a chunk series per wheel needs the fewest commands
# Then carry .gpu/SHA256SUMS with each chunk in turn: `benchmarks/gpu_check.sh stage` for all but the last,
# plain `benchmarks/gpu_check.sh` with the last (README, "Targets").
#   benchmarks/gpu_wheels.sh [CHUNK_BYTES] [PACKAGE==VERSION ...]
# The default: onnxruntime-gpu 1.31.1 (CUDA 13, cuDNN 9) for CPython 3.12, what the GPU machine's jax 0.11.2
# with jax-cuda13-plugin pairs with (it brings its numpy, onnx and CUDA libraries itself), and IREE's compiler
# and runtime 3.13 (the iree-cuda target: IREE's own CUDA driver, which needs only the NVIDIA driver).
# 6 chunks of 64,000,000 bytes in all.
set -euo pipefail
cd "$(dirname "$0")/.."
chunk=${1:-64000000}
shift || true
packages=("${@:-onnxruntime-gpu==1.31.1}")
[ $# -gt 0 ] || packages+=(iree-base-compiler==3.13.0 iree-base-runtime==3.13.0)
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
rm -rf .gpu .gpu-download
mkdir -p .gpu .gpu-download
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .gpu-download "${packages[@]}"
(cd .gpu-download && sha256sum ./*.whl > ../.gpu/SHA256SUMS)
tar -C .gpu-download -cf - $(cd .gpu-download && ls ./*.whl) | split -b "$chunk" -d -a 2 - .gpu/wheels.tar.part-
ls .gpu/wheels.tar.part-* | wc -l | tr -d ' ' > .gpu/PARTS
rm -rf .gpu-download
ls -l .gpu
