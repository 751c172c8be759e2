"""Greedy text and plain speed of one GGUF file on specchat's kernels against llama.cpp on the same file.

    python -m specchat.bench.peer_text --llama-cpp DIR FILE.gguf [--prompts 5] [--tokens 64] [--threads 2]

For each prompt (the first of each category of the bench's prompt set, through the file's chat
template), both decode greedily from the same token ids, interleaved prompt by prompt: specchat
plain on the fast path, then ``llama-server`` plain. The token ids must be equal; where they part,
the line gives each program's margin between the two tokens there (log-probability of its own
pick minus the other's) and how far apart the two programs' log-probabilities of the same token
were on the positions before. Two programs that quantize activations and sum in different
orders disagree a little everywhere; where both margins are within that disagreement, the two
tokens were a near tie that either program may break its way (explained: each margin within the
largest gap the two programs show for the same token anywhere in the file); a larger margin
would be a bug. tok/s are each program's own decoding
rate (specchat: the wall time of the steps after the first token; llama.cpp: its
``predicted_per_second``).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specchat.engine.compare import first_difference

if TYPE_CHECKING:
    from specchat.bench.llamacpp_peer import LlamaCppPeer
    from specchat.bench.prompt_record import BenchPrompt
    from specchat.engine.session import ChatEngine

TOP = 8
"""Candidates per token whose log-probabilities llama.cpp reports (its margin needs ours among them)."""


@dataclass(frozen=True)
class Comparison:
    prompt: str
    ours: list[int]
    theirs: list[int]
    our_tok_s: float
    their_tok_s: float
    diverge_at: int | None
    our_margin: float | None = None
    """specchat's log-probability of its token minus llama.cpp's token, where they part."""
    their_margin: float | None = None
    """The same for llama.cpp (None: specchat's token is not among llama.cpp's best TOP)."""
    disagreement: float = 0.0
    """The largest difference between the two programs' log-probabilities of the same token on
    the positions before the parting: how far apart their numbers are on this prompt."""
    float_margin: float | None = None
    """The float model's (transformers on the file's dequantized weights) log-probability of
    specchat's token minus llama.cpp's, where they part (None: not asked for)."""

    def explained(self, disagreement: float) -> bool:
        """Equal; or parted where both programs held the two tokens closer than ``disagreement``
        (the largest gap between their numbers for the same token, over the whole file); or
        where the float model itself prefers specchat's token (llama.cpp's own arithmetic,
        fp16 tables and caches, is what turned)."""
        if self.diverge_at is None:
            return True
        if self.float_margin is not None and self.float_margin > 0:
            return True
        margins = (self.our_margin, self.their_margin)
        return all(m is not None and abs(m) <= disagreement for m in margins)


def our_log_probs(model: Any, prompt: list[int], reply: list[int]) -> Any:
    """specchat's log-probabilities for each reply position ([len(reply), vocab]), in one pass:
    every row of a pass is bit for bit the one-token pass that produced the reply."""
    import torch

    ids = torch.tensor([prompt + reply[:-1]])
    logits = model(ids, None, logits_to_keep=len(reply)).logits[0].float()
    return torch.log_softmax(logits, dim=-1)


def their_log_probs(data: dict[str, Any]) -> dict[int, dict[int, float]]:
    """llama-server's top log-probabilities by reply position (token id → log-probability), for
    the positions it reports alone.

    The server sends one probability row per piece of text, and a token whose bytes end inside a
    UTF-8 character waits for the next: those tokens share one row (it names the last token, and
    its bytes are the whole group's), and a group still open at the end gets no row. So a row is
    placed by its token id, and kept only when its bytes are that one token's own.
    """
    tokens = [int(t) for t in data.get("tokens") or []]
    placed: dict[int, dict[int, float]] = {}
    position = 0
    for row in data.get("completion_probabilities") or []:
        while position < len(tokens) and tokens[position] != row.get("id"):
            position += 1
        top = {int(c["id"]): c for c in row.get("top_logprobs", [])}
        own = top.get(row.get("id", -1))
        if position < len(tokens) and own is not None and own.get("bytes") == row.get("bytes"):
            placed[position] = {token: float(c["logprob"]) for token, c in top.items()}
        position += 1
    return placed


def compare(
    prompt: str, ours: list[int], theirs: list[int], mine: Any, other: dict[int, dict[int, float]],
    rates: tuple[float, float],
) -> Comparison:  # fmt: skip
    at = first_difference(ours, theirs)
    agreed = [
        abs(float(mine[j, token]) - other[j][token])
        for j, token in enumerate(ours[: len(ours) if at is None else at])
        if token in other.get(j, {})
    ]
    disagreement = max(agreed, default=0.0)
    if at is None or at >= len(ours) or at >= len(theirs) or at not in other:
        return Comparison(prompt, ours, theirs, *rates, at, disagreement=disagreement)
    mine_gap = float(mine[at, ours[at]] - mine[at, theirs[at]])
    their_gap = other[at][theirs[at]] - other[at][ours[at]] if ours[at] in other[at] else None
    return Comparison(prompt, ours, theirs, *rates, at, mine_gap, their_gap, disagreement)


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)

    import torch

    from specchat.bench.llamacpp_peer import start_peer
    from specchat.bench.prompts import load_prompts
    from specchat.engine.session import ChatEngine
    from specchat.kernels import variant
    from specchat.models.loading.loader import load_for_decoding

    torch.set_num_threads(args.threads)
    pair = load_for_decoding(str(args.gguf), None, cpu_path="auto")
    engine = ChatEngine(pair.target, pair.tokenizer, None)
    prompts = load_prompts(per_category=1)[: args.prompts]
    reference = float_model(args.gguf) if args.float_reference else None
    print(
        f"{args.gguf.name}: specchat {pair.kernels} on {variant()} kernels vs llama.cpp, "
        f"{args.threads} threads"
    )
    results = []
    with tempfile.TemporaryDirectory() as logs:
        peer = start_peer(
            args.llama_cpp, args.gguf, None, threads=args.threads, context=4096, draft_max=4,
            stop_ids=engine.stop_ids, log_dir=Path(logs),
        )  # fmt: skip
        try:
            for prompt in prompts:
                results.append(_compare_prompt(engine, pair.target, peer, prompt, args.tokens, reference))
                print(describe(results[-1]), flush=True)
        finally:
            peer.close()
    return _verdict(results)


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m specchat.bench.peer_text", description=__doc__.split("\n")[0]
    )
    parser.add_argument("gguf", type=Path)
    parser.add_argument("--llama-cpp", type=Path, required=True, help="the folder holding llama-server")
    parser.add_argument("--prompts", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--float-reference",
        action="store_true",
        help="also load the file into transformers (float32, dequantized; memory: 4 bytes a weight) "
        "and say which program's token the float model prefers where they part",
    )
    return parser.parse_args(argv)


def _compare_prompt(
    engine: ChatEngine, model: Any, peer: LlamaCppPeer, prompt: BenchPrompt, tokens: int, reference: Any
) -> Comparison:
    """One prompt decoded plainly by both programs, compared token by token (and, with a float
    ``reference``, where they part, which token the float model prefers)."""
    from specchat.bench.llamacpp_peer import PLAIN_ROW, parse_completion
    from specchat.engine.backend import Controls
    from specchat.engine.events import TokenEvent

    ids = engine.prompt_ids(list(prompt.messages))
    times, ours = [], []
    for event in engine.stream_plain(ids, Controls(max_new_tokens=tokens, drafter="none")):
        if isinstance(event, TokenEvent):
            ours.append(event.token_id)
            times.append(time.perf_counter())
    data = peer.servers[PLAIN_ROW].complete(ids, tokens, n_probs=TOP)
    completion = parse_completion(data, engine.stop_ids)
    theirs = completion.token_ids
    our_rate = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else 0.0
    timing = completion.timings
    their_rate = timing.decode_steps / (timing.predicted_ms / 1000) if timing and timing.predicted_ms else 0.0
    mine = our_log_probs(model, ids, ours) if ours else None
    result = compare(prompt.id, ours, theirs, mine, their_log_probs(data), (our_rate, their_rate))
    if reference is not None and result.our_margin is not None:
        at = result.diverge_at or 0
        floats = our_log_probs(reference, ids, ours[: at + 1])[at]
        result = replace(result, float_margin=float(floats[ours[at]] - floats[theirs[at]]))
    return result


def _verdict(results: list[Comparison]) -> int:
    """The closing lines: how many prompts agreed, both speeds, and whether every parting is a
    near tie within the programs' own disagreement (exit 0) or not (1)."""
    equal = sum(r.diverge_at is None for r in results)
    ours_mean = sum(r.our_tok_s for r in results) / len(results)
    theirs_mean = sum(r.their_tok_s for r in results) / len(results)
    print(
        f"equal {equal}/{len(results)}; plain tok/s: specchat {ours_mean:.1f}, llama.cpp {theirs_mean:.1f} "
        f"({ours_mean / theirs_mean:.2f}×)"
    )
    disagreement = max(r.disagreement for r in results)
    for result in results:
        if result.diverge_at is not None:
            verdict = "explained" if result.explained(disagreement) else "NOT explained"
            print(f"  {result.prompt}: a near tie within the programs' disagreement? {verdict}")
    print(f"the two programs' largest log-probability gap for the same token: {disagreement:.3f}")
    return 0 if all(r.explained(disagreement) for r in results) else 1


def float_model(path: Path) -> Any:
    """transformers' own reading of the GGUF, dequantized to float32: the reference both programs
    approximate (a callable taking (ids, cache, logits_to_keep), as specchat's models do)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()

    def forward(ids: Any, _cache: Any, logits_to_keep: int) -> Any:
        with torch.inference_mode():
            return model(input_ids=ids, logits_to_keep=logits_to_keep)

    return forward


def describe(result: Comparison) -> str:
    rates = f"specchat {result.our_tok_s:5.1f} tok/s, llama.cpp {result.their_tok_s:5.1f}"
    if result.diverge_at is None:
        return f"  {result.prompt:<14} equal ({len(result.ours)} tokens)   {rates}"

    def gap(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.3f}"

    return (
        f"  {result.prompt:<14} part at token {result.diverge_at}: margins specchat "
        f"{gap(result.our_margin)}, llama.cpp {gap(result.their_margin)}, disagreement before "
        f"{result.disagreement:.3f}{_float_note(result)}   {rates}"
    )


def _float_note(result: Comparison) -> str:
    if result.float_margin is None:
        return ""
    side = "specchat's" if result.float_margin > 0 else "llama.cpp's"
    return f"; the float model prefers {side} token by {abs(result.float_margin):.3f}"


if __name__ == "__main__":
    sys.exit(main())
