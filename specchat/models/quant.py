"""bitsandbytes 4-bit / 8-bit loading of the target (an optional extra)."""

from __future__ import annotations

import importlib.util
import warnings

import torch
from transformers import BitsAndBytesConfig

from specchat.errors import InvalidSettingError

QUANT_CHOICES = ("4bit", "8bit")


def bitsandbytes_available() -> bool:
    return importlib.util.find_spec("bitsandbytes") is not None


def check_quant(quant: str | None) -> str | None:
    """The normalised setting, or InvalidSettingError; checked before any weights are read."""
    if quant is None or quant.strip().lower() in {"", "none", "off"}:
        return None
    text = quant.strip().lower()
    if text not in QUANT_CHOICES:
        raise InvalidSettingError(f"unknown quantization {quant!r}; use 4bit or 8bit, or leave --quant out")
    if not bitsandbytes_available():
        raise InvalidSettingError(
            f"--quant {text} needs bitsandbytes, which is not installed; "
            "install it with: pip install 'specchat[gpu]'"
        )
    return text


def quant_config(quant: str, device: torch.device, dtype: torch.dtype) -> BitsAndBytesConfig:
    if device.type != "cuda":
        warnings.warn(
            f"--quant {quant} on {device} runs bitsandbytes' CPU kernels, slower than plain float32",
            stacklevel=3,
        )
    if quant == "8bit":
        return BitsAndBytesConfig(load_in_8bit=True)
    compute = dtype
    if device.type == "cuda":
        compute = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=compute)
