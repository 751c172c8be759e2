"""A reply from a server is held to what was asked, whatever the server does: its tokens, its
text, its time and its figures (specchat/remote/reply_stream.py), and its start-up probe has a
deadline. Against the misbehaving server of tests/corpus/hostile_server.py, in this process."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner

from specchat.cli import main
from specchat.engine.backend import Controls
from specchat.engine.events import Event, NoticeEvent, RoundEvent, SummaryEvent, TokenEvent
from specchat.engine.reasoning import answer_text, reasoning_text
from specchat.remote import ServerError, connect
from tests.corpus.hostile_server import (
    HostileServer,
    chunk,
    dribbled_models,
    echo_key,
    end_chunked,
    endless_tokens,
    keepalive,
    models,
    redirect,
    reply,
    start_chunked,
    stream,
    write_chunk,
)

MESSAGES = [{"role": "user", "content": "hi"}]
MODELS, CHAT = "GET /v1/models", "POST /v1/chat/completions"


@pytest.fixture
def server() -> Iterator[HostileServer]:
    with HostileServer() as running:
        yield running


def serve(server: HostileServer, chat: Any, owner: str = "someone") -> str:
    server.routes["case"] = {MODELS: models(owner=owner), CHAT: chat}
    return server.url("case")


def events_of(url: str, controls: Controls, timeout: float = 60.0) -> list[Event]:
    return list(connect(url, timeout=timeout).stream_chat(MESSAGES, controls))


def tokens(events: list[Event]) -> list[TokenEvent]:
    return [e for e in events if isinstance(e, TokenEvent)]


def notices(events: list[Event]) -> list[NoticeEvent]:
    return [e for e in events if isinstance(e, NoticeEvent)]


def summary_of(events: list[Event]) -> SummaryEvent:
    assert isinstance(events[-1], SummaryEvent)
    return events[-1]


# ------------------------------------------------------------------ tokens


def test_a_server_that_ignores_max_tokens_is_read_no_further(server: HostileServer) -> None:
    events = events_of(serve(server, endless_tokens()), Controls(max_new_tokens=5))
    assert "".join(t.text for t in tokens(events)) == " word" * 5
    [notice] = notices(events)
    assert notice.kind == "overrun" and "went on past max_tokens (5)" in notice.text
    summary = summary_of(events)
    assert summary.stop == "max_tokens" and summary.tokens == 5
    assert summary.notes == (notice.text,)


def test_a_token_count_that_jumps_by_a_billion_makes_no_more_events_than_asked(
    server: HostileServer,
) -> None:
    timings = {"prompt_n": 3, "prompt_ms": 5.0, "predicted_ms": 10.0}
    jump = stream(
        [
            chunk("a", timings={**timings, "predicted_n": 1}),
            chunk(
                "b", timings={**timings, "predicted_n": 10**9, "draft_n": 10**9, "draft_n_accepted": 10**9}
            ),
            chunk(finish="stop"),
        ]
    )
    started = time.monotonic()
    events = events_of(serve(server, jump, owner="llamacpp"), Controls(max_new_tokens=5))
    assert time.monotonic() - started < 10
    assert len(tokens(events)) == 5
    assert all(e.drafted <= 256 for e in events if isinstance(e, RoundEvent))
    assert summary_of(events).stop == "max_tokens"


def test_text_beyond_what_the_tokens_can_hold_cuts_the_reply_keeping_what_arrived(
    server: HostileServer,
) -> None:
    url = serve(server, reply(["fine", "x" * 100_000]))
    got: list[Event] = []
    with pytest.raises(ServerError, match="more text than 4 tokens can hold"):
        for event in connect(url).stream_chat(MESSAGES, Controls(max_new_tokens=4)):
            got.append(event)
    assert "".join(t.text for t in tokens(got)) == "fine"


# ------------------------------------------------------------------ time


def test_no_token_within_the_timeout_is_a_stall_whatever_else_arrives(server: HostileServer) -> None:
    url = serve(server, keepalive(["Hi"], b": ping\n\n", 0.1))
    cancel = threading.Event()
    got: list[Event] = []
    started = time.monotonic()
    for event in connect(url, timeout=1.0).stream_chat(MESSAGES, Controls(), cancel):
        got.append(event)
        if isinstance(event, NoticeEvent):
            cancel.set()  # what the chat's Esc does
    assert 1.0 <= time.monotonic() - started < 10
    [stall] = notices(got)
    assert stall.kind == "stall" and "has sent no new token for 1 s" in stall.text
    assert "".join(t.text for t in tokens(got)) == "Hi"
    assert summary_of(got).stop == "cancelled"


def test_a_stall_that_ends_is_said_once_and_the_reply_goes_on(server: HostileServer) -> None:
    def slow(h: Any) -> None:
        start_chunked(h, "text/event-stream")
        write_chunk(h, f"data: {chunk('Hi')}\n\n".encode())
        for _ in range(15):
            write_chunk(h, b": ping\n\n")
            time.sleep(0.1)
        write_chunk(h, f"data: {chunk(' there', 'stop')}\n\ndata: [DONE]\n\n".encode())
        end_chunked(h)

    events = events_of(serve(server, slow), Controls(), timeout=1.0)
    assert [n.kind for n in notices(events)] == ["stall"]
    assert "".join(t.text for t in tokens(events)) == "Hi there"
    assert summary_of(events).stop == "eos"


def test_generate_gives_up_on_a_stall_with_one_line_keeping_what_it_printed(server: HostileServer) -> None:
    url = serve(server, keepalive(["Hi"], b"x", 0.2))
    result = CliRunner().invoke(
        main, ["generate", "hi", "--server", url], env={"SPECCHAT_SERVER_TIMEOUT": "1"}
    )
    assert result.exit_code == 2, result.output
    assert result.stdout.startswith("Hi")
    last = result.stderr.strip().splitlines()[-1]
    assert "has sent no new token for 1 s (server_timeout). Gave up; what arrived is kept." in last


def test_the_start_up_probe_has_one_deadline_however_the_server_dribbles(server: HostileServer) -> None:
    server.routes["case"] = {MODELS: dribbled_models(0.05)}
    started = time.monotonic()
    with pytest.raises(ServerError, match=r"took more than 1\.5 s to say what it is"):
        connect(server.url("case"), timeout=1.5)
    assert time.monotonic() - started < 5


# ------------------------------------------------------------------ figures


def test_non_finite_figures_are_dropped_with_a_notice_and_the_reply_stands(server: HostileServer) -> None:
    bad = {"prompt_tokens": math.nan, "completion_tokens": math.inf, "total_tokens": 1e30}
    events = events_of(serve(server, reply(["Hello"], usage=bad)), Controls())
    assert "".join(t.text for t in tokens(events)) == "Hello"
    said = [n.text for n in notices(events)]
    assert said == [
        "the server reported a non-finite usage.prompt_tokens: not used",
        "the server reported a non-finite usage.completion_tokens: not used",
        "the server reported an out-of-range usage.total_tokens: not used",
    ]
    summary = summary_of(events)
    assert summary.prompt_tokens == -1 and math.isfinite(summary.tokens_per_s)
    assert summary.notes == tuple(said)


def test_a_decode_time_no_machine_can_reach_falls_back_to_our_clock(server: HostileServer) -> None:
    timings = {"prompt_n": 3, "prompt_ms": 5.0, "predicted_n": 2, "predicted_ms": 1e-9}
    chat = stream([chunk("a", timings={**timings, "predicted_n": 1}), chunk("b", "stop", timings=timings)])
    events = events_of(serve(server, chat, owner="llamacpp"), Controls())
    assert [n.text for n in notices(events)] == [
        "the server reported an implausible timings.predicted_ms: not used"
    ]
    assert summary_of(events).tokens_per_s < 1e6


# ------------------------------------------------------------------ reasoning tags


@pytest.mark.parametrize(
    ("pieces", "reasoning", "answer"),
    [
        (["<th", "ink>", "hmm", "</th", "ink>", "\n\n", "Answer"], "<think>hmm</think>\n\n", "Answer"),
        (
            ["<think>", "<think>", "x", "</think>", "</think>", "Answer"],
            "<think><think>x</think></think>",
            "Answer",
        ),
        (["Hello", "</think>", " world"], "</think>", "Hello world"),
        (["<think>a</think>Answer"], "<think>a</think>", "Answer"),
    ],
    ids=["split", "repeated", "stray", "one chunk"],
)
def test_reasoning_tags_leave_no_fragment_in_the_answer(
    server: HostileServer, pieces: list[str], reasoning: str, answer: str
) -> None:
    events = events_of(serve(server, reply(pieces)), Controls())
    assert answer_text(tokens(events)) == answer
    assert reasoning_text(tokens(events)) == reasoning


# ------------------------------------------------------------------ redirects and keys


def test_a_redirect_is_named_as_one_and_not_followed(server: HostileServer) -> None:
    elsewhere = server.url("elsewhere")
    server.routes["case"] = {MODELS: redirect(elsewhere + "/v1/models")}
    server.routes["elsewhere"] = {MODELS: models()}
    result = CliRunner().invoke(
        main, ["generate", "hi", "--server", server.url("case")], env={"SPECCHAT_API_KEY": "sk-redirected-1"}
    )
    assert result.exit_code == 2
    last = result.stderr.strip().splitlines()[-1]
    assert f"redirected /v1/models to {elsewhere}/v1/models (307)" in last and "follows no redirect" in last
    assert len(server.requests) == 1  # nothing, the key least of all, went to the other address


def test_a_short_key_is_masked_in_full(server: HostileServer) -> None:
    server.routes["case"] = {MODELS: echo_key(401)}
    result = CliRunner().invoke(
        main, ["generate", "hi", "--server", server.url("case")], env={"SPECCHAT_API_KEY": "k9"}
    )
    assert result.exit_code == 2
    assert "k9" not in result.output
    assert "bad key Bearer *** (***)" in result.stderr


def test_the_bench_gives_up_on_a_stalled_server_with_one_line(server: HostileServer) -> None:
    """Nobody watches a bench run either: a stall ends it instead of waiting forever."""
    url = serve(server, keepalive(["Hi"], b": ping\n\n", 0.1))
    args = ["bench", "--server", url, "--quick", "--categories", "code", "--max-new-tokens", "8"]
    started = time.monotonic()
    result = CliRunner().invoke(main, args, env={"SPECCHAT_SERVER_TIMEOUT": "1"})
    assert time.monotonic() - started < 30
    assert result.exit_code == 2, result.output
    assert "has sent no new token for 1 s" in result.stderr.strip().splitlines()[-1]
