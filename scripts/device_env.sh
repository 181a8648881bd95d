#!/usr/bin/env bash
# Source on a GPU machine without internet: installs the Python wheels carried in .whl/ (pyopencl
# and its pure-Python needs) into /tmp/site and puts the checkout on PYTHONPATH. clops registers
# an installed but unlisted OpenCL driver (e.g. libnvidia-opencl.so.1) by itself.
set -e
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [ -d "$here/.whl" ] && [ ! -f /tmp/site/.clops-wheels ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$here"/.whl/*.whl
  touch /tmp/site/.clops-wheels
fi
export PYTHONPATH="$here:/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
set +e
