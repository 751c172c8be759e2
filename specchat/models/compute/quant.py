"""bitsandbytes 4-bit / 8-bit targets (the `gpu` extra), computed so that speculation stays exact.

Exactness needs a verify pass over several positions to compute each row bit for bit as a
one-token pass computes it. bitsandbytes' layers do not all do that (checked on 0.50.2 at 1–9
rows; tests/quant keeps checking):

- LLM.int8 (``8bit``) picks its outlier columns from the whole batch: when any row has an
  activation above the threshold, that column leaves the int8 product for every row, so a row
  changes with its neighbours;
- the generic 4-bit path (CPUs without AVX512-BF16, and CUDA for more than one row) dequantizes
  and calls the BLAS, whose one-row and many-row products round differently (on CUDA one row
  even takes another kernel, a fused GEMV);
- layers bitsandbytes leaves alone (the output head) and the attention have the same problem as
  in any stock model.

On a CPU, :func:`compute_rows_alone` therefore makes every verify-sized pass (up to γ_max + 1 positions)
of a quantized target run each of those layers once per row, and its attention row by row (as
the CPU paths do, see :func:`specchat.models.compute.rows.row_attention_forward`). Each row is
then, by construction, the very computation a one-token pass makes. The one kind of layer kept
batched is the 4-bit kernel of bitsandbytes' own CPU library (AVX512-BF16): it accumulates each
row in its own registers, in the same order, whatever the number of rows (the tests check this
too).

On CUDA that would make a verify pass cost γ+1 steps, so speculation could never pay: there a
verify pass stays batched (one weight stream for all its rows) and the pair is labelled "batched
verify (rows measured, not bit-exact)"; scripts/gpu_probe.py measures how often its rows differ.
"""

from __future__ import annotations

import importlib.util
import logging
from typing import TYPE_CHECKING

import torch

from specchat.errors import InvalidSettingError

QUANT_CHOICES = ("4bit", "8bit")
INSTALL_HINT = "pip install 'specchat[gpu]' (it runs on a CPU too)"
CPU_NOTE = (
    "bitsandbytes on a CPU: an order of magnitude slower than the default CPU path, see docs/performance.md"
)
"""Said while a quantized target loads on a CPU (docs/performance.md, "--quant on a CPU", has the figures)."""

# bitsandbytes logs on every call of an 8-bit layer that it casts its input to fp16 (that is
# how LLM.int8 works), and on import that a faster CPU 4-bit kernel could be fetched from a
# model hub, which specchat never contacts. Neither is something a user can act on.
for _name in ("bitsandbytes.autograd._functions", "bitsandbytes.backends.cpu.ops"):
    logging.getLogger(_name).setLevel(logging.ERROR)

if TYPE_CHECKING:
    from transformers import BitsAndBytesConfig


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
            f"--quant {text} needs bitsandbytes, which is not installed: {INSTALL_HINT}"
        )
    return text


def quant_note(device: torch.device) -> str:
    """What the loading message adds about a quantized target's kernels ("" where they are fast)."""
    return "" if device.type == "cuda" else f" ({CPU_NOTE})"


def quant_config(quant: str, device: torch.device, dtype: torch.dtype) -> BitsAndBytesConfig:
    from transformers import BitsAndBytesConfig

    if quant == "8bit":
        return BitsAndBytesConfig(load_in_8bit=True)
    compute = dtype
    if device.type == "cuda":
        compute = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=compute)
