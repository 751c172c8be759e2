from __future__ import annotations

import pytest

from specchat.kernels import cpu_supports

# Every test here runs specchat's C++ kernels (built once into the kernels folder).
pytestmark = pytest.mark.skipif(cpu_supports() is not None, reason=f"specchat's kernels: {cpu_supports()}")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    reason = cpu_supports()
    if reason is None:
        return
    for item in items:
        if "tests/kernels/" in str(item.fspath):
            item.add_marker(pytest.mark.skip(reason=f"specchat's kernels cannot run here: {reason}"))
