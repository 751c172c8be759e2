"""`--quant 4bit|8bit` on a CPU, end to end, with bitsandbytes (a `dev` dependency: never skipped).

The product's guarantee holds on a quantized target too: speculative output is distributed
exactly as the quantized target's own (greedy: token for token). That needs each row of a
verify pass computed bit for bit as a one-token pass computes it, which bitsandbytes' layers
alone do not do (see specchat/models/compute/quant.py); the loader makes them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import bitsandbytes as bnb
import pytest
import torch
from click.testing import CliRunner
from transformers import AutoModelForCausalLM, BitsAndBytesConfig

from specchat.cli import main
from specchat.engine.backend import Controls
from specchat.engine.events import SummaryEvent
from specchat.engine.session import ChatEngine
from specchat.errors import InvalidSettingError
from specchat.models import load_for_decoding, load_model
from specchat.models.compute.quant import CPU_NOTE
from specchat.models.compute.rows import batched_rows_are_exact
from specchat.models.records import LoadedModel, LoadProgress
from tests.engine.test_exactness import ALPHA_LEVEL, chi_square_p_value, sample_two_tokens
from tests.quant.checks import CONTEXT, WIDTHS, exact_by_one_token_passes, row_mismatch, token_ids

QUANTS = ["4bit", "8bit"]
LAYER_TYPES = {"4bit": bnb.nn.Linear4bit, "8bit": bnb.nn.Linear8bitLt}
_loaded: dict[tuple[str, str], LoadedModel] = {}


def quantized(folder: Path, quant: str) -> LoadedModel:
    """Load once per (folder, quant): quantizing is the slow part of these tests."""
    key = (str(folder), quant)
    if key not in _loaded:
        _loaded[key] = load_model(str(folder), device="cpu", quant=quant)
    return _loaded[key]


# ------------------------------------------------------------------------------------------ loading
@pytest.mark.parametrize("quant", QUANTS)
def test_loading_quantizes_the_target_and_says_what_it_costs(
    quant_folders: tuple[Path, Path], quant: str
) -> None:
    events: list[LoadProgress] = []
    loaded = load_model(str(quant_folders[0]), device="cpu", quant=quant, progress=events.append)
    assert loaded.quant == quant and loaded.device == torch.device("cpu")
    assert isinstance(loaded.model.model.layers[0].mlp.up_proj, LAYER_TYPES[quant])
    assert not isinstance(loaded.model.lm_head, LAYER_TYPES[quant])  # bitsandbytes keeps the head
    assert [e.stage for e in events] == ["quantize", "quantize", "ready"]
    assert f"quantizing it to {quant} on cpu ({CPU_NOTE})" in events[0].message
    reference = AutoModelForCausalLM.from_pretrained(str(quant_folders[0])).eval()
    ids = torch.tensor([CONTEXT])
    with torch.no_grad():
        got, want = loaded.model(ids).logits, reference(ids).logits
    assert torch.isfinite(got).all()
    error = float((got - want).norm() / want.norm())
    assert 1e-3 < error < 0.4  # quantized, not broken (4-bit on a tiny random model is coarse)


def test_decoding_pair_names_the_kernels(quant_folders: tuple[Path, Path]) -> None:
    pair = load_for_decoding(str(quant_folders[0]), None, device="cpu", quant="4bit", cpu_path="auto")
    assert pair.kernels == "bitsandbytes 4bit" and pair.label == "cpu · bitsandbytes 4bit"
    assert isinstance(pair.target.model.layers[0].mlp.up_proj, bnb.nn.Linear4bit)  # auto left it alone


# ------------------------------------------------------------------------------ row independence
@pytest.mark.parametrize("quant", QUANTS)
def test_bitsandbytes_alone_computes_rows_differently_in_a_batch(
    quant_folders: tuple[Path, Path], quant: str
) -> None:
    """Why the loader intervenes: the stock quantized model's verify rows are not its one-token rows."""
    config = (
        BitsAndBytesConfig(load_in_8bit=True) if quant == "8bit" else BitsAndBytesConfig(load_in_4bit=True)
    )
    stock = AutoModelForCausalLM.from_pretrained(
        str(quant_folders[0]), quantization_config=config, device_map={"": "cpu"}
    ).eval()
    assert max(row_mismatch(stock, CONTEXT, width) for width in WIDTHS) > 0.0


@pytest.mark.parametrize("quant", QUANTS)
def test_verify_rows_equal_one_token_passes_bit_for_bit(quant_folders: tuple[Path, Path], quant: str) -> None:
    model = quantized(quant_folders[0], quant).model
    assert [row_mismatch(model, CONTEXT, width) for width in WIDTHS] == [0.0] * len(WIDTHS)


def test_8bit_layers_alone_depend_on_their_neighbours() -> None:
    """LLM.int8 decomposes outlier columns per batch: a row changes when a neighbour has one."""
    layer = bnb.nn.Linear8bitLt(128, 96, bias=False, has_fp16_weights=False, threshold=6.0)
    layer.weight = bnb.nn.Int8Params(torch.randn(96, 128) * 0.05, requires_grad=False, has_fp16_weights=False)
    layer = layer.to("cpu").eval()
    x = torch.randn(1, 4, 128)
    x[0, 3, 7] = 20.0  # only the last row has an outlier
    with torch.no_grad():
        alone, batched = layer(x[:, :1].clone()), layer(x)
    assert not torch.equal(alone[0, 0], batched[0, 0])


def test_only_the_cpu_4bit_kernel_stays_batched_and_its_rows_are_independent(
    quant_folders: tuple[Path, Path],
) -> None:
    """The one batched exception must hold at every width, with outliers in the input."""
    model = quantized(quant_folders[0], "4bit").model
    layers = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    batched = [m for m in layers if batched_rows_are_exact(m)]
    from bitsandbytes.functional import has_avx512bf16

    # On a CPU with AVX512-BF16 (CI's) bitsandbytes' own kernel runs every 4-bit layer;
    # elsewhere every layer runs row by row, and there is nothing batched to check.
    assert len(batched) == (len(layers) if has_avx512bf16() else 0)
    assert not batched_rows_are_exact(model.lm_head)
    torch.manual_seed(0)
    for layer in batched:
        x = torch.randn(1, max(WIDTHS), layer.in_features) * 2
        x[0, 2, 5], x[0, 6, 1] = 40.0, -25.0
        with torch.no_grad():
            singles = [layer(x[:, i : i + 1].clone())[0, 0] for i in range(x.shape[1])]
            for width in WIDTHS:
                rows = layer(x[:, :width].clone())[0]
                assert all(torch.equal(rows[i], singles[i]) for i in range(width)), (layer, width)


# ------------------------------------------------------------------------------ greedy equality
@pytest.mark.parametrize("quant", QUANTS)
@pytest.mark.parametrize("drafter", ["model", "hybrid", "ngram"])
def test_greedy_speculative_equals_plain_on_the_quantized_target(
    quant_folders: tuple[Path, Path], quant: str, drafter: str
) -> None:
    target = quantized(quant_folders[0], quant)
    draft = load_model(str(quant_folders[1]), device="cpu")
    engine = ChatEngine(target.model, target.tokenizer, draft.model)
    prompt = engine.prompt_ids([{"role": "user", "content": "the cat sat on the mat. the cat sat on"}])
    for gamma in (2, 5):
        controls = Controls(gamma=gamma, drafter=drafter, schedule="fixed", max_new_tokens=40)
        plain = token_ids(engine.stream_plain(prompt, controls))
        speculative = list(engine.stream_ids(prompt, controls))
        assert token_ids(speculative) == plain, (drafter, gamma)
        summary = speculative[-1]
        assert isinstance(summary, SummaryEvent) and summary.drafted > 0


def jsonl_text(out: str) -> tuple[str, list[str]]:
    lines = [json.loads(line) for line in out.splitlines()]
    return "".join(x["text"] for x in lines if x["type"] == "token"), [
        x["kind"] for x in lines if x["type"] == "token"
    ]


@pytest.mark.parametrize("quant", QUANTS)
def test_generate_with_quant_matches_plain_decoding(quant_folders: tuple[Path, Path], quant: str) -> None:
    """Both branches of verification run, each matching plain decoding token for token.

    The perturbed draft is mostly corrected; the target's own unquantized weights as the draft
    are mostly accepted. One draft alone makes the other branch rare enough (one token in 32 on
    one CPU, none on another) that whether it shows depends on the quantization kernels.
    """
    target, draft = map(str, quant_folders)
    kinds: dict[str, list[str]] = {}
    for name, drafter_folder in (("perturbed", draft), ("own weights", target)):
        common = ["generate", "abc abc abc", "--target", target, "--draft", drafter_folder, "--quant", quant]
        common += ["--max-new-tokens", "32", "--format", "jsonl", "--temperature", "0"]
        runner = CliRunner()
        speculative = runner.invoke(
            main, [*common, "--drafter", "model", "--gamma", "3", "--gamma-schedule", "fixed"]
        )
        plain = runner.invoke(main, [*common, "--drafter", "none"])
        assert speculative.exit_code == plain.exit_code == 0, speculative.stderr + plain.stderr
        text, kinds[name] = jsonl_text(speculative.stdout)
        assert text == jsonl_text(plain.stdout)[0], name
        assert "Traceback" not in speculative.stderr and "Warning" not in speculative.stderr
    assert "correction" in kinds["perturbed"] and "accepted" in kinds["own weights"], kinds


# -------------------------------------------------------------------- distribution exactness
CASES = {
    # One case per quantization (each draws thousands of samples): together they cover the model
    # and hybrid drafters, plain temperature and top-p shaping.
    "8bit": Controls(drafter="model", gamma=3, temperature=1.0, max_new_tokens=8),
    "4bit": Controls(drafter="hybrid", gamma=2, temperature=0.7, top_p=0.8, max_new_tokens=8),
}
PROMPT = [1, 3, 4, 3, 4, 3]  # <s> a b a b a


@pytest.mark.slow
@pytest.mark.parametrize("quant", QUANTS)
def test_sampled_distribution_matches_the_quantized_target(
    small_vocab_folders: tuple[Path, Path], quant: str
) -> None:
    target = quantized(small_vocab_folders[0], quant)
    draft = load_model(str(small_vocab_folders[1]), device="cpu")
    engine = ChatEngine(target.model, target.tokenizer, draft.model)
    engine.stop_ids = frozenset()  # every token counts as an outcome, </s> included
    engine._decoder.stop_ids = frozenset()
    controls = CASES[quant]
    exact = exact_by_one_token_passes(target.model, PROMPT, controls.sampling()).flatten()
    counts = sample_two_tokens(engine, PROMPT, controls)
    assert chi_square_p_value(counts, exact.double()) > ALPHA_LEVEL


# ------------------------------------------------------------------------ without bitsandbytes
@pytest.fixture
def without_bitsandbytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """As if bitsandbytes were not installed: importing it fails and find_spec finds nothing."""
    for name in [n for n in sys.modules if n == "bitsandbytes" or n.startswith("bitsandbytes.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)


@pytest.mark.usefixtures("without_bitsandbytes")
@pytest.mark.parametrize("command", ["generate", "bench"])
def test_quant_without_bitsandbytes_is_one_clear_line(quant_folders: tuple[Path, Path], command: str) -> None:
    target, draft = map(str, quant_folders)
    args = [command, *(["hello"] if command == "generate" else ["--quick", "--no-hf"])]
    result = CliRunner().invoke(main, [*args, "--target", target, "--draft", draft, "--quant", "4bit"])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "needs bitsandbytes, which is not installed" in lines[0]
    assert "pip install 'specchat[gpu]'" in lines[0]


@pytest.mark.usefixtures("without_bitsandbytes")
def test_load_model_refuses_before_reading_weights(quant_folders: tuple[Path, Path]) -> None:
    with pytest.raises(InvalidSettingError, match="needs bitsandbytes"):
        load_model(str(quant_folders[0]), device="cpu", quant="8bit")
    load_model(str(quant_folders[0]), device="cpu")  # without --quant nothing needs it
