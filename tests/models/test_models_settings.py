"""Device and dtype choice, and the import weight of specchat.models."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from specchat.errors import InvalidSettingError
from specchat.models import resolve_device
from specchat.models.loading.device import resolve_dtype


def test_auto_and_cpu() -> None:
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected
    assert resolve_device("CPU") == torch.device("cpu")


@pytest.mark.parametrize("device", ["gpu", "cuda:x", "cuda:-1", "mps:0"])
def test_unknown_device(device: str) -> None:
    with pytest.raises(InvalidSettingError, match="unknown device"):
        resolve_device(device)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_a_gpu_says_use_cpu() -> None:
    with pytest.raises(InvalidSettingError, match="--device cpu"):
        resolve_device("cuda:0")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_index_out_of_range() -> None:
    with pytest.raises(InvalidSettingError, match="does not exist"):
        resolve_device(f"cuda:{torch.cuda.device_count()}")


def test_dtypes() -> None:
    cpu = torch.device("cpu")
    assert resolve_dtype("auto", cpu) == torch.float32
    assert resolve_dtype("bfloat16", cpu) == resolve_dtype("bf16", cpu) == torch.bfloat16
    assert resolve_dtype("float16", cpu) == torch.float16
    assert resolve_dtype("Float32", cpu) == torch.float32
    with pytest.raises(InvalidSettingError):
        resolve_dtype("double", cpu)


def test_importing_the_package_loads_no_torch() -> None:
    code = (
        "import sys; from specchat.models import list_models, LoadProgress, DEFAULT_TARGET, cache_dir; "
        "list_models(); print('torch' in sys.modules, 'transformers' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
