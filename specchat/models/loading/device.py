"""Device and dtype choice. "auto" picks CUDA when there is one."""

from __future__ import annotations

import re

import torch

from specchat.errors import InvalidSettingError

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}

# fp32 on CPU: measured on the 0.5B draft (2 cores, torch 2.13), bf16 decoded no faster than fp32
# (see the models report), and fp32 keeps greedy output identical to the reference.
CPU_AUTO_DTYPE = torch.float32


def resolve_device(device: str = "auto") -> torch.device:
    """ "auto" -> cuda if available else cpu; "cpu", "cuda" and "cuda:N" are checked against this machine."""
    text = device.strip().lower()
    if text == "auto":
        return (
            torch.device("cuda", torch.cuda.current_device())
            if torch.cuda.is_available()
            else torch.device("cpu")
        )
    if text == "cpu":
        return torch.device("cpu")
    match = re.fullmatch(r"cuda(?::(\d+))?", text)
    if match is None:
        raise InvalidSettingError(f"unknown device {device!r}; use auto, cpu, cuda or cuda:N")
    if not torch.cuda.is_available():
        raise InvalidSettingError(
            f"device {device!r} asked for, but this torch build sees no CUDA GPU; use --device cpu"
        )
    index = int(match.group(1) or torch.cuda.current_device())
    count = torch.cuda.device_count()
    if index >= count:
        raise InvalidSettingError(
            f"device {device!r} does not exist: this machine has cuda:0 to cuda:{count - 1}"
        )
    return torch.device("cuda", index)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """ "auto": bf16 on CUDA (fp16 where bf16 is unsupported), fp32 on CPU; or a named float type."""
    text = dtype.strip().lower()
    if text == "auto":
        if device.type != "cuda":
            return CPU_AUTO_DTYPE
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if text not in DTYPES:
        raise InvalidSettingError(f"unknown dtype {dtype!r}; use auto, float32, bfloat16 or float16")
    return DTYPES[text]
