"""GGUF files: corrupt ones fail with one line; a valid one converts once, then loads from the cache."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from specchat.errors import ModelLoadError
from specchat.models import load_model
from specchat.models.cache.paths import CONVERTED_MARKER, converted_dir
from specchat.models.gguf import convert
from specchat.models.gguf.check import check_gguf
from specchat.models.records import LoadProgress
from specchat.testing.tiny_models import TinyPair

IDS = torch.tensor([[1, 5, 9, 20, 7, 3]])


def load_error(path: Path) -> str:
    with pytest.raises(ModelLoadError) as err:
        load_model(str(path), device="cpu")
    message = str(err.value)
    assert str(path) in message and "\n" not in message
    assert not converted_dir().exists() or not any(converted_dir().iterdir())
    return message


def test_garbage_file(tmp_path: Path) -> None:
    path = tmp_path / "garbage.gguf"
    path.write_bytes(b"this is not a model at all" * 100)
    assert "not a GGUF file" in load_error(path)


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.gguf"
    path.write_bytes(b"")
    assert "not a GGUF file" in load_error(path)


@pytest.mark.parametrize("keep", [0.5, 0.95, 0.0001])
def test_truncated_file(keep: float, tiny_gguf: Path, tmp_path: Path) -> None:
    data = tiny_gguf.read_bytes()
    path = tmp_path / "cut.gguf"
    path.write_bytes(data[: max(8, int(len(data) * keep))])
    assert "truncated" in load_error(path) or "damaged" in load_error(path)


def test_magic_then_garbage(tmp_path: Path) -> None:
    path = tmp_path / "junk.gguf"
    path.write_bytes(b"GGUF" + bytes(range(256)) * 40)
    load_error(path)


def test_valid_tiny_gguf_passes_the_check(tiny_gguf: Path) -> None:
    check_gguf(tiny_gguf)


def test_convert_once_then_load_from_cache(
    tiny_pair: TinyPair, tiny_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gguf = tmp_path / tiny_gguf.name
    shutil.copy(tiny_gguf, gguf)
    events: list[LoadProgress] = []
    loaded = load_model(str(gguf), device="cpu", progress=events.append)

    stages = [e.stage for e in events]
    assert stages[0] == "convert" and stages[-1] == "ready" and "load" in stages
    assert any(e.message.startswith("converting tiny: tensor ") for e in events)
    folder = Path(loaded.source)
    assert folder.parent == converted_dir() and folder.name.startswith("tiny-")
    assert json.loads((folder / CONVERTED_MARKER).read_text())["origin"] == str(gguf.resolve())
    assert list(converted_dir().iterdir()) == [folder]  # no temp folder left behind
    # A plain model now: no GGUF quantizer comes back when the copy is loaded.
    assert "quantization_config" not in json.loads((folder / "config.json").read_text())
    assert getattr(loaded.model, "hf_quantizer", None) is None
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(IDS).logits, tiny_pair.target(IDS).logits)
    text = "hello world\nhow are you?"
    assert loaded.tokenizer(text)["input_ids"] == tiny_pair.tokenizer(text)["input_ids"]
    assert loaded.model.generation_config.eos_token_id == loaded.tokenizer.eos_token_id == 2
    assert loaded.tokenizer.chat_template == tiny_pair.tokenizer.chat_template

    # The second load must not dequantize again.
    monkeypatch.setattr(convert, "_read_gguf", lambda *a, **k: pytest.fail("converted twice"))
    again = load_model(str(gguf), device="cpu")
    assert again.source == loaded.source
    # A changed file is a new conversion (keyed by path, size and mtime), not a stale cache hit.
    gguf.write_bytes(gguf.read_bytes() + b"\0" * 64)
    with pytest.raises(pytest.fail.Exception, match="converted twice"):
        load_model(str(gguf), device="cpu")


def test_unsupported_architecture_is_one_line(tiny_gguf: Path, tmp_path: Path) -> None:
    data = tiny_gguf.read_bytes()
    # Same length, so the structure stays valid: only the architecture name changes.
    path = tmp_path / "odd.gguf"
    path.write_bytes(data.replace(b"llama", b"zzzzz"))
    message = load_error(path)
    assert message.startswith(f"cannot convert {path}: ")


def test_quantizing_a_gguf_loads_the_converted_copy(tiny_gguf: Path) -> None:
    loaded = load_model(str(tiny_gguf), device="cpu", quant="8bit")  # bitsandbytes: a dev dependency
    assert loaded.quant == "8bit" and Path(loaded.source).parent == converted_dir()
    assert type(loaded.model.model.layers[0].mlp.up_proj).__name__ == "Linear8bitLt"
