"""`specchat models`: what the cache holds per model and kind, --clear (asks, locks) and --verify."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from filelock import FileLock

from specchat.cli import main
from specchat.models import load_model
from specchat.models.cache import manifest
from specchat.models.cache import writes as store
from specchat.models.cache.paths import cache_dir, converted_dir, gguf_dir, human_bytes
from specchat.models.names.catalog import PackagedModel
from specchat.models.records import LoadProgress

IDS = torch.tensor([[1, 5, 9, 20, 7, 3]])


def run(*args: str, input: str | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, ["models", *args], input=input, catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def filled(tiny_packaged: PackagedModel, tiny_gguf: Path, tmp_path: Path) -> dict[str, Path]:
    """The tiny packaged model assembled and converted, a user's GGUF converted, a kind this code
    has never heard of (as the packed CPU weights will be), and a killed run's temporary."""
    load_model(tiny_packaged.name, device="cpu")
    mine = tmp_path / "mine.gguf"
    shutil.copy(tiny_gguf, mine)
    user = Path(load_model(str(mine), device="cpu").source)
    packed = cache_dir() / "packed" / f"{tiny_packaged.name}-{tiny_packaged.key}-int8"
    packed.mkdir(parents=True)
    (packed / "weights.bin").write_bytes(b"\0" * 5000)
    partial = converted_dir() / f".{user.name}{store.PARTIAL}abc123"
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(b"\0" * 7000)
    return {
        "gguf": gguf_dir() / tiny_packaged.file,
        "converted": converted_dir() / f"{tiny_packaged.name}-{tiny_packaged.key}",
        "user": user,
        "packed": packed,
        "partial": partial,
    }


def _events_of_loading(name: str) -> list[LoadProgress]:
    events: list[LoadProgress] = []
    load_model(name, device="cpu", progress=events.append)
    return events


def size(path: Path) -> int:
    return store.disk_size(path)


def row(out: str, owner: str) -> list[str]:
    lines = [line for line in out.splitlines() if line.startswith(owner + " ")]
    assert len(lines) == 1, out
    return lines[0].split()


def test_sizes_per_model_and_kind(filled: dict[str, Path], tiny_packaged: PackagedModel) -> None:
    code, out, _ = run()
    assert code == 0
    cache_table = out[out.index("cache: ") :]
    header = cache_table.splitlines()[1].split()
    assert header == ["model", "converted", "gguf", "packed", "total"]
    gguf = size(filled["gguf"]) + size(filled["gguf"].with_name(filled["gguf"].name + ".sha256"))
    expected = {
        "converted": size(filled["converted"]),
        "gguf": gguf,
        "packed": size(filled["packed"]),
    }
    cells = " ".join(row(cache_table, tiny_packaged.name)[1:])
    total = sum(expected.values())
    assert cells == " ".join(human_bytes(v) for v in [*expected.values(), total])
    assert " ".join(row(cache_table, filled["user"].name)[1:]) == (
        f"{human_bytes(size(filled['user']))} – – {human_bytes(size(filled['user']))}"
    )
    assert row(cache_table, "(unfinished)")[1:3] == human_bytes(7000).split()
    everything = total + size(filled["user"]) + 7000
    assert cache_table.splitlines()[0] == f"cache: {cache_dir()} ({human_bytes(everything)})"
    assert "--clear NAME|all" in out and "--verify" in out


def test_empty_cache_says_so() -> None:
    code, out, _ = run()
    assert code == 0 and f"cache: {cache_dir()} (empty)" in out


def test_clear_asks_and_no_keeps_everything(filled: dict[str, Path], tiny_packaged: PackagedModel) -> None:
    code, out, err = run("--clear", tiny_packaged.name, input="n\n")
    assert code == 1
    assert "Delete" in out + err and err.strip().splitlines()[-1] == "specchat: nothing deleted."
    assert all(path.exists() for path in filled.values())


def test_clear_a_model_removes_every_kind_of_it_and_nothing_else(
    filled: dict[str, Path], tiny_packaged: PackagedModel
) -> None:
    marker = filled["gguf"].with_name(filled["gguf"].name + ".sha256")
    expected = sum(size(filled[k]) for k in ("converted", "packed", "gguf")) + size(marker)
    code, out, err = run("--clear", tiny_packaged.name, input="y\n")
    assert code == 0, err
    assert f"freed {human_bytes(expected)}" in out
    assert not filled["gguf"].exists() and not filled["converted"].exists() and not filled["packed"].exists()
    assert not marker.exists()
    assert filled["user"].exists() and filled["partial"].exists()
    assert not [p for p in converted_dir().iterdir() if "clear-" in p.name]
    # It comes back on the next start, from the chunks.
    events: list[LoadProgress] = []
    load_model(tiny_packaged.name, device="cpu", progress=events.append)
    assert {"assemble", "convert"} <= {e.stage for e in events}


def test_clear_one_kind(filled: dict[str, Path], tiny_packaged: PackagedModel) -> None:
    code, _, err = run("--clear", tiny_packaged.name, "--kind", "converted", "--yes")
    assert code == 0, err
    assert not filled["converted"].exists() and filled["gguf"].exists() and filled["packed"].exists()
    events: list[LoadProgress] = []
    load_model(tiny_packaged.name, device="cpu", progress=events.append)
    stages = {e.stage for e in events}
    assert "convert" in stages and not [e for e in events if e.message.startswith("assembling")]


def test_clear_all(filled: dict[str, Path]) -> None:
    code, _, err = run("--clear", "all", "--yes")
    assert code == 0, err
    left = [p for p in cache_dir().rglob("*") if p.is_file() and ".locks" not in p.parts]
    assert left == []
    assert run()[1].count("(empty)") == 1


def test_clear_skips_what_another_specchat_is_using(
    filled: dict[str, Path], tiny_packaged: PackagedModel
) -> None:
    holder = FileLock(str(store.lock_path(filled["converted"])))  # as a loading or converting process
    holder.acquire()
    try:
        code, _, err = run("--clear", tiny_packaged.name, "--yes")
    finally:
        holder.release()
    assert code == 1
    assert filled["converted"].is_dir() and not filled["gguf"].exists() and not filled["packed"].exists()
    skipped = [line for line in err.splitlines() if "skipped" in line]
    assert skipped == [
        f"specchat: skipped {tiny_packaged.name} (converted): another specchat is using "
        f"{filled['converted'].name}; close it, or clear again when it is done"
    ]
    assert "Traceback" not in err


def test_no_answer_means_nothing_is_deleted(filled: dict[str, Path]) -> None:
    code, _, err = run("--clear", "all", input="")
    assert code == 1
    assert err.strip().splitlines()[-1] == "specchat: nothing deleted (pass --yes to clear without asking)."
    assert all(path.exists() for path in filled.values())


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("--clear", "nope"), "nothing cached under 'nope'; cached: tiny-packaged, mine-"),
        (("--clear", "all", "--kind", "x"), "no 'x' in the cache; kinds present: converted, gguf, packed"),
        (("--kind", "gguf"), "--kind goes with --clear or --verify"),
    ],
)
def test_bad_arguments_are_one_line(filled: dict[str, Path], args: tuple[str, ...], expected: str) -> None:
    code, _, err = run(*args)
    assert code == 2 and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and expected in err
    assert all(path.exists() for path in filled.values())


def test_clear_a_packaged_model_with_nothing_cached() -> None:
    code, out, _ = run("--clear", "qwen-coder-1.5b", "--yes")
    assert code == 0 and "nothing cached for qwen-coder-1.5b" in out


@pytest.fixture
def short_head(monkeypatch: pytest.MonkeyPatch) -> None:
    """Starts check the first 64 bytes instead of the first MiB, so that the tiny model's weights
    lie beyond them, as a real model's gigabytes do."""
    monkeypatch.setattr(manifest, "HEAD", 64)


def test_verify_finds_a_flipped_byte_and_removes_the_entry(
    short_head: None, filled: dict[str, Path], tiny_packaged: PackagedModel
) -> None:
    code, out, _ = run("--verify")
    assert code == 0 and "damaged" not in out
    weights = filled["converted"] / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-3] ^= 0x01  # inside the last tensor: a start's quick check cannot see this
    weights.write_bytes(bytes(data))
    assert "damaged" not in " ".join(  # what a start cannot see without hashing every byte...
        e.message for e in _events_of_loading(tiny_packaged.name)
    )
    with torch.no_grad():
        reference = load_model(str(filled["user"]), device="cpu").model(IDS).logits

    code, out, _ = run("--verify", tiny_packaged.name)
    assert code == 1
    assert (
        f"{tiny_packaged.name} (converted): damaged (model.safetensors has changed since it was written: "
        "its sha256 differs); removed, the next start rebuilds it"
    ) in out
    assert f"{tiny_packaged.name} (gguf): ok" in out
    assert not filled["converted"].exists() and filled["gguf"].exists()
    events: list[LoadProgress] = []
    rebuilt = load_model(tiny_packaged.name, device="cpu", progress=events.append)
    with torch.no_grad():
        torch.testing.assert_close(rebuilt.model(IDS).logits, reference, rtol=0, atol=0)


def test_listing_when_the_cache_folder_is_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "cache-file"
    blocker.write_text("x")
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(blocker))
    code, out, err = run()
    assert code == 0 and "Traceback" not in err
    assert f"cache: {blocker} is a file, not a folder; move it away or set SPECCHAT_CACHE_DIR" in out
    code, _, err = run("--clear", "all", "--yes")
    assert code == 0 and blocker.read_text() == "x"
