#!/usr/bin/env bash
# Start llama-server with the packaged GGUF pair (target + draft) for `specchat --server`.
#
#   scripts/serve_llama.sh [PORT]          # default 8080; then: specchat --server http://127.0.0.1:PORT
#
# LLAMA_BIN: the folder holding llama-server (default ~/.cache/specchat-peers/llamacpp/bin;
# docs/servers.md, "llama.cpp's llama-server", says how to build it). GGUF_DIR: where `specchat` assembled the pair
# (default ~/.cache/specchat/gguf). The server takes both models' memory and every core it is
# given: on a shared machine it holds /tmp/specchat-heavy.lock for as long as it runs.
# Extra arguments after the port go to llama-server (e.g. --spec-draft-n-max 6).
set -euo pipefail

port=${1:-8080}
shift || true
bin=${LLAMA_BIN:-$HOME/.cache/specchat-peers/llamacpp/bin}
gguf=${GGUF_DIR:-$HOME/.cache/specchat/gguf}
for file in "$bin/llama-server" "$gguf/qwen.gguf" "$gguf/qwen05.gguf"; do
  [[ -e $file ]] || { echo "serve_llama.sh: $file is missing (docs/servers.md: llama.cpp's llama-server)" >&2; exit 2; }
done

exec 9>/tmp/specchat-heavy.lock
flock 9   # held by llama-server itself from here on (it inherits the descriptor)
export LD_LIBRARY_PATH=$bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# --spec-type draft-simple: current builds draft only when a speculation type is named.
# --metrics: Prometheus counters; -np 1: one slot (one conversation), the least memory.
exec "$bin/llama-server" -m "$gguf/qwen.gguf" --model-draft "$gguf/qwen05.gguf" \
  --spec-type draft-simple -t "${THREADS:-2}" -td "${THREADS:-2}" -c 4096 -np 1 \
  --host 127.0.0.1 --port "$port" --metrics "$@"
