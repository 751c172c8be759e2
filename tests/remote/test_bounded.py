"""What a server sends is read within bounds (specchat/remote/bounded.py and chunks.py)."""

from __future__ import annotations

import json
import math
import time
import tracemalloc
import zlib
from collections.abc import Iterator

import pytest

from specchat.remote.bounded import (
    INFLATE_STEP,
    MAX_JSON_DEPTH,
    Breach,
    inflated,
    lines,
    loads,
    nested_too_deep,
)
from specchat.remote.chunks import drop_bad_figures, parse_sse_line
from specchat.remote.server_errors import ServerError

MiB = 1 << 20


def squeezed(size: int, wbits: int = 16 + zlib.MAX_WBITS) -> bytes:
    squeeze = zlib.compressobj(9, zlib.DEFLATED, wbits)
    return b"".join([*(squeeze.compress(bytes(MiB)) for _ in range(size // MiB)), squeeze.flush()])


def pieces(data: bytes, size: int = 64 * 1024) -> Iterator[bytes]:
    for at in range(0, len(data), size):
        yield data[at : at + size]


def test_a_gzip_bomb_stops_at_its_cap_without_inflating_the_rest() -> None:
    bomb = squeezed(256 * MiB)  # 256 KB on the wire
    seen = 0
    tracemalloc.start()
    with pytest.raises(Breach, match="more than 1 MiB"):
        for piece in inflated(pieces(bomb), "gzip", MiB, "a body"):
            assert len(piece) <= INFLATE_STEP
            seen += len(piece)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert seen <= MiB
    assert peak < 4 * MiB, f"inflating held {peak / MiB:.0f} MiB"


@pytest.mark.parametrize(
    ("encoding", "wbits"),
    [
        ("gzip", 16 + zlib.MAX_WBITS),
        ("x-gzip", 16 + zlib.MAX_WBITS),
        ("deflate", zlib.MAX_WBITS),
        ("deflate", -15),
    ],
)
def test_each_asked_for_encoding_reads_back_exactly(encoding: str, wbits: int) -> None:
    text = json.dumps({"data": [{"id": "model-" + str(i)} for i in range(2000)]}).encode()
    squeeze = zlib.compressobj(6, zlib.DEFLATED, wbits)
    body = squeeze.compress(text) + squeeze.flush()
    assert b"".join(inflated(pieces(body, 7), encoding, len(text), "a body")) == text


def test_an_encoding_not_asked_for_is_refused_and_plain_bodies_are_capped_too() -> None:
    with pytest.raises(Breach, match="'br', which specchat did not ask for"):
        list(inflated([b"x"], "br", MiB, "a body"))
    with pytest.raises(Breach, match="stacked 3 encodings"):
        list(inflated([b"x"], "gzip, gzip, gzip", MiB, "a body"))
    with pytest.raises(Breach, match="more than 1 KiB"):
        list(inflated(pieces(b"a" * 5000, 100), None, 1024, "a body"))
    with pytest.raises(Breach, match="does not inflate"):
        list(inflated([b"not gzip at all"], "gzip", MiB, "a body"))


def test_lines_end_at_cr_lf_or_crlf_and_the_last_needs_no_break() -> None:
    got = list(lines([b"data: 1\r\ndata: 2\n", b"da", b"ta: 3\rdata: 4"]))
    assert got == ["data: 1", "data: 2", "data: 3", "data: 4"]


def test_a_line_past_its_cap_is_refused_before_it_is_held_whole() -> None:
    def endless() -> Iterator[bytes]:
        yield b"data: "
        for _ in range(10_000):  # 640 MB, were it read
            yield b"a" * 65536

    with pytest.raises(Breach, match="line of more than 1 MiB without a line break"):
        for _ in lines(endless()):
            pass


def test_a_line_a_byte_at_a_time_costs_linear_time() -> None:
    started = time.monotonic()
    got = list(lines(iter([b"a"] * 500_000 + [b"\n"])))
    assert got == ["a" * 500_000]
    assert time.monotonic() - started < 5


def test_json_depth_is_checked_before_python_recurses() -> None:
    deep = "[" * 100_000 + "]" * 100_000
    assert nested_too_deep(deep)
    with pytest.raises(Breach, match=f"nested more than {MAX_JSON_DEPTH} deep"):
        loads(deep, "a chunk")
    fine = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    assert not nested_too_deep(fine)
    assert not nested_too_deep(json.dumps({"text": "[" * 1000}))  # brackets inside a string
    started = time.monotonic()
    nested_too_deep('"' + "\\x" * 200_000 + "[" * 100)  # an unclosed string: scanned once, no backtracking
    assert time.monotonic() - started < 2


def test_a_deep_chunk_is_one_line_not_a_recursion_error() -> None:
    with pytest.raises(ServerError, match="nested more than 32 deep"):
        parse_sse_line("data: " + "[" * 100_000 + "]" * 100_000, "http://x")


@pytest.mark.parametrize(
    ("section", "name", "value", "problem"),
    [
        ("usage", "completion_tokens", math.nan, "a non-finite"),
        ("usage", "prompt_tokens", math.inf, "a non-finite"),
        ("usage", "total_tokens", 1e30, "an out-of-range"),
        ("usage", "total_tokens", 10**30, "an out-of-range"),
        ("timings", "predicted_n", -1, "an out-of-range"),
        ("timings", "draft_n", 2.5, "a fractional"),
        ("timings", "predicted_ms", -math.inf, "a non-finite"),
        ("timings", "prompt_ms", 1e300, "an out-of-range"),
    ],
)
def test_a_figure_that_is_not_a_sane_number_is_dropped_with_a_notice(
    section: str, name: str, value: float, problem: str
) -> None:
    sane = next(other for other in ("cache_n", "prompt_tokens", "completion_tokens") if other != name)
    data = {section: {name: value, sane: 7}}
    assert drop_bad_figures(data) == [f"the server reported {problem} {section}.{name}: not used"]
    assert name not in data[section]
    assert len(data[section]) == 1  # the sane figure stays


def test_sane_figures_stay_and_whole_floats_become_counts() -> None:
    data = {"usage": {"completion_tokens": 5.0}, "timings": {"predicted_ms": 12.5, "predicted_n": 3}}
    assert drop_bad_figures(data) == []
    assert data == {"usage": {"completion_tokens": 5}, "timings": {"predicted_ms": 12.5, "predicted_n": 3}}
    assert isinstance(data["usage"]["completion_tokens"], int)


def test_python_reads_nan_in_a_chunk_so_the_checks_must_see_it() -> None:
    chunk = parse_sse_line('data: {"choices": [], "usage": {"completion_tokens": NaN}}', "http://x")
    assert math.isnan(chunk["usage"]["completion_tokens"])
    assert drop_bad_figures(chunk) and "completion_tokens" not in chunk["usage"]


def test_vllm_counters_leave_out_what_is_not_a_sane_position_or_count() -> None:
    from specchat.remote.probe import parse_vllm_counters

    per_pos = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
    text = "\n".join(
        [
            "vllm:spec_decode_num_drafts_total 10.0",
            f'{per_pos}{{position="{"9" * 5000}"}} 3.0',  # int() refuses 4,300 digits
            f'{per_pos}{{position="999999999"}} 3.0',  # a tuple that long
            f'{per_pos}{{position="abc"}} 3.0',
            f'{per_pos}{{position="0"}} NaN',
            f'{per_pos}{{position="1"}} 2',
        ]
    )
    counters = parse_vllm_counters(text + "\n")
    assert counters is not None and counters.per_position == (0.0, 2.0) and counters.drafts == 10.0
