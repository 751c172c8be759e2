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

import functools
import os
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import torch
from torch import nn

from specchat.errors import InvalidSettingError
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

# fbgemm's fp16 GEMM and quantized tensors carry deprecation notices in torch 2.13; they are still
# the fastest CPU kernels here (see the module doc). Say so once, not on every forward.
warnings.filterwarnings("ignore", message=r".*fbgemm.*deprecated.*")
warnings.filterwarnings("ignore", message=r".*quantize_per_tensor, torch.quantize_per_channel.*")


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


# ------------------------------------------------------------------------------------------ kernels
def _fbgemm_fp16_available() -> bool:
    return hasattr(
        torch.ops._quantized, "wrapped_fbgemm_pack_gemm_matrix_fp16"
    ) and torch.backends.quantized.engine in (
        "fbgemm",
        "x86",
    )


@functools.cache
def fbgemm_fp16_rows_exact() -> bool:
    """Whether fbgemm's fp16 GEMM computes each row of a pass as a one-row pass computes it.

    It does with its AVX-512 kernels; its AVX2 kernels take rows in blocks of six and accumulate
    the rows of a shorter block differently, so a verify pass would not reproduce one-token
    passes. Asked of the kernels themselves, on a small random matrix, once per process.
    """
    if not _fbgemm_fp16_available():
        return False
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(64, 256, generator=generator)
    x = torch.randn(16, 256, generator=generator) * 3
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fbgemm's fp16 GEMM is "deprecated"
        packed = torch.ops._quantized.wrapped_fbgemm_pack_gemm_matrix_fp16(weight)

        def product(rows: torch.Tensor) -> torch.Tensor:
            return torch.ops._quantized.wrapped_fbgemm_linear_fp16_weight(rows, packed, None, 64)

        one_by_one = torch.cat([product(x[i : i + 1]) for i in range(len(x))])
        return all(torch.equal(product(x[:m]), one_by_one[:m]) for m in range(2, len(x) + 1))


# The largest activation integer of the int8 path: 7-bit activations (see PackedLinear._build).
_INT8_ACTIVATION_PEAK = 63


class PackedLinear(nn.Module):
    """A Linear whose weight lives in a packed low-precision form; forward = x Wᵀ + b in fp32.

    ``weight`` is kept as a meta tensor of the original shape, so code that asks a layer for its
    width (``lm_head.weight.shape``) still gets the right answer, and code that tries to compute
    with it fails loudly.
    """

    w: torch.Tensor
    pin: torch.Tensor

    def __init__(self, linear: nn.Linear, mode: str, rows: int | None = None) -> None:
        weight = linear.weight.detach()
        bias = linear.bias.detach() if linear.bias is not None else None
        if rows is not None:
            weight, bias = weight[:rows], (bias[:rows] if bias is not None else None)
        self.__init_from(weight, bias, mode)

    @classmethod
    def from_tensors(cls, weight: torch.Tensor, bias: torch.Tensor | None, mode: str) -> PackedLinear:
        layer = cls.__new__(cls)
        layer.__init_from(weight, bias, mode)
        return layer

    def __init_from(self, weight: torch.Tensor, bias: torch.Tensor | None, mode: str) -> None:
        super().__init__()
        weight = weight.float().contiguous()
        self.mode = mode
        self.in_features = weight.shape[1]
        self.out_features = weight.shape[0]
        self.bias = nn.Parameter(bias.float().clone(), requires_grad=False) if bias is not None else None
        self._forward: Callable[[torch.Tensor], torch.Tensor] = self._build(weight, mode)

    @property
    def weight(self) -> torch.Tensor:  # type: ignore[override]
        return torch.empty(self.out_features, self.in_features, device="meta")

    def _build(self, weight: torch.Tensor, mode: str) -> Callable[[torch.Tensor], torch.Tensor]:
        n = self.out_features
        if mode == "fp32":
            self.register_buffer("w", weight, persistent=False)
            return lambda x: torch.nn.functional.linear(x, self.w)
        if mode == "fp16":
            if not _fbgemm_fp16_available():
                raise InvalidSettingError("this torch build has no fbgemm fp16 kernels: use --cpu-path none.")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self._packed = torch.ops._quantized.wrapped_fbgemm_pack_gemm_matrix_fp16(weight)
            return lambda x: torch.ops._quantized.wrapped_fbgemm_linear_fp16_weight(x, self._packed, None, n)
        if mode == "int8":
            scale = weight.abs().amax(dim=1).clamp(min=1e-12) / 127.0
            q = torch.round(weight / scale[:, None]).clamp(-127, 127).to(torch.int8)
            zero = torch.zeros_like(scale, dtype=torch.long)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # quantized tensors are "deprecated"; fbgemm needs one
                qweight = torch._make_per_channel_quantized_tensor(q, scale.double(), zero, 0)
                self._packed = torch.ops.quantized.linear_prepack(qweight, None)
            # fbgemm picks the activation scale from the batch's range; one extra row spanning
            # [-64, 63] pins it to exactly 1 (zero point 64, in fbgemm's reduced 7-bit range), so
            # the integers we pass go through unchanged and each row keeps its own scale. Seven
            # bits, not eight: without VNNI (AVX2, plain AVX-512) fbgemm multiplies with
            # vpmaddubsw, whose 16-bit pair sums saturate for 8-bit activations and so corrupt
            # the logits on exactly the laptops this fallback serves.
            pin = torch.zeros(1, weight.shape[1])
            pin[0, 0], pin[0, 1] = -float(_INT8_ACTIVATION_PEAK + 1), float(_INT8_ACTIVATION_PEAK)
            self.register_buffer("pin", pin, persistent=False)
            return self._int8_rows
        if mode == "dyn8":
            # skip_init: a random initialisation of a layer about to be overwritten costs seconds.
            lin = torch.nn.utils.skip_init(nn.Linear, weight.shape[1], n, bias=False)
            lin.weight = nn.Parameter(weight, requires_grad=False)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self._dyn = torch.ao.nn.quantized.dynamic.Linear.from_float(_with_qconfig(lin))
            return self._dyn
        raise InvalidSettingError(f"unknown CPU kernel mode {mode!r}.")

    def _int8_rows(self, x: torch.Tensor) -> torch.Tensor:
        """Per-row dynamic int8 on fbgemm: one activation scale per row, exact int32 accumulation."""
        x_scale = x.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / _INT8_ACTIVATION_PEAK
        integers = torch.cat([torch.round(x / x_scale), self.pin])
        return torch.ops.quantized.linear_dynamic(integers, self._packed, True)[:-1] * x_scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        out = self._forward(x.reshape(-1, shape[-1]).float().contiguous())
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, mode={self.mode}"


def _with_qconfig(linear: nn.Linear) -> nn.Linear:
    linear.qconfig = torch.ao.quantization.default_dynamic_qconfig  # type: ignore[assignment]
    return linear


# ------------------------------------------------------------------------------------------ fusion
FUSED_GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
"""Sibling projections that read the same input (Llama, Qwen2, Mistral …): one GEMM each group."""


class _Shared:
    """The fused GEMM's input and its split outputs, handed from the first sibling to the rest."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names
        self.input: torch.Tensor | None = None
        self.outputs: tuple[torch.Tensor, ...] = ()


class FusedFirst(nn.Module):
    """Stands in for the first projection of a group: runs the one GEMM for all of them."""

    def __init__(self, packed: PackedLinear, widths: list[int], shared: _Shared, in_features: int) -> None:
        super().__init__()
        self.packed = packed
        self.widths = widths
        self.shared = shared
        self.in_features = in_features
        self.out_features = widths[0]

    @property
    def weight(self) -> torch.Tensor:
        return torch.empty(self.out_features, self.in_features, device="meta")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outputs = self.packed(x).split(self.widths, dim=-1)
        self.shared.input, self.shared.outputs = x, outputs
        return outputs[0]


class FusedRest(nn.Module):
    """Stands in for a later projection of a group: returns its slice of the fused output."""

    def __init__(self, index: int, shared: _Shared, in_features: int, out_features: int) -> None:
        super().__init__()
        self.index = index
        self.shared = shared
        self.in_features = in_features
        self.out_features = out_features

    @property
    def weight(self) -> torch.Tensor:
        return torch.empty(self.out_features, self.in_features, device="meta")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shared = self.shared
        if x is not shared.input:
            raise RuntimeError(
                f"fused {'/'.join(shared.names)} called out of order: the model's forward changed"
            )
        out = shared.outputs[self.index]
        if self.index == len(shared.outputs) - 1:
            shared.input, shared.outputs = None, ()
        return out


def _fuse_groups(module: nn.Module, mode: str) -> bool:
    """Fuse every complete group of sibling Linears in ``module``; True if any was fused."""
    fused = False
    for names in FUSED_GROUPS:
        layers = [getattr(module, name, None) for name in names]
        if not all(isinstance(layer, nn.Linear) for layer in layers):
            continue
        linears: list[nn.Linear] = layers  # type: ignore[assignment]
        if len({layer.in_features for layer in linears}) != 1:
            continue
        weight = torch.cat([layer.weight.detach() for layer in linears])
        biases = [layer.bias for layer in linears]
        bias = None
        if any(b is not None for b in biases):
            bias = torch.cat(
                [
                    b.detach() if b is not None else torch.zeros(layer.out_features)
                    for b, layer in zip(biases, linears, strict=True)
                ]
            )
        shared = _Shared(names)
        widths = [layer.out_features for layer in linears]
        in_features = linears[0].in_features
        setattr(
            module,
            names[0],
            FusedFirst(PackedLinear.from_tensors(weight, bias, mode), widths, shared, in_features),
        )
        for index, name in enumerate(names[1:], start=1):
            setattr(module, name, FusedRest(index, shared, in_features, widths[index]))
        fused = True
    return fused


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
        _in_parallel(lambda module: _fuse_groups(module, mode), list(model.modules()), between_jobs)
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
