from __future__ import annotations

import pytest

from specchat.kernels import ISA_ENV, VARIANTS, cpu_supports, missing_for


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests on the default variant skip where no variant is picked unasked; those taking the
    ``isa`` fixture run each variant this CPU executes (the scalar one on any)."""
    reason = cpu_supports()
    if reason is None:
        return
    for item in items:
        if "tests/kernels/" in str(item.fspath) and "isa" not in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.skip(reason=f"specchat's kernels cannot run here: {reason}"))


def use_variant(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Kernels loaded from now on in this test are ``name``'s (skipped where this CPU cannot run it)."""
    reason = missing_for(next(v for v in VARIANTS if v.name == name))
    if reason is not None:
        pytest.skip(f"the {name} kernels cannot run here: {reason}")
    monkeypatch.setenv(ISA_ENV, name)


@pytest.fixture(params=[v.name for v in VARIANTS])
def isa(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The test runs once on each kernel variant."""
    use_variant(monkeypatch, request.param)
    return str(request.param)


@pytest.fixture(params=[v.name for v in VARIANTS if v.name != "scalar"])
def simd(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each SIMD variant in turn (the test compares it with the scalar reference)."""
    use_variant(monkeypatch, request.param)
    return str(request.param)
