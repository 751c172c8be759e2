"""The CPU fast path: packed kernels, fusion, the narrow draft head and the lean forward.

What matters for exactness is that a verify pass computes each row bit for bit as a
single-token pass would; what matters for speed is measured by the bench, not here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
import torch
from torch import nn
from transformers import LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from specchat.engine.backend import Controls
from specchat.engine.events import TokenEvent
from specchat.engine.kv import CachedLM
from specchat.engine.session import ChatEngine
from specchat.errors import InvalidSettingError
from specchat.kernels import cpu_supports
from specchat.kernels.lm import LeanCache
from specchat.models.compute.cpu_quant import CpuPath, convert_linears, parse_cpu_path, prepare_cpu_pair
from specchat.models.compute.lean import LeanCausalLM
from specchat.models.compute.packed_linear import PackedLinear, fbgemm_fp16_rows_exact
from specchat.testing.tiny_models import make_model, make_tokenizer, perturbed_copy

if TYPE_CHECKING:
    from specchat.engine.kv import EngineModel

FP16_ROWS = pytest.mark.skipif(
    not fbgemm_fp16_rows_exact(), reason="fbgemm's fp16 kernels are not row-exact on this CPU (AVX2)"
)
ROW_EXACT = [pytest.param("fp16", marks=FP16_ROWS), "int8"]


def tiny_qwen(seed: int = 0) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=300, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
    )  # fmt: skip
    return Qwen2ForCausalLM(config).eval()


def verify_rows_vs_single_steps(model: EngineModel, ids: list[int], width: int = 6) -> float:
    lm = CachedLM(model)
    context, tail = ids[:-width], ids[-width:]
    lm.logits_after(context, 1)
    together = lm.logits_after(context + tail, width).clone()
    one_by_one = torch.stack([lm.logits_after(context + tail[: i + 1], 1)[0].clone() for i in range(width)])
    return float((together - one_by_one).abs().max())


@pytest.mark.parametrize("mode", ["fp16", "int8", "dyn8", "fp32"])
def test_packed_linear_close_to_fp32(mode: str) -> None:
    torch.manual_seed(0)
    linear = nn.Linear(256, 384, bias=True)
    x = torch.randn(5, 256)
    with torch.no_grad():
        reference = linear(x)
    packed = PackedLinear(linear, mode)
    out = packed(x)
    assert out.shape == reference.shape and packed.weight.shape == linear.weight.shape
    assert float((out - reference).norm() / reference.norm()) < {"fp32": 1e-6, "fp16": 1e-3}.get(mode, 3e-2)


@pytest.mark.parametrize("mode", ROW_EXACT)
def test_target_kernels_compute_each_row_on_its_own(mode: str) -> None:
    torch.manual_seed(1)
    packed = PackedLinear(nn.Linear(256, 384), mode)
    x = torch.randn(7, 256) * 3
    x[:, 5] = 40.0  # an outlier column, as LLM activations have
    batch = packed(x)
    for i in range(7):
        assert torch.equal(batch[i], packed(x[i : i + 1])[0])


@pytest.mark.parametrize("mode", ROW_EXACT)
def test_fusion_and_narrow_head_change_nothing_else(mode: str) -> None:
    base = tiny_qwen()
    plain, fused = tiny_qwen(), tiny_qwen()
    plain.load_state_dict(base.state_dict())
    fused.load_state_dict(base.state_dict())
    convert_linears(plain, mode, fuse=False)
    convert_linears(fused, mode, head_rows=200)
    ids = torch.arange(3, 40)[None]
    with torch.no_grad():
        a, b = plain(ids).logits, fused(ids).logits
    assert b.shape[-1] == 200 and fused.get_output_embeddings().weight.shape[0] == 200
    assert torch.equal(a[..., :200], b)


@pytest.mark.parametrize("mode", ROW_EXACT)
def test_lean_forward_matches_transformers_and_verifies_exactly(mode: str) -> None:
    hf = tiny_qwen()
    convert_linears(hf, mode)
    lean = LeanCausalLM(hf)
    ids = list(range(3, 90))
    expected = CachedLM(hf).logits_after(ids, 4)
    assert torch.allclose(CachedLM(lean).logits_after(ids, 4), expected, atol=1e-4)
    assert verify_rows_vs_single_steps(lean, ids) == 0.0


def test_lean_cache_grows_and_crops() -> None:
    cache = LeanCache(layers=2, kv_heads=2, head_dim=8, dtype=torch.float32, capacity=4)
    cache.keys[0][:, :3] = 1.0
    cache.length = 3
    cache.reserve(300)
    assert cache.capacity >= 300 and float(cache.keys[0][:, :3].min()) == 1.0
    cache.crop(-2)
    assert cache.get_seq_length() == 1
    cache.crop(5)
    assert cache.length == 1


def test_parse_cpu_path() -> None:
    assert str(parse_cpu_path("none")) == "none"
    assert parse_cpu_path("int8/dyn8+head32768") == CpuPath("int8", "dyn8", 32768)
    native = cpu_supports() is None
    expected = "gguf/q4+head32768" if native else "int8/dyn8+head32768"
    assert str(parse_cpu_path("auto", torch.device("cpu"))) == expected
    assert str(parse_cpu_path("auto", torch.device("meta"))) == "none"  # not a CPU: leave it alone
    for bad in ("int3/int8", "int8/int8+headx", "int8/int8+head10", "dyn8/int8", "gguf/int8", "int8/q4"):
        with pytest.raises(InvalidSettingError):
            parse_cpu_path(bad)


def test_fp16_target_only_where_its_rows_are_exact() -> None:
    if fbgemm_fp16_rows_exact():
        assert parse_cpu_path("fp16/int8") == CpuPath("fp16", "int8")
    else:
        with pytest.raises(InvalidSettingError, match="row differently"):
            parse_cpu_path("fp16/int8")


def test_int8_rows_are_close_to_fp32_on_outlier_activations() -> None:
    # An outlier column drives the other activations towards zero and large weights towards the
    # top of their range: where products saturate (vpmaddubsw without VNNI), this is where it shows.
    torch.manual_seed(2)
    linear = nn.Linear(512, 256, bias=False)
    with torch.no_grad():
        linear.weight[:, :8] = 1.0
    x = torch.rand(6, 512) * 2 - 1
    x[:, 3] = 30.0
    with torch.no_grad():
        reference = linear(x)
    out = PackedLinear(linear, "int8")(x)
    assert float((out - reference).norm() / reference.norm()) < 3e-2


NATIVE = pytest.mark.skipif(cpu_supports() is not None, reason=f"specchat's kernels: {cpu_supports()}")


@pytest.mark.parametrize(
    "path",
    [
        CpuPath("int8", "dyn8"),
        pytest.param(CpuPath("fp16", "int8", 40), marks=FP16_ROWS),
        CpuPath("int8", "int8", 40),
        pytest.param(CpuPath("gguf", "q4", 40), marks=NATIVE),
        pytest.param(CpuPath("q4", "q8"), marks=NATIVE),
    ],
)
def test_prepared_pair_decodes_exactly(path: CpuPath) -> None:
    tokenizer = make_tokenizer()
    target = make_model(len(tokenizer), 0, max_positions=512, logit_scale=3.0)
    draft = perturbed_copy(target, 0.3, 1)
    pair = prepare_cpu_pair(target, draft, path)  # a 40-id head: this vocabulary is under 256
    assert pair.lean and pair.path == str(path)
    assert pair.draft is not None
    decoding_draft: Any = pair.draft  # a LeanCausalLM or a NativeCausalLM: both name their head
    head = decoding_draft.get_output_embeddings().weight.shape[0]
    if path.native:  # the whole head, computed narrow unless the text needs more
        assert head == len(tokenizer) and getattr(pair.draft, "narrow_head", None) == path.draft_head
    else:
        assert head == (path.draft_head or len(tokenizer))
    engine = ChatEngine(pair.target, tokenizer, pair.draft)
    prompt = engine.prompt_ids([{"role": "user", "content": "the cat sat on the mat. the cat"}])
    for drafter in ("model", "ngram", "hybrid"):
        controls = Controls(gamma=3, drafter=drafter, max_new_tokens=40)
        plain = [e.token_id for e in engine.stream_plain(prompt, controls) if isinstance(e, TokenEvent)]
        spec = [e.token_id for e in engine.stream_ids(prompt, controls) if isinstance(e, TokenEvent)]
        assert spec == plain, drafter
    # transformers still generates with the converted model (the bench's peer).
    assert isinstance(pair.hf_target, LlamaForCausalLM), "converted in place"
    out = pair.hf_target.generate(torch.tensor([prompt]), max_new_tokens=4, do_sample=False)
    assert out.shape[1] == len(prompt) + 4


def test_cpu_path_refuses_what_it_cannot_do() -> None:
    target = tiny_qwen()
    target.hf_quantizer = object()  # type: ignore[assignment]  # a stand-in for bitsandbytes' quantizer
    assert prepare_cpu_pair(target, None, "auto").path == "none"
    with pytest.raises(InvalidSettingError):
        prepare_cpu_pair(target, None, "int8/int8")
