"""load_model / load_pair on tiny HF folders: round trips, settings, and failures as one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from specchat.errors import InvalidSettingError, ModelLoadError, OutOfMemoryError, TokenizerMismatchError
from specchat.models import load_for_decoding, load_model, load_pair
from specchat.models.compute import quant
from specchat.models.records import LoadProgress
from specchat.testing.tiny_models import CHARS, TinyPair, make_model, make_tokenizer

IDS = torch.tensor([[1, 5, 9, 20, 7, 3]])


def test_local_folder_round_trips(tiny_pair: TinyPair, tiny_folders: tuple[Path, Path]) -> None:
    events: list[LoadProgress] = []
    loaded = load_model(str(tiny_folders[0]), device="cpu", progress=events.append)
    assert (loaded.name, loaded.source, loaded.quant) == ("tiny-target", str(tiny_folders[0]), None)
    assert loaded.device == torch.device("cpu") and loaded.dtype == torch.float32
    assert not loaded.model.training and loaded.model.dtype == torch.float32
    with torch.no_grad():
        assert torch.equal(loaded.model(IDS).logits, tiny_pair.target(IDS).logits)
    text = "hello, world"
    assert loaded.tokenizer(text)["input_ids"] == tiny_pair.tokenizer(text)["input_ids"]
    assert [e.stage for e in events] == ["load", "load", "ready"]
    assert loaded.model.generation_config.eos_token_id == loaded.tokenizer.eos_token_id == 2


def test_dtype_is_applied(tiny_folders: tuple[Path, Path]) -> None:
    loaded = load_model(str(tiny_folders[0]), device="cpu", dtype="bfloat16")
    assert loaded.dtype == loaded.model.dtype == torch.bfloat16


def test_load_pair_checks_and_returns_both(tiny_folders: tuple[Path, Path]) -> None:
    target, draft = load_pair(str(tiny_folders[0]), str(tiny_folders[1]), device="cpu")
    assert draft is not None and (target.name, draft.name) == ("tiny-target", "tiny-draft")
    alone, none = load_pair(str(tiny_folders[0]), None, device="cpu")
    assert none is None and alone.name == "tiny-target"


def test_load_pair_rejects_a_draft_with_another_vocabulary(
    tiny_folders: tuple[Path, Path], tmp_path: Path
) -> None:
    tokenizer = make_tokenizer(CHARS + "@#$")
    folder = tmp_path / "other-draft"
    make_model(len(tokenizer), seed=3).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    with pytest.raises(TokenizerMismatchError) as err:
        load_pair(str(tiny_folders[0]), str(folder), device="cpu")
    message = str(err.value)
    assert "other-draft cannot draft for tiny-target" in message and "--drafter ngram" in message


@pytest.mark.parametrize("cpu_path", ["none", "auto"])
def test_a_default_draft_of_another_vocabulary_is_dropped_with_one_notice(
    tiny_folders: tuple[Path, Path], tmp_path: Path, cpu_path: str
) -> None:
    """The default draft was not the user's choice: a target of another family still starts,
    without a draft model, and says why (a draft the user named is refused, above)."""
    from specchat.kernels import cpu_supports

    if cpu_path == "auto" and cpu_supports() is not None:
        pytest.skip(f"no kernels here: {cpu_supports()}")
    tokenizer = make_tokenizer(CHARS + "@#$")
    folder = tmp_path / "other-draft"
    make_model(len(tokenizer), seed=3).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    events: list[LoadProgress] = []
    pair = load_for_decoding(
        str(tiny_folders[0]), str(folder), device="cpu", cpu_path=cpu_path, progress=events.append,
        draft_optional=True,
    )  # fmt: skip
    assert pair.draft is None and pair.draft_name is None and pair.target_name == "tiny-target"
    notices = [e.message for e in events if e.stage == "notice"]
    assert len(notices) == 1
    assert notices[0].startswith("the default draft other-draft cannot draft for tiny-target: ")
    assert "drafting without a draft model" in notices[0] and "--draft" in notices[0]


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"device": "tpu"}, "unknown device"),
        ({"dtype": "int4"}, "unknown dtype"),
        ({"quant": "3bit"}, "unknown quantization"),
    ],
)
def test_bad_settings_fail_before_anything_is_read(kwargs: dict[str, Any], expected: str) -> None:
    with pytest.raises(InvalidSettingError, match=expected):
        load_model("no-such-model", **kwargs)


def test_quant_without_bitsandbytes_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(quant, "bitsandbytes_available", lambda: False)
    with pytest.raises(InvalidSettingError) as err:
        load_model("qwen-coder-1.5b", quant="4bit")
    assert "pip install 'specchat[gpu]'" in str(err.value)


def test_broken_config_is_a_one_line_load_error(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "no-such-architecture"}))
    with pytest.raises(ModelLoadError) as err:
        load_model(str(tmp_path), device="cpu")
    assert str(err.value).startswith(f"cannot load {tmp_path.name} from {tmp_path}: ")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("error", [MemoryError(), RuntimeError("DefaultCPUAllocator: can't allocate memory")])
def test_running_out_of_memory_gives_a_hint(
    error: Exception, tiny_folders: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(*args: object, **kwargs: object) -> None:
        raise error

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", fail)
    with pytest.raises(OutOfMemoryError) as err:
        load_model(str(tiny_folders[0]), device="cpu")
    assert "smaller model" in str(err.value)


@pytest.mark.parametrize("cpu_path", ["auto", "int8/dyn8+head32768"])
def test_load_for_decoding_prepares_cpu_kernels(tiny_folders: tuple[Path, Path], cpu_path: str) -> None:
    from specchat.models.compute.cpu_quant import NATIVE_CPU_PATH

    expected = NATIVE_CPU_PATH if cpu_path == "auto" else cpu_path
    events: list[LoadProgress] = []
    pair = load_for_decoding(
        str(tiny_folders[0]), str(tiny_folders[1]), device="cpu", cpu_path=cpu_path, progress=events.append
    )
    assert pair.kernels == expected and pair.label == f"cpu · {expected}"
    assert (pair.target_name, pair.draft_name) == ("tiny-target", "tiny-draft")
    assert events[-1].stage == "ready" and expected in events[-1].message
    with torch.no_grad():
        logits = pair.target(IDS, logits_to_keep=IDS.shape[1]).logits
    assert logits.shape == (1, IDS.shape[1], len(pair.tokenizer))
    quiet: list[LoadProgress] = []
    stock = load_for_decoding(
        str(tiny_folders[0]), None, device="cpu", cpu_path="none", progress=quiet.append
    )
    assert stock.kernels == "none" and stock.label == "cpu" and stock.draft is None
    assert not [e for e in quiet if e.model == "CPU kernels"]  # nothing packed, nothing said
    with torch.no_grad():
        reference = stock.target(IDS).logits
    # Per-row int8 is an approximation of fp32, close enough to pick the same tokens mostly.
    assert float((logits - reference).norm() / reference.norm()) < 0.1


def test_load_for_decoding_checks_the_cpu_path_before_loading() -> None:
    with pytest.raises(InvalidSettingError, match="unknown CPU path"):
        load_for_decoding("no-such-model", None, cpu_path="int3/fp32")
