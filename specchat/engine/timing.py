"""Timing a round's phases without making the host wait for the device.

On CUDA a mark is a recorded event: the device stamps it when it gets there, and the spans are
read after the round's one synchronisation (the verdict's read), so timing costs no extra
sync. On a CPU every operation has finished when it returns, so the host clock is exact.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch


class RoundClock:
    """Marks from the round's start; :meth:`spans_ms` gives the milliseconds between them."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._events: list[torch.cuda.Event] = []
        self._times: list[float] = []
        self.mark()

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self._events.append(event)
        else:
            self._times.append(time.perf_counter())

    def spans_ms(self) -> list[float]:
        """Milliseconds between consecutive marks (call after the device reached the last one)."""
        if self.cuda:
            self._events[-1].synchronize()  # already passed when the verdict was read: no wait
            return [a.elapsed_time(b) for a, b in zip(self._events, self._events[1:], strict=False)]
        return [(b - a) * 1000.0 for a, b in zip(self._times, self._times[1:], strict=False)]


HOST_READS = ("tolist", "item", "__bool__", "__int__", "__float__", "__index__")
"""Every way a tensor's value reaches the host (each one a device sync on CUDA)."""


@contextmanager
def counted_host_reads() -> Iterator[Counter[str]]:
    """Count the host reads of tensor values made inside the block, by kind (the check of "one
    host read per round" that a CPU can run; numpy views are not counted: the engine takes them
    only of CPU tensors, where nothing waits)."""
    counts: Counter[str] = Counter()
    originals = {name: getattr(torch.Tensor, name) for name in HOST_READS}

    def counting(name: str) -> Callable[..., Any]:
        original = originals[name]

        def read(self: Any, *args: Any, **kwargs: Any) -> Any:
            counts[name] += 1
            return original(self, *args, **kwargs)

        return read

    try:
        for name in HOST_READS:
            setattr(torch.Tensor, name, counting(name))
        yield counts
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)
