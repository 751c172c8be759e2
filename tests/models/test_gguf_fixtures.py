"""specchat on GGUF files that llama.cpp's own converter and quantizer wrote (tests/fixtures/gguf).

The fixtures are tiny seeded models of each family, quantized by ``llama-quantize --pure`` into
each type (scripts/make_gguf_fixtures.py; MANIFEST.json lists them). For a family on the fast
path, the packed file computes what transformers computes on the file's dequantized weights
(transformers' own GGUF loader is the reference), every row of a pass is the one-row pass, and
greedy speculation with a q4 draft of the same file equals plain decoding. Every family with a
fixture (llama, qwen2, mistral, phi3, qwen3, gemma3) is on the fast path; the checks choose by
``BY_NAME[arch].fast``, so a fixture of a family the decoders lack would be left out of them.

Where a llama.cpp build is at hand (SPECCHAT_LLAMA_CPP, or the peer build's folder), a few
fixtures are also compared with ``llama-server``'s log-probabilities and greedy tokens.
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch

from specchat.engine.backend import Controls
from specchat.engine.events import TokenEvent
from specchat.engine.session import ChatEngine
from specchat.kernels import cpu_supports
from specchat.models.architectures import BY_NAME

pytestmark = pytest.mark.skipif(cpu_supports() is not None, reason=f"no kernels here: {cpu_supports()}")

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "gguf"
MANIFEST: dict[str, Any] = json.loads((FIXTURES / "MANIFEST.json").read_text())
ENTRIES: list[dict[str, Any]] = MANIFEST["fixtures"]

FAST = [pytest.param(e, id=e["file"]) for e in ENTRIES if BY_NAME[e["arch"]].fast]

IDS = torch.randint(6, 320, (1, 40), generator=torch.Generator().manual_seed(0))
"""40 token ids past the six special tokens, the same for every fixture."""

RELATIVE_L2 = 0.03
"""Of the logits against the float model on the file's weights. The packed target holds the
file's blocks exactly; what remains is its int8 activations and summation order (about 0.01 for
the 32-weight types, 0.015-0.02 for the K-quants here): 0.03 is the bound
test_gguf_block_types.py states for the same arithmetic."""
ARGMAX_AGREEMENT = 0.9

LOG_PROB_GAP = 0.25
"""Largest difference between specchat's and llama-server's log-probability of the same token
among llama.cpp's best 5. Both quantize activations (int8 here; q8_K/q8_0 blocks in llama.cpp)
and sum in different orders, on logits about 10 wide: on every fast fixture (2026-12-03, the
peer build in MANIFEST.json) the gap measured 0.04-0.19 (most 0.05-0.10, the most on Q5_K), and
llama.cpp's own gap to the float model on the file's weights 0.03-0.15, so the gap is the two
programs' arithmetic, not specchat's. A layout, permutation or row-alignment error moves
log-probabilities by whole units (7-9 when rows were misplaced by one token)."""


@functools.cache
def reference(name: str) -> tuple[Any, Any]:
    """transformers' float model on the file's dequantized weights, and its tokenizer."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    entry = next(e for e in ENTRIES if e["file"] == name)
    config = AutoConfig.from_pretrained(FIXTURES, gguf_file=name)
    if getattr(config, "head_dim", None) != entry["config"]["head_dim"]:
        # transformers' GGUF config mapping for qwen3 drops attention.key_length, leaving
        # Qwen3Config's default head_dim of 128; the file says 64.
        config.head_dim = entry["config"]["head_dim"]
    if "query_pre_attn_scalar" in entry["config"]:
        # A GGUF has no query_pre_attn_scalar: transformers leaves Gemma3's default of 256, while
        # llama.cpp (and specchat) scale queries by 1/sqrt(head_dim) as the fixture was made (64).
        config.query_pre_attn_scalar = entry["config"]["query_pre_attn_scalar"]
    model = AutoModelForCausalLM.from_pretrained(
        FIXTURES, gguf_file=name, config=config, dtype=torch.float32
    ).eval()
    tokenizer = AutoTokenizer.from_pretrained(FIXTURES, gguf_file=name)
    return model, tokenizer


@functools.cache
def packed(name: str, mode: str = "gguf") -> Any:
    from specchat.kernels.native import native_model
    from specchat.models.compute.packing import pack_gguf

    return native_model(pack_gguf(str(FIXTURES / name), mode=mode), reference(name)[0].config)


def test_the_manifest_lists_every_fixture_with_its_hash() -> None:
    import hashlib

    files = sorted(p.name for p in FIXTURES.glob("*.gguf"))
    assert files == sorted(e["file"] for e in ENTRIES)
    for entry in ENTRIES:
        assert hashlib.sha256((FIXTURES / entry["file"]).read_bytes()).hexdigest() == entry["sha256"]


@pytest.mark.parametrize("entry", FAST)
def test_logits_on_the_file_are_the_float_models_on_its_weights(entry: dict[str, Any]) -> None:
    model, _ = reference(entry["file"])
    with torch.inference_mode():
        expected = model(input_ids=IDS).logits[0]
    got = packed(entry["file"])(IDS, None, logits_to_keep=IDS.shape[1]).logits[0]
    assert float((got - expected).norm() / expected.norm()) < RELATIVE_L2
    assert float((got.argmax(-1) == expected.argmax(-1)).float().mean()) > ARGMAX_AGREEMENT


@pytest.mark.parametrize("entry", FAST)
def test_every_row_of_a_pass_is_a_one_row_pass(entry: dict[str, Any]) -> None:
    native = packed(entry["file"])
    whole = native(IDS, None, logits_to_keep=IDS.shape[1]).logits[0]
    output = native(IDS[:, :1], None, logits_to_keep=1)
    rows, cache = [output.logits[0]], output.cache
    for position in range(1, IDS.shape[1]):
        output = native(IDS[:, position : position + 1], cache, logits_to_keep=1)
        rows.append(output.logits[0])
        cache = output.cache
    assert torch.equal(torch.cat(rows), whole)


@pytest.mark.parametrize("entry", FAST)
def test_greedy_speculation_with_a_q4_draft_of_the_file_equals_plain_decoding(entry: dict[str, Any]) -> None:
    _, tokenizer = reference(entry["file"])
    engine = ChatEngine(packed(entry["file"]), tokenizer, packed(entry["file"], "q4"))
    prompt = IDS[0, :12].tolist()
    controls = Controls(gamma=4, drafter="model", max_new_tokens=32)
    plain = [e.token_id for e in engine.stream_plain(prompt, controls) if isinstance(e, TokenEvent)]
    spec = [e.token_id for e in engine.stream_ids(prompt, controls) if isinstance(e, TokenEvent)]
    assert len(plain) > 8
    assert spec == plain


# Every fixture's family runs on the decoders now; a family they lack (gemma2) is refused by
# name in test_architectures.py, on a file written there.


# llama.cpp itself: only where a build is at hand (CI has none).

PEER_FILES = (
    "llama-Q4_K.gguf",
    "llama-Q5_0.gguf",
    "qwen2-Q8_0.gguf",
    "mistral-Q5_K.gguf",
    "llama-F16.gguf",
    "phi3-Q8_0.gguf",
    "qwen3-Q4_K.gguf",
    "gemma3-Q8_0.gguf",
)
"""A few, one per fast family and kind of block; mistral-Q5_K parts from llama.cpp at a near tie
(at its last token, for which the server gives no row of its own)."""


def llama_cpp_bin() -> Path | None:
    for folder in (os.environ.get("SPECCHAT_LLAMA_CPP"), "/work/peers/llamacpp-avx2/bin"):
        if folder and (Path(folder) / "llama-server").is_file():
            return Path(folder)
    return None


@pytest.mark.parametrize("name", [n for n in PEER_FILES if any(e["file"] == n for e in ENTRIES)])
def test_llama_server_gives_the_same_log_probabilities_and_greedy_tokens(name: str) -> None:
    binary = llama_cpp_bin()
    if binary is None:
        pytest.skip("no llama.cpp build (set SPECCHAT_LLAMA_CPP to its bin folder)")
    from specchat.bench.llamacpp_peer import LlamaServer
    from specchat.bench.peer_text import our_log_probs, their_log_probs
    from specchat.engine.compare import first_difference

    prompt = IDS[0, :12].tolist()
    with tempfile.TemporaryDirectory() as scratch:
        log = Path(scratch) / "server.log"
        server = LlamaServer(binary / "llama-server", FIXTURES / name, threads=2, context=256, log=log)
        try:
            data = server.complete(prompt, 8, n_probs=5)
        finally:
            server.close()
    theirs = [int(t) for t in data["tokens"]]
    rows = their_log_probs(data)
    native = packed(name)
    output = native(torch.tensor([prompt]), None, logits_to_keep=1)
    ours, cache = [int(output.logits[0, -1].argmax())], output.cache
    while len(ours) < len(theirs):
        output = native(torch.tensor([[ours[-1]]]), cache, logits_to_keep=1)
        ours.append(int(output.logits[0, -1].argmax()))
        cache = output.cache
    mine = our_log_probs(native, prompt, theirs)
    assert len(rows) >= 2, data.get("completion_probabilities")
    gaps = [abs(float(mine[j, token]) - lp) for j, row in rows.items() for token, lp in row.items()]
    assert max(gaps) < LOG_PROB_GAP, (max(gaps), rows)
    at = first_difference(ours, theirs)
    if at is not None:
        # Parted: only at a near tie, each program's margin between the two tokens within the gap.
        # llama-server reports no row of its own for a token whose bytes end inside a UTF-8
        # character (see their_log_probs); there only our margin can be checked.
        assert float(mine[at, theirs[at]] - mine[at, ours[at]]) > -LOG_PROB_GAP, (ours, theirs)
        if at in rows:
            assert ours[at] in rows[at], (ours, theirs, rows[at])
            assert rows[at][theirs[at]] - rows[at][ours[at]] < LOG_PROB_GAP


@pytest.mark.parametrize("entry", FAST)
def test_the_file_stays_at_its_own_bits_and_the_report_sizes_its_pack(entry: dict[str, Any]) -> None:
    """What `specchat models FILE` promises before packing (the kernel format of each type, the
    packed size, tied heads included) is what packing the file gives."""
    from specchat.models.compute.packing import pack_gguf
    from specchat.models.gguf.report import KERNEL_FORMAT, describe_gguf

    path = FIXTURES / entry["file"]
    target = pack_gguf(str(path), mode="gguf")
    assert {meta.kind for meta in target.matrices.values()} == {KERNEL_FORMAT[entry["type"]]}
    assert describe_gguf(path).packed_size == target.nbytes
