"""One Linear layer on the CPU in fewer bytes: fbgemm fp16, per-row int8, or fbgemm's dynamic int8.

Why these modes and which are row-exact: :mod:`specchat.models.compute.cpu_quant`.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable

import torch
from torch import nn

from specchat.errors import InvalidSettingError

# fbgemm's fp16 GEMM and quantized tensors carry deprecation notices in torch 2.13; they are still
# the fastest CPU kernels here (see the module doc). Say so once, not on every forward.
warnings.filterwarnings("ignore", message=r".*fbgemm.*deprecated.*")
warnings.filterwarnings("ignore", message=r".*quantize_per_tensor, torch.quantize_per_channel.*")


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
