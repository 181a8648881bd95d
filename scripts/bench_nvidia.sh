#!/usr/bin/env bash
# Runs the benchmark suite on an NVIDIA GPU machine without internet access: installs the
# pyopencl wheels carried in .whl/ (scripts/device_env.sh; clops registers the NVIDIA OpenCL
# driver, libnvidia-opencl.so.1, in an ICD folder of its own when no loader lists it), then
# bench/run_all.py on the GPU with PyTorch (same GPU) as the peer. Results go to
# bench/results/ (or --out DIR): RESULTS.md's generated section, the rest of it kept.
#
#   scripts/bench_nvidia.sh [--model SmolLM2.gguf [--model-label NAME]] [--out DIR]
#                           [--models DIR --llama-bench PATH]   # beside llama.cpp CUDA
#
# The decode table beside llama.cpp: `scripts/llama_cpp.sh pack` and `python bench/models.py
# prepare .whl/prep` here; there `scripts/llama_cpp.sh build .whl/llama.cpp.tar.gz /tmp/lb`,
# `python bench/models.py write .whl/prep /tmp/models`, then this script with
# `--models /tmp/models --llama-bench /tmp/lb/bin/llama-bench`.
#
# A GGUF too large to carry can travel as its header: `python bench/standin_gguf.py skeleton
# model.gguf model.skel.npz` here, `python bench/standin_gguf.py fill model.skel.npz
# model.gguf` there (random weights of the same types and shapes: the same bytes per token).
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$here/scripts/device_env.sh"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
python3 -m clops info || exit 1
exec python3 "$here/bench/run_all.py" --device gpu "$@"
