"""CPU fast paths for the linear layers: fewer bytes per weight, every row computed on its own.

Decoding one token is memory-bound: each step streams every weight once. On the 2-core AMD CPU
this project is measured on, fp32 weights also suffer from MKL's small-batch GEMM, which makes
a verify pass over 2–9 positions cost 2–7 single-token passes (see docs/lab/), so speculation
cannot pay. The kernels here read fewer bytes and stay flat in the number of rows.

Exactness: the target's layers must compute each row of a verify pass bit for bit as a
single-token pass would, or greedy speculative output drifts from plain decoding computed the
same way. The target modes below have that property (checked in tests): fbgemm's fp16-weight
GEMM (``fp16``) and per-row dynamic int8 (``int8``: exact int32 accumulation on fbgemm, one
activation scale per row). Attention must be row-independent too: see
:func:`specchat.models.compute.rows.row_attention_forward` and
:mod:`specchat.models.compute.lean`. (Weight-only int4 was measured and dropped: torch's CPU
int4 kernel is no faster than fbgemm int8 at one row and far slower with fp32 activations.)
fbgemm's stock dynamic int8 (``dyn8``) quantizes activations with one scale per *batch*, so
its rows depend on their neighbours: it is offered for the draft only, where numerics only
move the acceptance rate, never the output.

The draft may also get a *narrow head*: logits for only the first ``n`` token ids (byte-level
BPE ids are roughly ordered by merge frequency). The drafter then proposes from those ids
only; p_draft is exactly the distribution it sampled from (zero elsewhere), so verification
stays exact; only α can drop, by the mass the target puts on rarer tokens.

A path is written ``TARGET/DRAFT``, e.g. ``fp16/int8``, optionally with ``+head32768`` on the
draft part; ``none`` leaves both models as loaded; ``auto`` picks the measured best for the device.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import torch
from torch import nn

from specchat.errors import InvalidSettingError
from specchat.models.compute.fusion import fuse_groups
from specchat.models.compute.packed_linear import PackedLinear, fbgemm_fp16_rows_exact
from specchat.models.compute.rows import use_row_attention

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from specchat.kernels.lm import DecodingLM

Item = TypeVar("Item")
Result = TypeVar("Result")

NATIVE_MODES = ("gguf", "q4", "q8")
"""specchat's own kernels (specchat.kernels): the whole forward in C++ on block-quantized weights.
"gguf" keeps a GGUF file's own Q4_K / Q6_K blocks (the very weights llama.cpp reads)."""
TARGET_MODES = ("fp32", "fp16", "int8", *NATIVE_MODES)
DRAFT_MODES = ("fp32", "fp16", "int8", "dyn8", *NATIVE_MODES)
NATIVE_CPU_PATH = "gguf/q4+head32768"
"""The default where specchat's kernels run: the target on its GGUF blocks, a 4-bit draft with a
32k head (the draft's numerics only move acceptance, never the output)."""
FALLBACK_CPU_PATH = "int8/dyn8+head32768"
"""What a user may ask for where specchat's kernels cannot be built (no compiler, Windows): per-row
int8 target on fbgemm (x86-64 only), fbgemm int8 draft with a 32k head. Never taken unasked: it
first writes an fp32 copy of the target (about 11 GB for the default pair) and peaks far above
what the default path needs."""


@dataclass(frozen=True)
class CpuPath:
    target: str = "fp32"
    draft: str = "fp32"
    draft_head: int | None = None

    def __str__(self) -> str:
        if self.target == "fp32" and self.draft == "fp32" and self.draft_head is None:
            return "none"
        head = f"+head{self.draft_head}" if self.draft_head else ""
        return f"{self.target}/{self.draft}{head}"

    @property
    def native(self) -> bool:
        """Whether the pair runs on specchat's own kernels (the whole forward in C++)."""
        return self.target in NATIVE_MODES


def parse_cpu_path(text: str, device: torch.device | None = None) -> CpuPath:
    """``none``, ``auto`` or ``TARGET/DRAFT[+headN]``; InvalidSettingError otherwise."""
    value = text.strip().lower()
    if value in ("", "none", "off"):
        return CpuPath()
    if value == "auto":
        if device is not None and device.type != "cpu":
            return CpuPath()
        return parse_cpu_path(NATIVE_CPU_PATH)
    target, _, draft = value.partition("/")
    draft = draft or "fp32"
    draft, _, head = draft.partition("+head")
    if target not in TARGET_MODES or draft not in DRAFT_MODES:
        raise InvalidSettingError(
            f"unknown CPU path {text!r}: use none, auto or TARGET/DRAFT with TARGET in "
            f"{', '.join(TARGET_MODES)} and DRAFT in {', '.join(DRAFT_MODES)} (e.g. int8/dyn8+head32768)."
        )
    try:
        width = int(head) if head else None
    except ValueError as err:
        raise InvalidSettingError(f"the draft head width in {text!r} must be a whole number.") from err
    if width is not None and width < 256:
        raise InvalidSettingError(
            f"a draft head narrower than 256 ids cannot cover the byte tokens ({text!r})."
        )
    if (target in NATIVE_MODES) != (draft in NATIVE_MODES):
        raise InvalidSettingError(
            f"CPU path {text!r} mixes specchat's kernels ({', '.join(NATIVE_MODES)}) with fbgemm's: "
            "pick both from one family, e.g. gguf/q4+head32768 or int8/dyn8+head32768."
        )
    if target == "fp16" and not fbgemm_fp16_rows_exact():
        raise InvalidSettingError(
            f"CPU path {text!r}: fbgemm's fp16 kernels on this CPU compute a row differently when it "
            "shares a pass with other rows, which would make speculative output differ from plain "
            "decoding; use auto, or int8 for the target (e.g. int8/dyn8+head32768)."
        )
    return CpuPath(target, draft, width)


# ------------------------------------------------------------------------------------------ models
def convert_linears(
    model: nn.Module,
    mode: str,
    *,
    head_rows: int | None = None,
    fuse: bool = True,
    between_jobs: Callable[[], None] | None = None,
) -> nn.Module:
    """Replace every nn.Linear in ``model`` (in place) by a PackedLinear of ``mode``.

    Sibling projections that share an input are fused into one GEMM (``fuse``); ``head_rows``
    narrows the output head to the first ids (drafts only: see the module doc).
    """
    outputs = getattr(model, "get_output_embeddings", None)  # a Hugging Face model's head
    head = outputs() if callable(outputs) else None
    if mode != "fp32" and fuse:
        # Each job replaces attributes of its own module only, so modules can be fused in parallel.
        _in_parallel(lambda module: fuse_groups(module, mode), list(model.modules()), between_jobs)
    jobs: list[tuple[nn.Module, str, nn.Linear, int | None]] = []
    for module in list(model.modules()):
        for child_name, child in list(module.named_children()):
            if not isinstance(child, nn.Linear):
                continue
            is_head = child is head
            if mode == "fp32" and not (is_head and head_rows is not None):
                continue
            rows = head_rows if is_head and head_rows is not None and head_rows < child.out_features else None
            jobs.append((module, child_name, child, rows))
    packed = _in_parallel(lambda job: PackedLinear(job[2], mode, job[3]), jobs, between_jobs)
    for (module, child_name, _, _), layer in zip(jobs, packed, strict=True):
        setattr(module, child_name, layer)
    return model


def _in_parallel(
    work: Callable[[Item], Result], items: Sequence[Item], between_jobs: Callable[[], None] | None = None
) -> list[Result]:
    """``work`` on every item, one single-threaded job per core.

    Packing is a long series of mid-sized ops (quantize, fbgemm prepack) that parallelise
    poorly inside one op; jobs side by side pack the default pair about 1.4x faster on 2 cores.
    ``between_jobs`` runs before each job: whatever it raises abandons the packing (an app
    that quits need not wait for every remaining job).
    """
    if between_jobs is not None:
        plain_work = work

        def work(item: Item) -> Result:
            between_jobs()
            return plain_work(item)

    workers = min(os.cpu_count() or 1, 8, len(items))
    if workers < 2:
        return [work(item) for item in items]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with ThreadPoolExecutor(workers) as pool:
            return list(pool.map(work, items))
    finally:
        torch.set_num_threads(threads)


@dataclass
class CpuPair:
    """The models the engine decodes with, and the Hugging Face models they share weights with."""

    target: PreTrainedModel | DecodingLM
    """The Hugging Face model itself, or its lean forward, or its copy on specchat's kernels."""
    draft: PreTrainedModel | DecodingLM | None
    hf_target: PreTrainedModel
    hf_draft: PreTrainedModel | None
    path: str
    lean: bool


def prepare_cpu_pair(
    target: PreTrainedModel,
    draft: PreTrainedModel | None,
    path: str | CpuPath = "auto",
    *,
    lean: bool = True,
    between_jobs: Callable[[], None] | None = None,
) -> CpuPair:
    """Convert the pair in place for ``path`` and wrap it in the lean forward where possible.

    The Hugging Face models keep working (``generate``; the bench's peer runs on them) and
    share every weight with the engine's models; their attention switches to row-by-row for
    short passes so that their own assisted decoding stays exact too.
    """
    from specchat.models.compute.lean import LeanCausalLM, lean_supported

    device = next(target.parameters()).device
    quantized = getattr(target, "hf_quantizer", None) is not None or getattr(target, "is_quantized", False)
    if quantized and isinstance(path, str) and path.strip().lower() == "auto":
        path = "none"  # bitsandbytes layers already: leave them alone
    chosen = path if isinstance(path, CpuPath) else parse_cpu_path(path, device)
    if str(chosen) == "none":
        if device.type == "cpu" and not quantized:
            # MKL's fp32 GEMM sums a row differently in a batch: verify rows alone, as plain steps do.
            from specchat.models.compute.rows import compute_rows_alone

            compute_rows_alone(target)
        return CpuPair(target, draft, target, draft, "none", False)
    if device.type != "cpu":
        raise InvalidSettingError(f"--cpu-path {chosen} is for CPU models; this one is on {device}.")
    if quantized:
        raise InvalidSettingError("--cpu-path cannot be combined with --quant: pick one.")
    if chosen.native:
        return _native_pair(target, draft, chosen)
    with torch.inference_mode(False), torch.no_grad():
        convert_linears(target, chosen.target, between_jobs=between_jobs)
        if chosen.target != "fp32":
            use_row_attention(target)
        if draft is not None:
            convert_linears(draft, chosen.draft, head_rows=chosen.draft_head, between_jobs=between_jobs)
        for model in (target, draft):
            if model is not None:
                _own_remaining_weights(model)
    use_lean = lean and lean_supported(target) is None and (draft is None or lean_supported(draft) is None)
    if not use_lean:
        return CpuPair(target, draft, target, draft, str(chosen), False)
    lean_draft = LeanCausalLM(draft) if draft is not None else None
    return CpuPair(LeanCausalLM(target), lean_draft, target, draft, str(chosen), True)


def _native_pair(target: PreTrainedModel, draft: PreTrainedModel | None, path: CpuPath) -> CpuPair:
    """Loaded float models quantized for specchat's kernels ("gguf" means q8 here: no GGUF blocks)."""
    from specchat.models.compute.packing import from_hf

    def bits(mode: str) -> int:
        return 4 if mode == "q4" else 8

    native_target = from_hf(target, bits=bits(path.target))
    native_draft = from_hf(draft, bits=bits(path.draft)) if draft is not None else None
    if native_draft is not None:
        native_draft.narrow_head = path.draft_head  # see _load_native_pair
    return CpuPair(native_target, native_draft, target, draft, str(path), True)


def _own_remaining_weights(model: nn.Module) -> None:
    """Copy what was not packed (embeddings, norms, biases) out of the loaded file's memory map.

    A model loaded from safetensors keeps views into the mapped file; while any survives, the
    whole fp32 file stays mapped and shows as resident. Owning the few remaining tensors lets
    the mapping go once the packed layers have replaced the large ones.
    """
    for param in model.parameters():
        param.data = param.data.clone()
    for module in model.modules():
        for name, buffer in list(module.named_buffers(recurse=False)):
            if buffer is not None and name in module._buffers:
                module._buffers[name] = buffer.clone()
