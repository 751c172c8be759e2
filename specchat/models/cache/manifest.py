"""What a cache folder held when it was written, and whether it still does.

When a folder is written, every file's size, the sha256 of its first MiB and the sha256 of all of
it are recorded (hashing gigabytes once, beside minutes of conversion, costs seconds). Every start
then compares sizes and first MiBs, and checks that each safetensors file's header describes
exactly its bytes: that catches truncation, missing files and damaged headers in milliseconds.
Hashing every byte at every start would cost seconds per gigabyte; `specchat models --verify` does
it on demand.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path
from typing import Any

HEAD = 1 << 20
BLOCK = 8 << 20
_SAFETENSORS_MAX_HEADER = 100 << 20  # the format's own limit


def record_files(folder: Path, *, skip: frozenset[str] = frozenset()) -> dict[str, dict[str, Any]]:
    """{relative path: {size, head, sha256}} for every file under `folder` but those in `skip`."""
    files = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        name = path.relative_to(folder).as_posix()
        if name in skip:
            continue
        head, whole, size = _digests(path)
        files[name] = {"size": size, "head": head, "sha256": whole}
    return files


def quick_problem(folder: Path, files: object) -> str | None:
    """Why `folder` no longer matches its record, from sizes and first MiBs; None if it does."""
    if not isinstance(files, dict) or not files:
        return "its record lists no files"
    for name, entry in files.items():
        expected = _expected(entry)
        if expected is None:
            return f"its record of {name} is malformed"
        size, head, _ = expected
        path = folder / name
        try:
            actual = path.stat().st_size
        except OSError:
            return f"{name} is missing"
        if actual != size:
            return f"{name} has {actual:,} bytes instead of {size:,}"
        if head_digest(path) != head:
            return f"the first bytes of {name} changed"
    return safetensors_problem(folder)


def full_problem(folder: Path, files: object) -> str | None:
    """:func:`quick_problem`, then every byte of every file against its recorded sha256."""
    problem = quick_problem(folder, files)
    if problem is not None:
        return problem
    assert isinstance(files, dict)
    for name, entry in files.items():
        expected = _expected(entry)
        assert expected is not None
        if expected[2] is None:
            continue
        if _digests(folder / name)[1] != expected[2]:
            return f"{name} has changed since it was written: its sha256 differs"
    return None


def safetensors_problem(folder: Path) -> str | None:
    """A structural check of every .safetensors file: its header parses and covers every byte."""
    for path in sorted(folder.glob("*.safetensors")):
        problem = _safetensors_layout(path)
        if problem is not None:
            return f"{path.name} {problem}"
    return None


def head_digest(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.sha256(handle.read(HEAD)).hexdigest()


def _digests(path: Path) -> tuple[str, str, int]:
    """(sha256 of the first MiB, sha256 of everything, size) in one read."""
    head, whole = hashlib.sha256(), hashlib.sha256()
    size = 0
    with path.open("rb") as handle:
        while block := handle.read(BLOCK):
            if size < HEAD:
                head.update(block[: HEAD - size])
            whole.update(block)
            size += len(block)
    return head.hexdigest(), whole.hexdigest(), size


def _expected(entry: object) -> tuple[int, str, str | None] | None:
    if not isinstance(entry, dict):
        return None
    size, head, whole = entry.get("size"), entry.get("head"), entry.get("sha256")
    if not isinstance(size, int) or not isinstance(head, str):
        return None
    return size, head, whole if isinstance(whole, str) else None


def _safetensors_layout(path: Path) -> str | None:
    size = path.stat().st_size
    with path.open("rb") as handle:
        prefix = handle.read(8)
        if len(prefix) < 8:
            return f"has only {size} bytes"
        (length,) = struct.unpack("<Q", prefix)
        if length > min(size - 8, _SAFETENSORS_MAX_HEADER):
            return f"has a header claiming {length:,} bytes of a {size:,}-byte file"
        try:
            header = json.loads(handle.read(length))
        except (UnicodeDecodeError, ValueError):
            return "has a damaged header"
    try:
        end = max((int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"), default=0)
    except (AttributeError, KeyError, IndexError, TypeError, ValueError):
        return "has a damaged header"
    if 8 + length + end != size:
        return f"has {size:,} bytes where its header describes {8 + length + end:,}"
    return None
