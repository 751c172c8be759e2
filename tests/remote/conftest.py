"""Fixtures: settings and data folders isolated, no API key unless a test sets one."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(autouse=True)
def isolated(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in list(os.environ):
        if name.startswith("SPECCHAT_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("SPECCHAT_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("SPECCHAT_CONFIG", str(tmp_path / "config" / "config.toml"))
    yield


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
