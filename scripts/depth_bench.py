"""Prefill and decode speed of specchat's CPU decoder at a depth of context, as llama-bench's
``-d`` measures them: the KV cache is first filled with ``depth`` tokens (not timed), then

- pp: a pass over ``--prompt`` more tokens (llama-bench ``-p 512``), tokens per second;
- tg: ``--gen`` one-token steps (llama-bench ``-n 32``) from the same depth, tokens per second.

    python scripts/depth_bench.py qwen-coder-1.5b --depths 2048,8192,16384 --threads 2

Token ids are random (speed does not depend on them). Run it under the shared benchmark lock, and
llama-bench the same GGUF beside it (see docs/performance.md).
"""

from __future__ import annotations

import argparse
import os
import time


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("model", help="a packaged model's name or a GGUF file")
    parser.add_argument("--depths", default="2048,8192,16384,32768")
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--gen", type=int, default=32)
    parser.add_argument("--fill-chunk", type=int, default=512, help="tokens per pass while filling")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from specchat.models.compute.packed import load_native
    from specchat.models.compute.packed_cache import PackRecipe

    model = load_native(args.model, PackRecipe("gguf")).model
    vocab = int(model.input_rows)
    generator = torch.Generator().manual_seed(0)

    def ids(count: int) -> torch.Tensor:
        return torch.randint(0, vocab, (1, count), generator=generator)

    print("| depth | pp tok/s | tg tok/s | KV cache MB |")
    print("|---|---|---|---|")
    depths = sorted(int(d) for d in args.depths.split(","))
    cache = model.new_cache()
    cache.reserve(depths[-1] + args.prompt)  # no buffer growth inside a timed pass
    for depth in depths:  # one cache, filled further for each depth (what it holds is not timed)
        while cache.length < depth:
            model(ids(min(args.fill_chunk, depth - cache.length)), cache=cache)
        started = time.perf_counter()
        model(ids(args.prompt), cache=cache)
        pp = args.prompt / (time.perf_counter() - started)
        cache.length = depth  # tg starts from the same depth, as llama-bench's does
        started = time.perf_counter()
        for _ in range(args.gen):
            model(ids(1), cache=cache)
        tg = args.gen / (time.perf_counter() - started)
        cache.length = depth
        kv = 2 * cache.layers * cache.kv_heads * cache.head_dim * cache.dtype.itemsize * depth / 1e6
        print(f"| {depth} | {pp:.1f} | {tg:.2f} | {kv:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
