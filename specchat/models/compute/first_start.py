"""What a GGUF's first start will cost on this machine: time, memory and disk.

A first start packs the file into the cache (specchat.models.compute.packed); the time is the file's size
at the packing rate this machine last showed (each GGUF packing records it in the cache), or, before
any, the rate measured on the reference VM. Memory: packing streams a tensor at a time, so the peak
is that of running the packed copy afterwards, whose pages decoding touches all of: the packed
bytes plus the process itself. Disk: the packed copy.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from specchat.cache_root import cache_dir
from specchat.files import write_atomic
from specchat.models.cache.paths import human_bytes

RATE_FILE = "packing-rate-native.json"
"""Named anew when packing went native (rates recorded by numpy's packing, 4-5x slower, are not read)."""
REFERENCE_RATE = 240e6
"""Bytes of GGUF packed per second on the reference VM (2 cores of an AMD EPYC, AVX-512, load
about 1.7): the Qwen2.5-7B-shaped Q4_K_M file of docs/performance.md packed in 19 s, 246 MB/s,
reading its config and tokenizer beside it; writing the packed copy to disk is most of that
(docs/performance.md). Used until this machine has packed a GGUF itself."""
FIXED_SECONDS = 3.0
"""What a first start spends whatever the size: imports and loading the packed copy (reading the
config and tokenizer runs beside packing)."""
PROCESS_BYTES = 700 * 2**20
"""Resident memory of a running specchat beside its weights (torch, the tokenizer, buffers)."""


@dataclass(frozen=True)
class FirstStart:
    seconds: float
    peak_bytes: int
    disk_bytes: int
    rate: float
    rate_measured_here: bool
    free_disk: int | None
    memory_total: int | None
    memory_available: int | None


def rate_file() -> Path:
    return cache_dir() / RATE_FILE


def record_packing_rate(file_bytes: int, seconds: float) -> None:
    """Remember how fast this machine packed a GGUF (best effort: an estimate, not a record)."""
    if seconds <= 0 or file_bytes <= 0:
        return
    entry: dict[str, object] = {
        "bytes_per_second": file_bytes / seconds,
        "file_bytes": file_bytes,
        "seconds": round(seconds, 1),
    }
    entry["at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    with contextlib.suppress(OSError):  # a read-only cache only loses the estimate
        write_atomic(rate_file(), json.dumps(entry) + "\n")


def packing_rate() -> tuple[float, bool]:
    """(bytes per second, whether it was measured on this machine)."""
    try:
        entry = json.loads(rate_file().read_text())
        rate = float(entry["bytes_per_second"])
    except (OSError, ValueError, KeyError, TypeError):
        return REFERENCE_RATE, False
    return (rate, True) if rate > 0 else (REFERENCE_RATE, False)


def estimate(file_bytes: int, packed_bytes: int) -> FirstStart:
    rate, here = packing_rate()
    try:
        free: int | None = shutil.disk_usage(_existing(cache_dir())).free
    except OSError:
        free = None
    total, available = _memory()
    return FirstStart(
        seconds=FIXED_SECONDS + file_bytes / rate,
        peak_bytes=packed_bytes + PROCESS_BYTES,
        disk_bytes=packed_bytes,
        rate=rate,
        rate_measured_here=here,
        free_disk=free,
        memory_total=total,
        memory_available=available,
    )


def estimate_lines(first: FirstStart) -> list[str]:
    source = "this machine's last packing" if first.rate_measured_here else "the reference 2-core VM"
    lines = [
        f"  first start     about {_duration(first.seconds)} to pack it once "
        f"({human_bytes(int(first.rate))}/s, {source}); later starts take seconds",
        f"  memory          about {human_bytes(first.peak_bytes)} at peak{_machine_memory(first)}",
        f"  disk            {human_bytes(first.disk_bytes)} for the packed copy"
        + (f" ({human_bytes(first.free_disk)} free in the cache)" if first.free_disk is not None else ""),
    ]
    if first.memory_total is not None and first.peak_bytes > first.memory_total:
        lines.append("  warning         it needs more memory than this machine has")
    if first.free_disk is not None and first.disk_bytes > first.free_disk:
        lines.append("  warning         the cache's disk has no room for the packed copy")
    return lines


def _machine_memory(first: FirstStart) -> str:
    if first.memory_total is None:
        return ""
    available = f", {human_bytes(first.memory_available)} available now" if first.memory_available else ""
    return f" (this machine has {human_bytes(first.memory_total)}{available})"


def _duration(seconds: float) -> str:
    whole = round(seconds)
    return f"{whole} s" if whole < 90 else f"{whole // 60} min {whole % 60} s"


def _existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _memory() -> tuple[int | None, int | None]:
    """(total, available) bytes of memory, where the system says (Linux, macOS: total only)."""
    try:
        page = os.sysconf("SC_PAGE_SIZE")
        total = os.sysconf("SC_PHYS_PAGES") * page
    except (ValueError, OSError, AttributeError):
        return None, None
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return total, int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return total, None
