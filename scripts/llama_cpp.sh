#!/usr/bin/env bash
# llama.cpp as a benchmark peer, built from the source that the `llama-cpp-python` source
# distribution on the package index carries (vendor/llama.cpp), so that a machine without
# internet access can build it from one small file.
#
#   scripts/llama_cpp.sh pack [DIR]          here: download the source distribution, strip it
#                                            to what llama-bench and llama-server need, write
#                                            DIR/llama.cpp.tar.gz (about 8 MB; DIR: .whl)
#   scripts/llama_cpp.sh build TARBALL BUILD [cuda|cpu|avx2] [targets...]
#                                            there: unpack and build (default targets:
#                                            llama-bench); prints the binaries' paths. cpu:
#                                            for this machine's CPU (-DGGML_NATIVE=ON); avx2:
#                                            for AVX2 with FMA and F16C and no wider, the peer
#                                            of bench_cpu_runtimes.py --isa avx2 on a CPU with
#                                            AVX-512
#
# On the H100 machine the CUDA build (`cmake -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90`) of
# llama-bench takes 5-6 minutes with 16 jobs; the CPU build (`-DGGML_NATIVE=ON`) about 6 minutes
# on 2 cores. bench/bench_llm.py --llama-bench BUILD/bin/llama-bench runs it beside clops.
set -euo pipefail

cmd=${1:-}
shift || true
case "$cmd" in
  pack)
    out=$(cd "${1:-.whl}" 2>/dev/null && pwd || { mkdir -p "${1:-.whl}" && cd "${1:-.whl}" && pwd; })
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    python3 -m pip download -q --no-binary :all: --no-deps llama-cpp-python -d "$work"
    tar -xzf "$work"/llama_cpp_python-*.tar.gz -C "$work"
    src=$(echo "$work"/llama_cpp_python-*/vendor/llama.cpp)
    # what neither llama-bench nor llama-server needs: model files, docs, the web UI's sources,
    # benchmarks, tests and the backends other than CPU and CUDA
    rm -rf "$src"/{models,docs,benches,media,tests,gguf-py,examples,pocs,skills} \
           "$src"/tools/ui/{src,tests,static}
    for b in "$src"/ggml/src/ggml-*/; do
      case "$(basename "$b")" in ggml-cpu|ggml-cuda|ggml-blas) ;; *) rm -rf "$b" ;; esac
    done
    mkdir -p "$src/examples" && : >"$src/examples/CMakeLists.txt"
    version=$(basename "$work"/llama_cpp_python-*.tar.gz .tar.gz)
    echo "$version" >"$src/CLOPS_SOURCE"
    tar -czf "$out/llama.cpp.tar.gz" -C "$(dirname "$src")" llama.cpp
    echo "$out/llama.cpp.tar.gz ($version, $(du -h "$out/llama.cpp.tar.gz" | cut -f1))"
    ;;
  build)
    tarball=$1 build=$2 kind=${3:-cuda}
    shift 3 || shift $#
    targets=("$@")
    [ ${#targets[@]} -gt 0 ] || targets=(llama-bench)
    mkdir -p "$build"
    build=$(cd "$build" && pwd)
    if [ ! -d "$build/src/llama.cpp" ]; then
      mkdir -p "$build/src" && tar -xzf "$tarball" -C "$build/src"
    fi
    opts=(-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF
          -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DCMAKE_BUILD_TYPE=Release)
    if [ "$kind" = cuda ]; then
      opts+=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90}" -DGGML_NATIVE=OFF)
    elif [ "$kind" = avx2 ]; then
      opts+=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_BMI2=ON -DGGML_FMA=ON
             -DGGML_F16C=ON -DGGML_AVX512=OFF -DGGML_AVX_VNNI=OFF)
    else
      opts+=(-DGGML_NATIVE=ON)
    fi
    case " ${targets[*]} " in
      *" llama-server "*) opts+=(-DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON) ;;
      *) opts+=(-DLLAMA_BUILD_SERVER=OFF) ;;
    esac
    cmake -S "$build/src/llama.cpp" -B "$build" "${opts[@]}" >"$build/configure.log" 2>&1 \
      || { tail -40 "$build/configure.log"; exit 1; }
    cmake --build "$build" --target "${targets[@]}" -j"$(nproc)" >"$build/build.log" 2>&1 \
      || { tail -60 "$build/build.log"; exit 1; }
    for t in "${targets[@]}"; do echo "$build/bin/$t"; done
    ;;
  *)
    sed -n 2,16p "$0" >&2
    exit 2
    ;;
esac
