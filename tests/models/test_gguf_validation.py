"""The GGUF validation layer: the bytes walked within caps, unread keys never read, and
every decoder dimension checked against the tensors before anything is packed or cached."""

from __future__ import annotations

import json
import shutil
import tracemalloc
from pathlib import Path

import pytest

from specchat.errors import ModelLoadError
from specchat.models.cache.manifest import record_files
from specchat.models.cache.paths import safe_entry_name
from specchat.models.compute.packed import load_native
from specchat.models.compute.packed_cache import WEIGHTS, PackRecipe, packed_dir
from specchat.models.gguf.check import read_gguf
from specchat.models.gguf.lazy_reading import lazy_gguf_reading
from specchat.models.gguf.shape import decoder_dims
from specchat.models.names.resolve import resolve_spec
from specchat.models.records import LoadProgress
from tests.hostile_gguf import FIXTURES, LLAMA, OSC52_BEL, U8, Gguf, array, cases

CASES = {case.name: case for case in cases()}


def crafted(name: str, folder: Path) -> Path:
    return CASES[name].make(folder)


@pytest.mark.parametrize("fixture", sorted(FIXTURES.glob("*.gguf")), ids=lambda p: p.stem)
def test_every_fixture_passes_and_its_dimensions_are_its_tensors(fixture: Path) -> None:
    gguf = read_gguf(fixture)
    dims = decoder_dims(gguf)
    assert (dims.layers, dims.hidden, dims.heads, dims.kv_heads, dims.head_dim) == (1, 256, 4, 2, 64)
    assert dims.embed_rows == gguf.tensors["token_embd.weight"].dims[1] == 320
    assert dims.tokens == 320 and dims.eps > 0 and dims.context_length


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c.klass in ("disagrees", "impossible")])
def test_metadata_that_disagrees_or_cannot_be_is_one_line_naming_the_key(name: str, tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError) as refused:
        decoder_dims(read_gguf(crafted(name, tmp_path)))
    message = str(refused.value)
    assert "\n" not in message
    for word in CASES[name].words:
        assert word in message


def test_keys_specchat_does_not_read_are_never_read(tmp_path: Path) -> None:
    """A 30 MB array under a key of its own costs nothing: it is stepped over, not decoded, by
    specchat's walker and by transformers' readers alike."""
    path = (
        Gguf.read(LLAMA).set("junk.blob", array(U8, bytes(30_000_000), 30_000_000)).write(tmp_path / "j.gguf")
    )
    from transformers import AutoConfig, AutoTokenizer

    tracemalloc.start()
    try:
        gguf = read_gguf(path)
        decoder_dims(gguf)
        with lazy_gguf_reading():
            config = AutoConfig.from_pretrained(str(tmp_path), gguf_file=path.name)
            tokenizer = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 20_000_000, f"{peak:,} bytes"  # a Python int per array item would be over 1 GB
    assert "junk.blob" in gguf.entries and config.num_attention_heads == 4 and len(tokenizer) == 320


def test_lazy_reading_gives_transformers_exactly_what_it_reads_otherwise() -> None:
    from transformers import AutoConfig, AutoTokenizer

    where = {"gguf_file": LLAMA.name}
    reference = (
        AutoConfig.from_pretrained(str(FIXTURES), **where),
        AutoTokenizer.from_pretrained(str(FIXTURES), **where),
    )
    with lazy_gguf_reading():
        lazy = (
            AutoConfig.from_pretrained(str(FIXTURES), **where),
            AutoTokenizer.from_pretrained(str(FIXTURES), **where),
        )
    assert lazy[0].to_dict() == reference[0].to_dict()
    assert lazy[1].get_vocab() == reference[1].get_vocab()
    assert lazy[1].chat_template == reference[1].chat_template


def test_nothing_is_cached_for_a_file_that_fails_the_checks(tmp_path: Path) -> None:
    path = crafted("head_count_kv 3", tmp_path)
    with pytest.raises(ModelLoadError, match="head_count_kv"):
        load_native(str(path), PackRecipe("gguf"))
    finished = (
        [p for p in packed_dir().iterdir() if not p.name.startswith(".")] if packed_dir().exists() else []
    )
    leftovers = [p for p in packed_dir().iterdir() if p.name.startswith(".")] if packed_dir().exists() else []
    assert not finished and not leftovers


def test_a_packed_copy_whose_sizes_disagree_is_packed_again(tmp_path: Path) -> None:
    """A copy in the cache written without the checks (or tampered with) must not reach the
    decoder: its sizes are checked on load, and the model is packed anew from its file."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    path = shutil.copy(LLAMA, tmp_path / "model.gguf")
    first = load_native(str(path), PackRecipe("gguf"))
    weights = first.folder / WEIGHTS
    with safe_open(str(weights), framework="pt") as handle:
        meta = json.loads(handle.metadata()["specchat"])
        tensors = {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118
    meta["shape"]["heads"] = meta["shape"]["kv_heads"] = 1024
    save_file(tensors, str(weights), metadata={"specchat": json.dumps(meta)})
    marker = first.folder / "specchat.json"
    record = json.loads(marker.read_text())
    # Its record agrees with its files: only its sizes give it away.
    record["files"] = record_files(first.folder, skip=frozenset({"specchat.json"}))
    marker.write_text(json.dumps(record))
    said: list[str] = []

    def progress(event: LoadProgress) -> None:
        if event.stage == "notice":
            said.append(event.message)

    again = load_native(str(path), PackRecipe("gguf"), progress)
    assert any("packing it again" in line and "disagree" in line for line in said), said
    assert again.model.shape.heads == 4


def test_an_unfinished_packing_left_by_a_killed_start_is_swept(tmp_path: Path) -> None:
    path = shutil.copy(LLAMA, tmp_path / "model.gguf")
    stale = packed_dir() / ".model-gguf-0123456789ab.partial-abcd1234"
    stale.mkdir(parents=True)
    (stale / WEIGHTS).write_bytes(b"\0" * 1_000_000)
    said: list[str] = []
    load_native(
        str(path), PackRecipe("gguf"), lambda e: said.append(e.message) if e.stage == "notice" else None
    )
    assert not stale.exists()
    assert any("interrupted" in line for line in said), said


def test_a_file_name_with_control_sequences_is_shown_and_cached_safely(tmp_path: Path) -> None:
    path = shutil.copy(LLAMA, tmp_path / f"evil{OSC52_BEL}.gguf")
    resolved = resolve_spec(str(path))
    assert "\x1b" not in resolved.name and "\x07" not in resolved.name
    loaded = load_native(str(path), PackRecipe("gguf"))
    assert (
        loaded.folder.name == f"{safe_entry_name(resolved.name)}-gguf-{loaded.folder.name.rsplit('-', 1)[1]}"
    )
    assert all(c.isalnum() or c in "._+-" for c in loaded.folder.name), loaded.folder.name


@pytest.mark.parametrize(
    ("name", "safe"),
    [
        ("qwen-coder-1.5b", "qwen-coder-1.5b"),
        ("Qwen/Qwen2.5", "Qwen_Qwen2.5"),
        ("..hidden", "hidden"),
        ("", "model"),
    ],
)
def test_cache_entry_names_are_safe(name: str, safe: str) -> None:
    assert safe_entry_name(name) == safe
    assert safe_entry_name(f"a{OSC52_BEL}b") == "a_52_c_ZXZpbA_b"
