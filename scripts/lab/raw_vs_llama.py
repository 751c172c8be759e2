"""`specchat generate --raw` against llama-server's `/completion` on the same text.

    python scripts/lab/raw_vs_llama.py --llama-cpp DIR FILE.gguf [--tokens 48] [--threads 2]

For each prompt, specchat's own command (`specchat generate --raw PROMPT --format jsonl`, plain
greedy decoding on the file) and llama-server's `/completion` given the prompt as text, greedy.
Both tokenize the text themselves, adding BOS as the file says (`tokenizer.ggml.add_bos_token`)
and reading special tokens written in it; the prompt ids are compared first (llama-server's
`/tokenize` with `add_special`), then the generated ids. Where two replies part, the margins
there say whether it was a near tie (see specchat.bench.peer_text, whose comparison this reuses).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any

PROMPTS = (
    "The capital of France is",
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "<start_of_turn>user\nWrite a haiku about the sea.<end_of_turn>\n<start_of_turn>model\n",
)
"""A sentence to continue, code to continue, and a chat turn written out by hand (special tokens
in the text: raw mode must read them as the tokens they name, as llama.cpp does)."""


def post(url: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=3600) as reply:
        return json.loads(reply.read())


def ours(gguf: Path, prompt: str, tokens: int) -> tuple[list[int], str, int]:
    """specchat generate --raw: the reply's ids, its text and the prompt's length in tokens."""
    command = [
        sys.executable, "-m", "specchat", "generate", prompt, "--raw", "--target", str(gguf),
        "--draft", "none", "--drafter", "none", "--temperature", "0", "--max-new-tokens", str(tokens),
        "--format", "jsonl",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    reply = [line for line in lines if line["type"] == "token"]
    return [t["id"] for t in reply], "".join(t["text"] for t in reply), lines[-1]["prompt_tokens"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("gguf", type=Path)
    parser.add_argument("--llama-cpp", type=Path, required=True, help="the folder holding llama-server")
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--float-reference",
        action="store_true",
        help="also say which program's token the float model (transformers, the file dequantized) prefers",
    )
    args = parser.parse_args(argv)

    import torch

    from specchat.bench.llamacpp_peer import LlamaServer, find_server, parse_completion, server_version
    from specchat.bench.peer_text import TOP, compare, describe, float_model, our_log_probs, their_log_probs
    from specchat.engine.session import ChatEngine
    from specchat.models.loading.loader import load_for_decoding

    torch.set_num_threads(args.threads)
    pair = load_for_decoding(str(args.gguf), None, cpu_path="auto")
    engine = ChatEngine(pair.target, pair.tokenizer, None)
    reference = float_model(args.gguf) if args.float_reference else None
    binary = find_server(args.llama_cpp)
    version = server_version(binary)
    print(f"{args.gguf.name}: specchat generate --raw ({pair.kernels}) vs llama-server {version} /completion")
    results = []
    with tempfile.TemporaryDirectory() as logs:
        log = Path(logs) / "server.log"
        server = LlamaServer(binary, args.gguf, threads=args.threads, context=2048, log=log)
        try:
            for number, prompt in enumerate(PROMPTS, start=1):
                ids = engine.raw_ids(prompt)
                tokenized = post(f"{server.url}/tokenize", {"content": prompt, "add_special": True})
                mine, text, counted = ours(args.gguf, prompt, args.tokens)
                data = post(f"{server.url}/completion", completion(prompt, args.tokens, TOP))
                theirs = parse_completion(data, engine.stop_ids).token_ids
                same_prompt = ids == tokenized["tokens"] and counted == len(ids)
                bos = ids[:1] == [engine.tokenizer.bos_token_id]
                print(
                    f"prompt {number}: {len(ids)} tokens, BOS {bos}, same ids as llama.cpp's: {same_prompt}"
                )
                log_probs = our_log_probs(pair.target, ids, mine) if mine else None
                result = compare(
                    f"prompt {number}", mine, theirs, log_probs, their_log_probs(data), (0.0, 0.0)
                )
                at = result.diverge_at
                if reference is not None and at is not None and at < min(len(mine), len(theirs)):
                    floats = our_log_probs(reference, ids, mine[: at + 1])[at]
                    result = replace(result, float_margin=float(floats[mine[at]] - floats[theirs[at]]))
                results.append((result, same_prompt))
                print(describe(result).split("   specchat ")[0])
                print(f"    specchat: {text!r}\n    llama.cpp: {data.get('content', '')!r}")
        finally:
            server.close()
    disagreement = max(r.disagreement for r, _ in results)
    equal = sum(r.diverge_at is None for r, _ in results)
    explained = all(r.explained(disagreement) and same for r, same in results)
    print(
        f"equal {equal}/{len(results)}; every prompt tokenized alike and every parting explained: {explained}"
    )
    print(f"(the two programs' largest log-probability gap for the same token: {disagreement:.3f})")
    return 0 if explained else 1


def completion(prompt: str, tokens: int, top: int) -> dict[str, Any]:
    """llama-server's /completion, greedy, with the prompt as text: it tokenizes it itself."""
    return {
        "prompt": prompt,
        "n_predict": tokens,
        "temperature": 0.0,
        "cache_prompt": False,
        "return_tokens": True,
        "n_probs": top,
        "stream": False,
    }


if __name__ == "__main__":
    sys.exit(main())
