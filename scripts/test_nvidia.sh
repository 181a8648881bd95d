#!/usr/bin/env bash
# Runs the GPU-relevant test suites on an NVIDIA GPU machine without internet access (the
# pyopencl wheels carried in .whl/, see scripts/device_env.sh), on the GPU alone; extra
# arguments go to pytest. Suites that need models or peers the machine lacks skip themselves.
#
#   scripts/test_nvidia.sh [-x] [tests/nn tests/llm ...]
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$here/scripts/device_env.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
python3 -m clops info || exit 1
export CLOPS_TEST_DEVICES=${CLOPS_TEST_DEVICES:-gpu}
suites=()
for a in "$@"; do [[ $a == tests/* ]] && suites+=("$a"); done
if [ ${#suites[@]} -eq 0 ]; then
  set -- "$@" tests/runtime tests/async tests/nn tests/llm tests/compiler tests/array
fi
cd "$here" && exec python3 -m pytest -q -p no:cacheprovider "$@"
