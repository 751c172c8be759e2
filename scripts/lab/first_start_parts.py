"""The parts of a GGUF's first start, timed apart (docs/lab/2026-12-05-big-targets.md).

    python scripts/lab/first_start_parts.py FILE.gguf {null,file,memory,companions}

- null: native packing, every array dropped (the repacking alone, and reading the map);
- file: native packing written into a packed safetensors file, as the cache writes it;
- memory: native packing kept whole in memory, and the C++ model over it (packing at load);
- companions: transformers reading the config and tokenizer from the file's metadata.

One part per process, so the peak resident memory printed (getrusage) is that part's. Run it
under the benchmark lock.
"""

from __future__ import annotations

import json
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

from specchat.kernels import load
from specchat.models.compute.packed import _gguf_companions
from specchat.models.compute.packed_stream import HEADER_ROOM, StreamedSafetensors
from specchat.models.compute.packing import pack_gguf
from specchat.models.gguf.check import read_gguf


class Dropped:
    def write_rows(self, name: str, rows: object, first: int, total: int) -> None:
        pass


def main(gguf: Path, part: str) -> None:
    load()
    source = read_gguf(gguf)
    started = time.monotonic()
    if part == "null":
        pack_gguf(str(gguf), sink=Dropped(), source=source)
    elif part == "file":
        folder = Path(tempfile.mkdtemp(dir=gguf.parent))
        try:
            with StreamedSafetensors(folder / "weights.safetensors", HEADER_ROOM) as weights:
                packed = pack_gguf(str(gguf), sink=weights, source=source)
                for key, tensor in packed.tensors.items():
                    weights.add(key, tensor.contiguous().numpy())
                weights.close({"specchat": json.dumps(packed.meta())})
        finally:
            took = time.monotonic() - started
            shutil.rmtree(folder)
    elif part == "memory":
        from specchat.kernels.native import native_model

        native_model(pack_gguf(str(gguf), source=source), None)
    elif part == "companions":
        _gguf_companions(gguf)
    else:
        raise SystemExit(f"unknown part {part!r}: null, file, memory or companions")
    if part != "file":
        took = time.monotonic() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(f"{part}: {took:.2f} s, peak resident {peak / 1e9:.2f} GB", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
