"""The whole forward in C++: close to the float model, row-independent, exact under speculation."""

from __future__ import annotations

import pytest
import torch

from specchat.engine.backend import Controls
from specchat.engine.events import TokenEvent
from specchat.engine.sampling import SamplingParams, shape_probs
from specchat.engine.session import ChatEngine
from specchat.kernels.formats import Unpacked, quantize_q8
from specchat.kernels.native import NativeCausalLM, native_model
from specchat.models.compute.packing import from_hf, pack_hf
from specchat.testing.tiny_models import make_model, make_tiny_pair, make_tokenizer, perturbed_copy
from tests.engine.test_exactness import (
    ALPHA_LEVEL,
    PROMPT,
    VOCAB_CHARS,
    chi_square_p_value,
    sample_two_tokens,
)
from tests.typed import host_draft

IDS = torch.tensor([[1, 5, 9, 12, 7, 30, 22, 4] * 6])


def logits(model: NativeCausalLM, ids: torch.Tensor, cache: object = None) -> torch.Tensor:
    return model(ids, cache, logits_to_keep=ids.shape[1]).logits[0]


def test_q8_forward_is_close_to_the_float_model() -> None:
    pair = make_tiny_pair(seed=0)
    native = from_hf(pair.target, bits=8)
    with torch.inference_mode():
        expected = pair.target(input_ids=IDS).logits[0]
    got = logits(native, IDS)
    assert float((got - expected).norm() / expected.norm()) < 0.03
    assert float((got.argmax(-1) == expected.argmax(-1)).float().mean()) > 0.9


def six_bit(weight: torch.Tensor, kind: str) -> Unpacked:
    """``weight`` quantized to Q6_K's range (six-bit values around 32), held as ``kind``."""
    eight = quantize_q8(weight.detach().float().numpy(), super_block=256)
    d = (eight.d.astype("float32") * 4).astype("float16")
    return Unpacked(kind, eight.q >> 2, eight.sc, d, eight.super_block, offset=32)


def test_six_bit_matrices_give_the_logits_of_the_same_values_held_in_q8(isa: str) -> None:
    model = make_model(48, 6, hidden_size=256)
    sources = {
        "embed": model.model.embed_tokens.weight,  # looked up row by row, not multiplied
        "head": model.lm_head.weight,
        "layers.0.down": model.model.layers[0].mlp.down_proj.weight,
        "layers.1.v": model.model.layers[1].self_attn.v_proj.weight,
    }
    runs = {}
    for kind in ("q6", "q8"):
        packed = pack_hf(model, bits=4)
        for name, weight in sources.items():
            packed.add_matrix(name, six_bit(weight, kind))
        runs[kind] = native_model(packed, model.config)
    whole = logits(runs["q8"], IDS)
    assert torch.equal(logits(runs["q6"], IDS), whole)
    cache, rows = runs["q6"].new_cache(), []
    for start in range(0, IDS.shape[1], 5):  # passes of 5 positions, then the next 5
        rows.append(logits(runs["q6"], IDS[:, start : start + 5], cache))
    assert torch.equal(torch.cat(rows), whole)


@pytest.mark.parametrize("bits", [4, 8])
def test_a_pass_over_many_positions_equals_one_position_at_a_time(isa: str, bits: int) -> None:
    native = from_hf(make_tiny_pair(seed=1).target, bits=bits)
    whole = logits(native, IDS)
    output = native(IDS[:, :5], None, logits_to_keep=5)
    rows, cache = [output.logits[0]], output.cache
    for start in range(5, IDS.shape[1], 3):  # then passes of 3 (a verify pass), then single steps
        chunk = IDS[:, start : start + 3]
        output = native(chunk, cache, logits_to_keep=chunk.shape[1])
        rows.append(output.logits[0])
        cache = output.cache
    assert torch.equal(torch.cat(rows), whole)
    cache.crop(-7)  # a rejection: roll back and recompute the same positions
    again = native(IDS[:, -7:], cache, logits_to_keep=7).logits[0]
    assert torch.equal(again, whole[-7:])


@pytest.mark.parametrize(("hidden", "heads"), [(64, 4), (256, 4), (256, 2)])
def test_every_head_width_attends_like_the_float_model_and_row_by_row(
    isa: str, hidden: int, heads: int
) -> None:
    """Heads 16, 64 and 128 wide: the kernels sum the values in registers at 64 and 128."""
    model = make_model(len(make_tokenizer()), seed=5, hidden_size=hidden, heads=heads, logit_scale=2.0)
    native = from_hf(model, bits=8)
    with torch.inference_mode():
        expected = model(input_ids=IDS).logits[0]
    got = logits(native, IDS)
    assert float((got - expected).norm() / expected.norm()) < 0.03
    first = native(IDS[:, :40], None, logits_to_keep=40)
    rest = native(IDS[:, 40:], first.cache, logits_to_keep=IDS.shape[1] - 40).logits[0]
    assert torch.equal(torch.cat([first.logits[0], rest]), got)


@pytest.mark.parametrize("drafter", ["model", "ngram", "hybrid"])
@pytest.mark.parametrize("gamma", [1, 3, 6])
def test_greedy_speculation_equals_plain_decoding(drafter: str, gamma: int) -> None:
    pair = make_tiny_pair(seed=2, draft_noise=0.5, logit_scale=2.5)
    draft = from_hf(pair.draft, bits=4)
    draft.narrow_head = 24  # the drafter widens it for text past its ids
    engine = ChatEngine(from_hf(pair.target, bits=4), pair.tokenizer, draft)
    prompt = engine.prompt_ids([{"role": "user", "content": "the cat sat on the mat. the cat sat on"}])
    controls = Controls(gamma=gamma, drafter=drafter, max_new_tokens=48)
    plain = [e.token_id for e in engine.stream_plain(prompt, controls) if isinstance(e, TokenEvent)]
    spec = [e.token_id for e in engine.stream_ids(prompt, controls) if isinstance(e, TokenEvent)]
    assert spec == plain


def test_a_narrow_head_gives_the_first_ids_logits_bit_for_bit() -> None:
    native = from_hf(make_tiny_pair(seed=1).draft, bits=4)
    whole = logits(native, IDS)
    for rows in (16, 20, 40):
        narrow = native(IDS, None, logits_to_keep=IDS.shape[1], head_rows=rows).logits[0]
        assert narrow.shape == (IDS.shape[1], rows) and torch.equal(narrow, whole[:, :rows])
    native.narrow_head = 20  # the default for every pass; an explicit head_rows overrides it
    assert logits(native, IDS).shape[1] == 20
    assert torch.equal(native(IDS, None, logits_to_keep=1, head_rows=whole.shape[1]).logits[0], whole[-1:])


def test_the_drafter_computes_the_whole_head_only_for_text_past_the_narrow_one() -> None:
    from specchat.engine.drafters import ModelDrafter
    from specchat.engine.kv import CachedLM

    native = from_hf(make_tiny_pair(seed=1).draft, bits=4)
    draft = CachedLM(native)
    drafter = ModelDrafter(draft, draft.vocab_width)
    assert drafter.head_rows([5, 9, 30, 31] * 8) is None  # no narrow head: the model's default
    native.narrow_head = 16
    assert drafter.head_rows([5, 9, 3, 7] * 16 + [30] * 7) is None  # 7 of the last 64 past it
    assert drafter.head_rows([5, 9, 3, 7] * 16 + [30] * 8) == draft.vocab_width  # an eighth


def test_a_row_exact_draft_reads_its_catch_up_in_the_pass_it_drafts_from() -> None:
    """A row's logits do not depend on the width of its pass on the kernels, so a draft behind
    by a whole prompt reads it in its first drafting pass (a torch model reads it in a pass of its
    own first) and still draws from the same rows whatever its cache held before."""
    from specchat.engine.drafters import ModelDrafter
    from specchat.engine.kv import CachedLM

    pair = make_tiny_pair(seed=2, logit_scale=2.0)
    prompt = [(7 * i) % 40 + 1 for i in range(60)]

    def drafted(lm: CachedLM) -> tuple[list[int], torch.Tensor, int]:
        calls = lm.forward_calls
        drafter = ModelDrafter(lm, lm.vocab_width, stop_below=0.0)
        draft = host_draft(drafter.propose(prompt, 3, SamplingParams(), None))
        return draft.ids, draft.p_draft, lm.forward_calls - calls

    native = CachedLM(from_hf(pair.draft, bits=4))
    assert native.rows_exact and not CachedLM(pair.draft).rows_exact
    ids, rows, passes = drafted(native)
    assert passes == 3  # 60 tokens and the first draft in one pass, then one a draft
    assert drafted(CachedLM(pair.draft))[2] == 4  # a torch draft: the catch-up, then three
    again_ids, again_rows, again_passes = drafted(native)  # its cache holds the prompt: 1 token read
    assert again_passes == 3 and again_ids == ids and torch.equal(again_rows, rows)


@pytest.mark.slow
@pytest.mark.parametrize("narrow_head", [None, 5])
def test_sampled_distribution_matches_the_native_target(narrow_head: int | None) -> None:
    """Exactness at T > 0 on the kernels: the target's own law, computed by enumeration. With a
    narrow draft head (ids 5 and 6 past it) some rounds draft from the narrow head, others, once
    those ids fill the text, from the whole one."""
    tokenizer = make_tokenizer(VOCAB_CHARS)
    float_target = make_model(len(tokenizer), seed=3, hidden_size=64, logit_scale=1.5)
    target = from_hf(float_target, bits=4)
    draft = from_hf(perturbed_copy(float_target, noise=1.5, seed=4), bits=4)
    draft.narrow_head = narrow_head
    engine = ChatEngine(target, tokenizer, draft)
    engine.stop_ids = frozenset()
    engine._decoder.stop_ids = frozenset()
    controls = Controls(drafter="model", gamma=3, temperature=1.0, max_new_tokens=8)
    params = SamplingParams(temperature=1.0)
    vocab = engine.vocab_width
    first = shape_probs(logits(target, torch.tensor([PROMPT]))[-1:], params)[0]
    second = torch.stack(
        [shape_probs(logits(target, torch.tensor([[*PROMPT, t]]))[-1:], params)[0] for t in range(vocab)]
    )
    exact = (first[:, None] * second).flatten().double()
    counts = sample_two_tokens(engine, PROMPT, controls)
    assert chi_square_p_value(counts, exact) > ALPHA_LEVEL


def test_the_native_and_the_lean_forward_are_one_kind_of_model() -> None:
    """Both fast forwards are DecodingLMs (mypy checks the assignments), and they grow and crop
    their caches alike: the engine drives either through the same calls."""
    from specchat.kernels.lm import DecodingLM, LeanCache
    from specchat.models.compute.lean import LeanCausalLM

    pair = make_tiny_pair(seed=0)
    models: list[DecodingLM] = [from_hf(pair.target, bits=8), LeanCausalLM(pair.target)]
    for model in models:
        cache = model.new_cache()
        out = model(IDS[:, :10], cache, logits_to_keep=2)
        assert isinstance(out.cache, LeanCache) and out.cache.get_seq_length() == 10
        assert out.logits.shape[:2] == (1, 2) and model.device == torch.device("cpu")
        out.cache.crop(-3)
        assert model(IDS[:, 7:9], out.cache).cache.get_seq_length() == 9
