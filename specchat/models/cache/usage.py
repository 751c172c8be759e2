"""What the model cache holds, per model and per kind, and clearing it safely.

Nothing here knows the kinds: every visible folder under the cache root is one, and each entry in
it is given to the model its name starts with (see specchat.models.cache.paths). A kind added later shows
up in `specchat models` and can be cleared without a change here.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from specchat.models.cache.manifest import full_problem, safetensors_problem
from specchat.models.cache.paths import CONVERTED_MARKER, PARTIAL, CacheError, cache_dir, kind_dirs
from specchat.models.cache.writes import EntryBusy, disk_size, entry_lock, partial_entry, remove
from specchat.models.names.assemble import sha256_file
from specchat.models.names.catalog import PACKAGED

UNFINISHED = "(unfinished)"
"""The owner shown for temporaries: a run was interrupted, or one is writing them right now."""
OTHER_KIND = "other"
"""Plain files at the cache root, which no kind folder holds."""
SIDECARS = (".sha256",)
"""A file named ``<entry><sidecar>`` belongs with ``<entry>`` and is written under its lock."""


@dataclass(frozen=True)
class CachedItem:
    """One file or folder in the cache."""

    kind: str
    owner: str
    """The model it belongs to: a packaged name, a converted entry's name, or its own name."""
    path: Path
    size: int
    guard: Path
    """The entry whose lock its writer holds (itself, or the entry a temporary or sidecar is for)."""

    @property
    def unfinished(self) -> bool:
        return self.owner == UNFINISHED


def cache_items() -> list[CachedItem]:
    """Everything in the cache, found on disk."""
    kinds = kind_dirs()
    users = _user_conversions(kinds)
    items = []
    for kind in kinds:
        with contextlib.suppress(OSError):
            for child in sorted(kind.iterdir()):
                items.append(_item(kind.name, child, users))
    items += [CachedItem(OTHER_KIND, p.name, p, disk_size(p), p) for p in _root_files()]
    return items


def _item(kind: str, path: Path, users: list[str]) -> CachedItem:
    entry = partial_entry(path)
    if entry is not None or path.name.startswith("."):
        return CachedItem(kind, UNFINISHED, path, disk_size(path), entry or path)
    guard = path
    for sidecar in SIDECARS:
        if path.name.endswith(sidecar) and len(path.name) > len(sidecar):
            guard = path.with_name(path.name[: -len(sidecar)])
    return CachedItem(kind, owner_of(guard.name, users), path, disk_size(path), guard)


def owner_of(name: str, users: Iterable[str] = ()) -> str:
    """The model an entry named `name` belongs to: the longest packaged name, packaged file name or
    user conversion it starts with (followed by nothing, `-` or `.`), else `name` itself."""
    candidates: list[tuple[str, str]] = []
    for model in PACKAGED.values():
        candidates += [(model.name, model.name), (model.file, model.name)]
    candidates += [(user, user) for user in users]
    for prefix, owner in sorted(candidates, key=lambda c: len(c[0]), reverse=True):
        if name == prefix or name.startswith((prefix + "-", prefix + ".")):
            return owner
    return name


def _user_conversions(kinds: list[Path]) -> list[str]:
    """Names of conversions of the user's own GGUF files (what `specchat models` lists)."""
    names = []
    for kind in kinds:
        with contextlib.suppress(OSError):
            for child in kind.iterdir():
                if child.name.startswith(".") or not (child / CONVERTED_MARKER).is_file():
                    continue
                if not str(_origin(child)).startswith("packaged:"):
                    names.append(child.name)
    return names


def _origin(folder: Path) -> object:
    try:
        meta = json.loads((folder / CONVERTED_MARKER).read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return ""
    return meta.get("origin", "") if isinstance(meta, dict) else ""


def _root_files() -> list[Path]:
    try:
        return sorted(p for p in cache_dir().iterdir() if not p.name.startswith(".") and not p.is_dir())
    except OSError:
        return []


@dataclass(frozen=True)
class UsageRow:
    owner: str
    by_kind: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.by_kind.values())


def usage(items: list[CachedItem]) -> tuple[list[str], list[UsageRow]]:
    """(kinds, rows): bytes per owner and kind; packaged models first, unfinished work last."""
    kinds = sorted({item.kind for item in items})
    totals: dict[str, dict[str, int]] = {}
    for item in items:
        row = totals.setdefault(item.owner, {})
        row[item.kind] = row.get(item.kind, 0) + item.size
    order = {name: i for i, name in enumerate(PACKAGED)}
    owners = sorted(totals, key=lambda o: (o == UNFINISHED, order.get(o, len(order)), o))
    return kinds, [UsageRow(owner, totals[owner]) for owner in owners]


def select(items: list[CachedItem], name: str, kinds: Iterable[str] = ()) -> list[CachedItem]:
    """The items `--clear NAME` / `--verify NAME` mean: an owner's (or all), optionally of some kinds."""
    wanted = set(kinds)
    return [
        item
        for item in items
        if (name == "all" or item.owner == name) and (not wanted or item.kind in wanted)
    ]


@dataclass
class ClearReport:
    deleted: list[CachedItem] = field(default_factory=list)
    skipped: list[tuple[CachedItem, str]] = field(default_factory=list)

    @property
    def freed(self) -> int:
        return sum(item.size for item in self.deleted)


def clear(items: list[CachedItem]) -> ClearReport:
    """Delete `items`, entry by entry under its lock; an entry another process holds is skipped.

    A folder is renamed to a temporary before it is deleted, so an interrupted clear never leaves
    a half-deleted entry under its real name (the temporary is swept at the next start).
    """
    report = ClearReport()
    groups: dict[Path, list[CachedItem]] = {}
    for item in items:
        groups.setdefault(item.guard, []).append(item)
    for guard, members in groups.items():
        try:
            with entry_lock(guard, "clearing the cache", wait=False):
                for item in members:
                    _delete(item.path)
                    report.deleted.append(item)
        except EntryBusy as busy:
            report.skipped += [(item, busy.holder) for item in members]
        except (CacheError, OSError) as err:
            report.skipped += [(item, str(err)) for item in members]
    return report


def _delete(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        aside = path.with_name(f".{path.name.lstrip('.')}{PARTIAL}clear-{os.getpid()}-{time.monotonic_ns()}")
        if partial_entry(path) is None:
            os.rename(path, aside)
            path = aside
    remove(path)
    if path.exists():
        raise OSError(f"could not delete all of {path}")


NOT_CHECKED = "nothing recorded to check it against"
LAYOUT_ONLY = "its layout is sound; no checksums were recorded when it was written (an older specchat)"


def verify(item: CachedItem, progress: Callable[[str], None] | None = None) -> str | None:
    """Every byte of `item` against what was recorded when it was written: None when it matches,
    else what is wrong (NOT_CHECKED when nothing was recorded). Seconds per gigabyte."""
    if progress is not None:
        progress(f"verifying {item.owner} ({item.kind})")
    for model in PACKAGED.values():
        if item.path.name == model.file and item.path.is_file():
            size = item.path.stat().st_size
            if size != model.size:
                return f"{size:,} bytes instead of {model.size:,}"
            actual = sha256_file(item.path)
            if actual != model.sha256:
                return f"sha256 {actual[:12]}… instead of {model.sha256[:12]}…"
            return None
    record = item.path / CONVERTED_MARKER
    if not record.is_file():
        return NOT_CHECKED
    try:
        meta = json.loads(record.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return f"its record {CONVERTED_MARKER} is unreadable"
    if not isinstance(meta, dict) or "files" not in meta:
        return safetensors_problem(item.path) or LAYOUT_ONLY
    return full_problem(item.path, meta["files"])


def verifiable(items: list[CachedItem]) -> list[CachedItem]:
    """What --verify looks at: finished entries (sidecars and temporaries go with their entry)."""
    return [item for item in items if not item.unfinished and item.guard == item.path]
