"""The CUDA fast path on tiny models: graphs change no token, exact mode reproduces plain decoding.

Marked ``gpu``: they skip without CUDA. The device probe (scripts/gpu_probe.py) runs this file
with ``--noconftest``, so it needs nothing from the conftest files (their TUI imports are absent
on the device image).
"""

from __future__ import annotations

import warnings

import pytest
import torch

from specchat.engine.backend import Controls
from specchat.engine.events import RoundEvent, SummaryEvent, TokenEvent
from specchat.engine.session import ChatEngine
from specchat.engine.static import StaticLM
from specchat.testing.tiny_models import make_tiny_pair
from tests.typed import model_drafter

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

TEXT = "the cat sat on the mat. the cat sat on"


def token_ids(events: object) -> list[int]:
    return [e.token_id for e in events if isinstance(e, TokenEvent)]  # type: ignore[attr-defined]


def cuda_engine(kv: str, *, graphs: bool = True, dtype: torch.dtype = torch.float32) -> ChatEngine:
    pair = make_tiny_pair(seed=0, draft_noise=0.5, logit_scale=2.5)
    # transformers wraps .to with functools.wraps, which mypy does not bind to the instance.
    target, draft = pair.target.to("cuda", dtype), pair.draft.to("cuda", dtype)  # type: ignore[arg-type]
    engine = ChatEngine(target, pair.tokenizer, draft, kv=kv)
    for lm in (engine.target, engine.draft):
        if isinstance(lm, StaticLM):
            lm.graphs = graphs
    model_drafter(engine).stop_below = 0.0
    return engine


@pytest.mark.parametrize("gamma", [1, 4])
@pytest.mark.parametrize("drafter", ["model", "ngram", "hybrid"])
def test_graphs_give_the_eager_static_tokens(gamma: int, drafter: str) -> None:
    graphed, eager = cuda_engine("static"), cuda_engine("static", graphs=False)
    prompt = graphed.prompt_ids([{"role": "user", "content": TEXT}])
    controls = Controls(gamma=gamma, drafter=drafter, max_new_tokens=40)
    assert token_ids(graphed.stream_ids(prompt, controls)) == token_ids(eager.stream_ids(prompt, controls))
    assert isinstance(graphed.target, StaticLM) and graphed.target.graph_error is None
    assert graphed.target.capture_s > 0


def test_auto_takes_the_static_cache_with_graphs_on_cuda() -> None:
    engine = cuda_engine("auto")
    assert isinstance(engine.target, StaticLM) and engine.target.graphs


def test_a_round_syncs_once() -> None:
    engine = cuda_engine("static")
    engine._decoder.stop_ids = frozenset()
    prompt = engine.prompt_ids([{"role": "user", "content": TEXT}])
    reply = engine.start_ids(prompt, Controls(gamma=4, drafter="model", max_new_tokens=60))
    reply.step()  # captures the graphs
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            events = [e for _ in range(5) for e in reply.step()]
        finally:
            torch.cuda.set_sync_debug_mode("default")
    rounds = sum(isinstance(e, RoundEvent) for e in events)
    # torch's one-off notice that the debug mode is a prototype is not a sync.
    syncs = [w for w in caught if "called a synchronizing CUDA operation" in str(w.message)]
    assert rounds == 5 and not any(isinstance(e, SummaryEvent) for e in events)
    assert len(syncs) <= rounds, [str(w.message) for w in syncs]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_exact_mode_drafting_for_itself_accepts_every_draft(dtype: torch.dtype) -> None:
    """Exact mode: the verify rows are the one-token rows, so the target drafting for itself is
    always right (α = 1) and greedy speculative output is plain decoding's."""
    from specchat.engine import sampling
    from specchat.engine.exact import use_exact_kernels

    pair = make_tiny_pair(seed=0, logit_scale=2.5)
    target = pair.target.to("cuda", dtype)  # type: ignore[arg-type]  # functools.wraps, as above
    try:
        use_exact_kernels(target)
        engine = ChatEngine(target, pair.tokenizer, target, kv="static")
        model_drafter(engine).stop_below = 0.0
        prompt = engine.prompt_ids([{"role": "user", "content": TEXT}])
        controls = Controls(gamma=4, drafter="model", max_new_tokens=40)
        events = list(engine.stream_ids(prompt, controls))
        assert token_ids(events) == token_ids(engine.stream_plain(prompt, controls))
        summary = events[-1]
        assert isinstance(summary, SummaryEvent) and summary.alpha == 1.0
    finally:
        sampling.use_cuda_softmax(None)
