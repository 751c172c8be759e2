"""Interleaved A/B of two builds of the CPU kernels on the real target, in one process.

    python scripts/lab/ab_kernels.py REPS A=SOURCE.cpp:PACKED_FOLDER[:huge] B=SOURCE.cpp:PACKED_FOLDER[:huge]

Each SOURCE is built as its own extension (a variant of specchat/kernels/qgemm.cpp; its Python
classes are made module-local so that two builds load side by side) and runs the packed target
in PACKED_FOLDER (a folder of the packed cache, written in the layout that source reads).
``:huge`` copies that folder's weights into anonymous memory advised to use transparent huge
pages instead of memory-mapping the file. Both models prefill the same 100 tokens, then the
script alternates single target passes of width 1 (a plain step) and 4 (a verify pass), A then
B, then B then A, REPS times, and prints each median and minimum in ms with the ratio B/A.
Alternating pass by pass in one process is what makes a 5% difference visible on a VM whose
memory bandwidth moves by more than that from one minute to the next.
"""

from __future__ import annotations

import json
import mmap
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch

import specchat.kernels.native as native
from specchat.kernels import FLAGS
from specchat.kernels.native import PackedModel
from specchat.kernels.qlinear import KIND_CODES

WIDTHS = (1, 4)
PREFILL = 100


@dataclass
class Variant:
    name: str
    source: Path
    folder: Path
    huge: bool
    model: Any = None
    cache: Any = None
    times: dict[int, list[float]] = field(default_factory=lambda: {w: [] for w in WIDTHS})


def parse(spec: str) -> Variant:
    name, _, rest = spec.partition("=")
    parts = rest.split(":")
    if not name or len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] != "huge"):
        raise SystemExit(f"expected NAME=SOURCE.cpp:PACKED_FOLDER[:huge], got {spec!r}")
    return Variant(name, Path(parts[0]), Path(parts[1]), len(parts) == 3)


def build(variant: Variant, workdir: Path) -> ModuleType:
    from torch.utils import cpp_extension

    text = variant.source.read_text()
    text = re.sub(r'\(m, "(QMat|Model)"\)', r'(m, "\1", py::module_local())', text)
    source = workdir / f"ab_{variant.name}.cpp"
    source.write_text(text)
    folder = workdir / f"build_{variant.name}"
    folder.mkdir(exist_ok=True)
    return cpp_extension.load(
        name=f"ab_{variant.name}",
        sources=[str(source)],
        extra_cflags=FLAGS,
        extra_ldflags=["-fopenmp"],
        extra_include_paths=[str(variant.source.resolve().parent)],  # the source's core/ and isa/ headers
        build_directory=str(folder),
    )


def read_packed(folder: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    from safetensors import safe_open

    with safe_open(str(folder / "weights.safetensors"), framework="pt") as handle:
        meta = json.loads(handle.metadata()["specchat"])
        return meta, {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118


def on_huge_pages(tensors: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], mmap.mmap]:
    """The same tensors copied into one anonymous mapping with MADV_HUGEPAGE (2 MiB aligned)."""
    sizes = {k: -(-t.numel() * t.element_size() // 4096) * 4096 for k, t in tensors.items()}
    buffer = mmap.mmap(-1, sum(sizes.values()) + (2 << 20), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    buffer.madvise(mmap.MADV_HUGEPAGE)
    raw = np.frombuffer(buffer, dtype=np.uint8)
    offset = -raw.ctypes.data % (2 << 20)
    copies = {}
    for key, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        view = torch.from_numpy(raw[offset : offset + nbytes]).view(tensor.dtype).reshape(tensor.shape)
        view.copy_(tensor)
        copies[key], offset = view, offset + sizes[key]
    return copies, buffer


def qmat_with(module: ModuleType) -> Any:
    """qlinear.qmat_from_tensors for a build whose QMat may or may not take a last extra tensor."""

    def make(
        kind: str, tensors: dict[str, torch.Tensor], super_block: int, offset: int, rows: int, bias: Any
    ) -> Any:
        padded = None
        if bias is not None:
            padded = torch.zeros(tensors["q"].shape[0] * 16, dtype=torch.float32)
            padded[:rows] = bias.float()
        extra = [tensors["qh"]] if "qh" in tensors else []
        none = torch.empty(0, dtype=torch.uint8)
        return module.QMat(
            KIND_CODES[kind], tensors["q"], tensors.get("sc", none), tensors.get("mn"),
            tensors.get("d", none), tensors.get("dm"), super_block, offset, rows, padded, *extra,
        )  # fmt: skip

    return make


def load(variant: Variant, workdir: Path, keep: list[Any]) -> None:
    from transformers import AutoConfig

    module = build(variant, workdir)
    meta, tensors = read_packed(variant.folder)
    if variant.huge:
        tensors, buffer = on_huge_pages(tensors)
        keep.append(buffer)

    def load_built(report: Callable[[str], None] | None = None) -> ModuleType:
        return module

    native.load = load_built
    native.qmat_from_tensors = qmat_with(module)
    packed = PackedModel.from_meta(meta, tensors)

    def matrix_tensors(name: str) -> dict[str, torch.Tensor]:
        fields = ("q", "qh", "sc", "mn", "d", "dm")
        return {f: t for f in fields if (t := tensors.get(f"{name}.{f}")) is not None}

    packed.matrix_tensors = matrix_tensors  # type: ignore[method-assign]  # a layout may add arrays
    variant.model = native.native_model(packed, AutoConfig.from_pretrained(str(variant.folder)))
    variant.cache = variant.model.new_cache()
    prompt = torch.randint(0, 1000, (1, PREFILL), generator=torch.Generator().manual_seed(0))
    variant.model(prompt, variant.cache, logits_to_keep=1)


def one_pass(variant: Variant, width: int) -> None:
    ids = torch.randint(0, 1000, (1, width))
    started = time.perf_counter()
    variant.model(ids, variant.cache, logits_to_keep=width)
    variant.times[width].append(time.perf_counter() - started)
    variant.cache.crop(PREFILL)


def main(argv: list[str]) -> None:
    if len(argv) != 3:
        raise SystemExit(__doc__)
    reps, a, b = int(argv[0]), parse(argv[1]), parse(argv[2])
    torch.set_num_threads(int(os.environ.get("SPECCHAT_THREADS", "2")))
    keep: list[Any] = []
    with tempfile.TemporaryDirectory() as workdir:
        for variant in (a, b):
            load(variant, Path(workdir), keep)
        print(f"threads {torch.get_num_threads()}, load before {os.getloadavg()}", flush=True)
        for rep in range(reps):
            for width in WIDTHS:
                for variant in (a, b) if rep % 2 == 0 else (b, a):
                    one_pass(variant, width)
    print(f"load after {os.getloadavg()}")
    for width in WIDTHS:
        ma, mb = (statistics.median(v.times[width]) * 1e3 for v in (a, b))
        lo_a, lo_b = (min(v.times[width]) * 1e3 for v in (a, b))
        print(
            f"width {width}: {a.name} {ma:.2f} ms (min {lo_a:.2f})  {b.name} {mb:.2f} ms (min {lo_b:.2f})  "
            f"{b.name}/{a.name} {mb / ma:.3f}"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
