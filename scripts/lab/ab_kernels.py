"""Interleaved A/B of two builds of the CPU kernels, in one process: the real target, or one matrix per kind.

    python scripts/lab/ab_kernels.py REPS A=SOURCE.cpp:PACKED_FOLDER[:huge][@ISA] B=... [--widths 1,4]
    python scripts/lab/ab_kernels.py REPS A=SOURCE.cpp[@ISA] B=SOURCE.cpp[@ISA] --kinds [--widths 1,4,8]

Each SOURCE is built as its own extension (a variant of specchat/kernels/qgemm.cpp, with the
core/ and isa/ headers beside it; its Python classes are made module-local so that two builds
load side by side) for the instruction set ISA names (a variant of specchat.kernels: avx512,
avxvnni-evex, avx2, ...; default avx512, or --isa).

With PACKED_FOLDERs, each build runs the packed target in its folder (written in the layout that
source reads). ``:huge`` copies that folder's weights into anonymous memory advised to use
transparent huge pages instead of memory-mapping the file. Both models prefill the same 100
tokens, then the script alternates single target passes of each width (1: a plain step; more: a
verify pass), A then B, then B then A, REPS times, and prints each median and minimum in ms with
the ratio B/A, and each build's cost of a width against its own width 1 (v(w)).

With --kinds, each build multiplies random matrices of the default target's widest shape
(8960 × 1536) in each packed kind, q4, q5, q6 and q8, by rows of each width, cycling through
enough copies that none stays in cache (as decoding streams its weights): where a pass's time
goes, kind by kind. Alternating pass by pass in one process is what makes a 5% difference
visible on a VM whose memory bandwidth moves by more than that from one minute to the next.

Threads: SPECCHAT_THREADS (default 2). With one thread, each pass is timed by the CPU time of
the thread that runs it (ATen runs one-thread work on the caller), which other work on a shared
machine cannot stretch; with more, by the wall clock, which a third busy process on two cores
stretches many times over (threads wait for each other at every matrix).
"""

from __future__ import annotations

import argparse
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
from specchat.kernels import VARIANTS, link_flags
from specchat.kernels.formats import KIND_CODES, Unpacked, pack
from specchat.kernels.native import PackedModel

PREFILL = 100
KINDS = ("q4", "q5", "q6", "q8")
SHAPE = (8960, 1536)
"""The default target's gate and up matrices: the widest it streams per layer."""
COLD_BYTES = 96 << 20
"""Copies of a kind's matrix add up to at least this, three times this VM's L3 cache."""


@dataclass
class Variant:
    name: str
    source: Path
    folder: Path | None
    huge: bool
    isa: str = "avx512"
    model: Any = None
    cache: Any = None
    module: Any = None
    times: dict[Any, list[float]] = field(default_factory=dict)


def parse(spec: str, isa: str = "avx512") -> Variant:
    name, _, rest = spec.partition("=")
    rest, _, asked = rest.partition("@")
    parts = rest.split(":")
    if not name or len(parts) > 3 or (len(parts) == 3 and parts[2] != "huge"):
        raise SystemExit(f"expected NAME=SOURCE.cpp[:PACKED_FOLDER[:huge]][@ISA], got {spec!r}")
    folder = Path(parts[1]) if len(parts) > 1 else None
    return Variant(name, Path(parts[0]), folder, len(parts) == 3, asked or isa)


def isa_flags(isa: str) -> list[str]:
    """The compiler flags of specchat.kernels' variant ``isa``, less its include path (each build
    reads the headers beside its own source)."""
    chosen = next((v for v in VARIANTS if v.name == isa), None)
    if chosen is None:
        raise SystemExit(f"unknown ISA {isa!r}; one of {', '.join(v.name for v in VARIANTS)}")
    return [flag for flag in chosen.cflags if not flag.startswith("-I")]


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
        extra_cflags=isa_flags(variant.isa),
        extra_ldflags=list(link_flags()),
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

    assert variant.folder is not None
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


def clock() -> float:
    """The thread's CPU time with one thread, else the wall clock (see the module's note)."""
    return time.thread_time() if torch.get_num_threads() == 1 else time.perf_counter()


def one_pass(variant: Variant, width: int) -> None:
    ids = torch.randint(0, 1000, (1, width))
    started = clock()
    variant.model(ids, variant.cache, logits_to_keep=width)
    variant.times.setdefault(width, []).append(clock() - started)
    variant.cache.crop(PREFILL)


# ------------------------------------------------------------------------------ --kinds
def random_matrix(kind: str, seed: int) -> Unpacked:
    """A matrix of SHAPE in ``kind`` with random values over each kind's whole range."""
    rng = np.random.default_rng(seed)
    n, k = SHAPE
    d = rng.uniform(1e-4, 1e-3, (n, k // 256)).astype(np.float16)
    if kind in ("q4", "q5"):
        q = rng.integers(0, 16 if kind == "q4" else 32, (n, k), dtype=np.uint8)
        sc, mn = (rng.integers(0, 64, (n, k // 32)).astype(np.uint8) for _ in range(2))
        return Unpacked(kind, q, sc, d, 256, mn, d.copy())
    q = rng.integers(0, 64 if kind == "q6" else 256, (n, k), dtype=np.uint8)
    sc = rng.integers(-128, 128, (n, k // 16)).astype(np.int8)
    return Unpacked(kind, q, sc, d, 256, offset=32 if kind == "q6" else 128)


def kind_matrices(kind: str) -> list[dict[str, torch.Tensor]]:
    """Packed copies of a random matrix of ``kind``, enough of them to stream from memory."""
    packed = {name: torch.from_numpy(array) for name, array in pack(random_matrix(kind, 1)).items()}
    nbytes = sum(t.numel() * t.element_size() for t in packed.values())
    return [{name: t.clone() for name, t in packed.items()} for _ in range(-(-COLD_BYTES // nbytes))]


def kind_products(variant: Variant, kind: str, matrices: list[dict[str, torch.Tensor]]) -> list[Any]:
    make = qmat_with(variant.module)
    offset = {"q6": 32, "q8": 128}.get(kind, 0)
    return [make(kind, tensors, 256, offset, SHAPE[0], None) for tensors in matrices]


def time_kind(variant: Variant, kind: str, products: list[Any], width: int, x: torch.Tensor) -> None:
    started = clock()
    for product in products:
        product.forward(x)
    variant.times.setdefault((kind, width), []).append((clock() - started) / len(products))


# ------------------------------------------------------------------------------ report
def report(a: Variant, b: Variant, keys: list[Any], label: Any) -> None:
    for key in keys:
        ma, mb = (statistics.median(v.times[key]) * 1e3 for v in (a, b))
        lo_a, lo_b = (min(v.times[key]) * 1e3 for v in (a, b))
        print(
            f"{label(key)}: {a.name} {ma:.2f} ms (min {lo_a:.2f})  {b.name} {mb:.2f} ms (min {lo_b:.2f})  "
            f"{b.name}/{a.name} {mb / ma:.3f}"
        )


def cost_curve(v: Variant, widths: list[int], key: Any) -> str:
    """v(w): the median pass of each width against the first width's."""
    one = statistics.median(v.times[key(widths[0])])
    return "  ".join(f"v({w}) {statistics.median(v.times[key(w)]) / one:.2f}" for w in widths[1:])


def widths_of(text: str) -> list[int]:
    return [int(w) for w in text.split(",")]


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reps", type=int)
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("--widths", type=widths_of, default=None, help="pass widths, e.g. 1,4,8")
    parser.add_argument("--isa", default="avx512", help="the variant builds are compiled as, unless @ISA")
    parser.add_argument("--kinds", action="store_true", help="time one matrix per packed kind, not the model")
    args = parser.parse_args(argv)
    a, b = parse(args.a, args.isa), parse(args.b, args.isa)
    widths = args.widths or ([1, 4, 8] if args.kinds else [1, 4])
    torch.set_num_threads(int(os.environ.get("SPECCHAT_THREADS", "2")))
    keep: list[Any] = []
    with tempfile.TemporaryDirectory() as workdir:
        if args.kinds:
            for variant in (a, b):
                variant.module = build(variant, Path(workdir))
            matrices = {kind: kind_matrices(kind) for kind in KINDS}
            products = {(v.name, k): kind_products(v, k, matrices[k]) for v in (a, b) for k in KINDS}
            inputs = {w: torch.randn(w, SHAPE[1], generator=torch.Generator().manual_seed(w)) for w in widths}
        else:
            for variant in (a, b):
                load(variant, Path(workdir), keep)
        what = "thread CPU time" if torch.get_num_threads() == 1 else "wall time"
        print(f"threads {torch.get_num_threads()} ({what}), load before {os.getloadavg()}", flush=True)
        for rep in range(args.reps):
            for width in widths:
                for variant in (a, b) if rep % 2 == 0 else (b, a):
                    if args.kinds:
                        for kind in KINDS:
                            time_kind(variant, kind, products[(variant.name, kind)], width, inputs[width])
                    else:
                        one_pass(variant, width)
    print(f"load after {os.getloadavg()}")
    if args.kinds:
        keys: list[Any] = [(kind, w) for kind in KINDS for w in widths]
        report(a, b, keys, lambda key: f"{key[0]} width {key[1]}")
        for v in (a, b):
            for kind in KINDS:
                print(f"{v.name} {kind}: {cost_curve(v, widths, lambda w, k=kind: (k, w))}")
    else:
        report(a, b, widths, lambda w: f"width {w}")
        for v in (a, b):
            print(f"{v.name}: {cost_curve(v, widths, lambda w: w)}")


if __name__ == "__main__":
    main(sys.argv[1:])
