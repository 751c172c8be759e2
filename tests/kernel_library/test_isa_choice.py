"""Which CPU path a start takes when specchat's kernels have no variant to run (issue 24)."""

from __future__ import annotations

import pytest

import specchat.kernels as kernels
from specchat.errors import InvalidSettingError
from specchat.models.cpu_quant import FALLBACK_CPU_PATH
from specchat.models.loader import choose_cpu_path
from specchat.models.records import LoadProgress


def test_a_named_instruction_set_that_cannot_run_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(kernels.ISA_ENV, "neon")
    with pytest.raises(InvalidSettingError, match="SPECCHAT_CPU_ISA=neon") as caught:
        choose_cpu_path("auto", "cpu", None, None)
    assert "\n" not in str(caught.value)


def test_a_cpu_without_a_variant_says_why_it_takes_the_slower_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(kernels.ISA_ENV, raising=False)
    reason = "this CPU lacks avx2, fma"
    monkeypatch.setattr(kernels, "cpu_supports", lambda: reason)
    events: list[LoadProgress] = []
    chosen = choose_cpu_path("auto", "cpu", None, events.append)
    assert str(chosen) == FALLBACK_CPU_PATH
    [line] = [event.message for event in events if event.stage == "notice"]
    assert reason in line and FALLBACK_CPU_PATH in line
