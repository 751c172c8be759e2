"""GGUF files of the 32-weight block types and the float types run on the kernels at their own bits.

Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, F16, BF16 and F32 are held exactly by a kernel format (see
specchat.models.compute.packing's KEPT_TYPES), so the packed target computes with the very weights
llama.cpp reads from the file: its logits are those of the float model on the dequantized weights
(within the error of int8 activations; none for the float types), every row of a pass is a
one-row pass, and greedy speculation equals plain decoding.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants
from transformers import LlamaForCausalLM

from specchat.engine.backend import Controls
from specchat.engine.events import TokenEvent
from specchat.engine.session import ChatEngine
from specchat.kernels import cpu_supports
from specchat.kernels.native import NativeCausalLM, native_model
from specchat.models.compute.packing import from_hf, pack_gguf
from specchat.testing.tiny_models import TinyPair, make_tiny_pair
from tests.models.conftest import write_tiny_gguf

pytestmark = pytest.mark.skipif(cpu_supports() is not None, reason=f"no kernels here: {cpu_supports()}")

KEPT = {
    GGMLQuantizationType.Q8_0: ("q8", 32),
    GGMLQuantizationType.Q4_0: ("q4", 32),
    GGMLQuantizationType.Q4_1: ("q4", 32),
    GGMLQuantizationType.Q5_0: ("q6", 32),
    GGMLQuantizationType.Q5_1: ("q5", 32),
    GGMLQuantizationType.F16: ("f16", None),
    GGMLQuantizationType.BF16: ("f32", None),
    GGMLQuantizationType.F32: ("f32", None),
}
"""Each kept type, with the kernel format and super-block it is held in (None: the whole row)."""

IDS = torch.tensor([[1, 5, 9, 12, 7, 30, 22, 4] * 5])


@pytest.fixture(scope="module")
def pair() -> TinyPair:
    return make_tiny_pair(seed=3, logit_scale=2.0)


def dequantized_copy(model: LlamaForCausalLM, qtype: GGMLQuantizationType) -> LlamaForCausalLM:
    """The float model on the weights a ``qtype`` file holds (quantizing rows commutes with
    llama.cpp's q/k row permutation, so the HF-order weights can be quantized directly)."""
    copy = LlamaForCausalLM(model.config)
    state = model.state_dict()
    for name, weights in state.items():
        if weights.dim() == 2:
            raw = quants.quantize(weights.float().numpy(), qtype)
            state[name] = torch.from_numpy(quants.dequantize(raw, qtype).reshape(weights.shape).copy())
    copy.load_state_dict(state)
    return copy.eval()


def packed_target(pair: TinyPair, qtype: GGMLQuantizationType, folder: Path) -> tuple[NativeCausalLM, object]:
    path = write_tiny_gguf(pair.target, pair.tokenizer, folder / f"{qtype.name}.gguf", qtype)
    packed = pack_gguf(str(path), mode="gguf")
    return native_model(packed, pair.target.config), packed


@pytest.mark.parametrize("qtype", list(KEPT), ids=lambda t: t.name)
def test_block_types_stay_at_their_own_bits_and_give_the_float_logits(
    pair: TinyPair, qtype: GGMLQuantizationType, tmp_path: Path
) -> None:
    native, packed = packed_target(pair, qtype, tmp_path)
    kind, super_block = KEPT[qtype]
    for name, meta in packed.matrices.items():  # type: ignore[attr-defined]
        width = packed.tensors[f"{name}.q"].shape[-1] if super_block is None else super_block  # type: ignore[attr-defined]
        assert (meta.kind, meta.super_block) == (kind, width), name
    with torch.inference_mode():
        expected = dequantized_copy(pair.target, qtype)(input_ids=IDS).logits[0]
    got = native(IDS, None, logits_to_keep=IDS.shape[1]).logits[0]
    assert float((got - expected).norm() / expected.norm()) < 0.03
    assert float((got.argmax(-1) == expected.argmax(-1)).float().mean()) > 0.9


@pytest.mark.parametrize("qtype", list(KEPT), ids=lambda t: t.name)
def test_every_row_of_a_pass_is_a_one_row_pass(
    pair: TinyPair, qtype: GGMLQuantizationType, tmp_path: Path
) -> None:
    native, _ = packed_target(pair, qtype, tmp_path)
    whole = native(IDS, None, logits_to_keep=IDS.shape[1]).logits[0]
    output = native(IDS[:, :1], None, logits_to_keep=1)
    rows, cache = [output.logits[0]], output.cache
    for position in range(1, IDS.shape[1]):
        output = native(IDS[:, position : position + 1], cache, logits_to_keep=1)
        rows.append(output.logits[0])
        cache = output.cache
    assert torch.equal(torch.cat(rows), whole)


@pytest.mark.parametrize("qtype", list(KEPT), ids=lambda t: t.name)
def test_greedy_speculation_on_the_file_equals_plain_decoding(
    pair: TinyPair, qtype: GGMLQuantizationType, tmp_path: Path
) -> None:
    target, _ = packed_target(pair, qtype, tmp_path)
    engine = ChatEngine(target, pair.tokenizer, from_hf(pair.draft, bits=4))
    prompt = engine.prompt_ids([{"role": "user", "content": "the cat sat on the mat. the cat sat on"}])
    controls = Controls(gamma=4, drafter="model", max_new_tokens=40)
    plain = [e.token_id for e in engine.stream_plain(prompt, controls) if isinstance(e, TokenEvent)]
    spec = [e.token_id for e in engine.stream_ids(prompt, controls) if isinstance(e, TokenEvent)]
    assert spec == plain


def test_a_type_no_kernel_format_holds_is_requantized(pair: TinyPair, tmp_path: Path) -> None:
    """MXFP4 (4-bit floats with a shared power-of-two scale) has no kernel format: it becomes q8,
    close to the file's weights."""
    native, packed = packed_target(pair, GGMLQuantizationType.MXFP4, tmp_path)
    assert {meta.kind for meta in packed.matrices.values()} == {"q8"}  # type: ignore[attr-defined]
    with torch.inference_mode():
        expected = dequantized_copy(pair.target, GGMLQuantizationType.MXFP4)(input_ids=IDS).logits[0]
    got = native(IDS, None, logits_to_keep=IDS.shape[1]).logits[0]
    assert float((got - expected).norm() / expected.norm()) < 0.05
    assert np.isfinite(got.numpy()).all()
