"""The remote backend against a loopback server: each kind of server, and every failure."""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
import threading
import time
from typing import Any

import pytest

from specchat.engine.backend import Controls
from specchat.engine.events import RoundEvent, SummaryEvent, TokenEvent, known
from specchat.remote import ServerError, connect
from specchat.remote.client import normalize_url
from tests.remote.server import (
    FakeServer,
    Script,
    llama_script,
    openai_models,
    openai_stream,
    vllm_metrics,
    vllm_models,
    vllm_stream,
)

MESSAGES = [{"role": "user", "content": "Tell a very short story about a cat who learns to fly."}]


def run(backend, controls: Controls | None = None, cancel: threading.Event | None = None) -> list:
    return list(backend.stream_chat(MESSAGES, controls or Controls(gamma=2), cancel))


def test_llama_server_is_detected_and_streams_inferred_rounds() -> None:
    with FakeServer(llama_script()) as server:
        backend = connect(server.url)
        assert backend.info.kind == "llama-server" and backend.info.speculative is True
        events = run(backend, Controls(gamma=2, temperature=0.0, max_new_tokens=40, seed=3))
        request = server.script.requests[-1]
    assert request["timings_per_token"] is True and request["stream"] is True
    assert request["speculative.n_max"] == 2 and request["max_tokens"] == 40 and request["seed"] == 3
    assert request["messages"] == MESSAGES
    summary = events[-1]
    assert isinstance(summary, SummaryEvent) and summary.stop == "max_tokens"
    assert (summary.drafted, summary.accepted, summary.tokens) == (50, 22, 40)
    assert summary.alpha == pytest.approx(22 / 50)
    # tokens/s and prefill from the server's own clock (its last timings object).
    assert summary.prefill_ms > 0 and summary.tokens_per_s == pytest.approx(40 / summary.decode_s)
    caps = backend.capabilities
    assert caps.provenance == "inferred" and caps.source("alpha") == "measured"
    assert caps.source("tau") == "inferred" and caps.source("trace") == "unavailable"
    # We asked for γ = 2 and the server drafted 3 a round: it ignores the per-request γ.
    assert caps.gamma_control == "fixed"
    assert any("ignores the per-request speculative.n_max" in n for n in caps.notes)


def test_llama_server_gamma_stays_per_request_while_the_server_keeps_within_it() -> None:
    with FakeServer(llama_script()) as server:
        backend = connect(server.url)
        run(backend, Controls(gamma=4))
    assert backend.capabilities.gamma_control == "per-request"


def test_a_llama_server_without_a_draft_model_says_so() -> None:
    with FakeServer(llama_script("llama_hello_eos.sse", speculative=False)) as server:
        backend = connect(server.url)
    assert backend.info.speculative is False
    assert any("runs no speculative decoding" in n and "--model-draft" in n for n in backend.notes)


def test_vllm_steps_colour_tokens_and_metrics_give_per_position() -> None:
    steps = [["Once"], [" upon", " a", " time", ","], [" a", " cat"], [" named"], [" Tom", " flew", ".", ""]]
    script = Script(
        documents={
            "/v1/models": (200, "application/json", vllm_models()),
            "/metrics": (200, "text/plain", vllm_metrics(100, 300, 150, [70, 50, 30])),
        },
        stream=vllm_stream(steps),
        # This reply: 4 drafted steps accepting 3, 1, 0, 3 → per position 3/4, 2/3, 2/2.
        after_reply={"/metrics": (200, "text/plain", vllm_metrics(104, 312, 157, [73, 52, 32]))},
    )
    with FakeServer(script) as server:
        backend = connect(server.url)
        assert backend.info.kind == "vllm" and backend.info.gamma == 3
        events = run(backend)
        request = server.script.requests[-1]
    assert request["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert request["model"] == "meta-llama/Llama-3.1-70B-Instruct"
    tokens = [e for e in events if isinstance(e, TokenEvent)]
    rounds = [e for e in events if isinstance(e, RoundEvent)]
    assert [(r.drafted, r.accepted) for r in rounds] == [(0, 0), (3, 3), (3, 1), (3, 0), (3, 3)]
    assert [t.text for t in tokens[:5]] == ["Once", " upon", " a", " time", ","]
    assert [t.kind for t in tokens[:7]] == [
        "target",
        "accepted",
        "accepted",
        "accepted",
        "bonus",
        "accepted",
        "correction",
    ]
    summary = events[-1]
    assert summary.per_position == pytest.approx((3 / 4, 2 / 3, 2 / 2))
    assert summary.alpha == pytest.approx(7 / 12) and summary.prompt_tokens == 21
    caps = backend.capabilities
    assert caps.gamma_control == "fixed" and any("num_speculative_tokens = 3" in n for n in caps.notes)


def test_vllm_without_logprobs_puts_a_steps_text_on_its_closing_token() -> None:
    script = Script(
        documents={
            "/v1/models": (200, "application/json", vllm_models()),
            "/metrics": (200, "text/plain", vllm_metrics(0, 0, 0, [0, 0])),
        },
        stream=vllm_stream([["Hi"], [" there", " you"]], logprobs=False),
    )
    with FakeServer(script) as server:
        tokens = [e for e in run(connect(server.url)) if isinstance(e, TokenEvent)]
    assert [(t.kind, t.text) for t in tokens] == [
        ("target", "Hi"),
        ("accepted", ""),
        ("correction", " there you"),
    ]


def test_vllm_that_refuses_logprobs_is_asked_again_without_them() -> None:
    script = Script(
        documents={
            "/v1/models": (200, "application/json", vllm_models()),
            "/metrics": (200, "text/plain", vllm_metrics(0, 0, 0, [0, 0])),
        },
        status=400,
        error_body='{"object":"error","message":"logprobs are not supported with speculative decoding"}',
    )
    with FakeServer(script) as server:
        backend = connect(server.url)
        with pytest.raises(ServerError):
            run(backend)  # the retry meets the same 400 here: one line, no loop
        assert [("logprobs" in r) for r in server.script.requests] == [True, False]


def test_any_other_server_streams_uncoloured_tokens_and_reports_no_alpha() -> None:
    script = Script(
        documents={"/v1/models": (200, "application/json", openai_models())},
        stream=openai_stream(["Hel", "lo", "!"]),
    )
    script.delay_s = 0.02
    with FakeServer(script) as server:
        backend = connect(server.url)
        events = run(backend)
    tokens = [e for e in events if isinstance(e, TokenEvent)]
    assert [t.kind for t in tokens] == ["target"] * 3 and "".join(t.text for t in tokens) == "Hello!"
    assert not [e for e in events if isinstance(e, RoundEvent)]
    summary = events[-1]
    assert summary.alpha is None and summary.tau is None and summary.tokens_per_s > 0
    caps = backend.capabilities
    assert (
        caps.provenance == "none"
        and caps.source("alpha") == "unavailable"
        and caps.source("tokens_per_s") == "measured"
    )
    assert "not reported: α, τ" in caps.describe()


def test_the_api_key_is_sent_from_the_environment_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECCHAT_API_KEY", "sk-test-123")
    with FakeServer(llama_script()) as server:
        run(connect(server.url))
        headers = server.script.headers
    assert headers and all(h.get("Authorization") == "Bearer sk-test-123" for h in headers)


def test_no_key_no_authorization_header() -> None:
    with FakeServer(llama_script()) as server:
        run(connect(server.url))
    assert all("Authorization" not in h for h in server.script.headers)


# ------------------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("localhost:8080", "not a URL"),
        ("ftp://example.org", "only http:// and https://"),
        ("http://", "names no host"),
        ("http://127.0.0.1:99999", "bad port"),
    ],
)
def test_bad_urls_get_one_line(url: str, words: str) -> None:
    with pytest.raises(ServerError, match=words):
        connect(url)


def test_normalize_url_drops_a_trailing_v1() -> None:
    assert normalize_url("http://host:8000/v1/") == "http://host:8000"
    assert normalize_url(" https://h.example/api/v1 ") == "https://h.example/api"


def test_a_refused_connection_gets_one_line() -> None:
    with FakeServer(Script()) as server:
        url = server.url
    with pytest.raises(ServerError, match=r"connection refused\. Is the server running"):
        connect(url)


def test_a_server_that_never_answers_times_out_with_one_line() -> None:
    script = llama_script()
    script.stall_s = 1.5
    with FakeServer(script) as server:
        backend = connect(server.url, timeout=0.5)
        with pytest.raises(ServerError, match=r"sent nothing for 0\.5 s"):
            run(backend)


@pytest.mark.parametrize(
    ("status", "body", "words"),
    [
        (
            401,
            '{"error":{"code":401,"message":"Invalid API Key","type":"authentication_error"}}',
            "Invalid API Key): set SPECCHAT_API_KEY",
        ),
        (
            400,
            '{"error":{"code":400,"message":"the request exceeds the available context size",'
            '"type":"exceed_context_size_error"}}',
            "rejected the request (400: the request exceeds",
        ),
        (500, "Internal Server Error", "failed (500: Internal Server Error)"),
        (
            503,
            '{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}',
            "failed (503: Loading model)",
        ),
    ],
)
def test_http_errors_get_one_line_with_the_servers_reason(status: int, body: str, words: str) -> None:
    script = llama_script()
    script.status, script.error_body = status, body
    with FakeServer(script) as server:
        backend = connect(server.url)
        with pytest.raises(ServerError) as caught:
            run(backend)
    assert words in str(caught.value) and "\n" not in str(caught.value)


def test_not_an_openai_server_gets_one_line() -> None:
    with FakeServer(Script()) as server, pytest.raises(ServerError, match="no /v1/models endpoint"):
        connect(server.url)


def test_a_stream_cut_mid_reply_keeps_what_arrived_then_fails_with_one_line() -> None:
    script = llama_script()
    script.cut_after = 12
    with FakeServer(script) as server:
        backend = connect(server.url)
        events = []
        with pytest.raises(
            ServerError, match=r"closed the connection mid-reply\. The reply was cut after 11 tokens"
        ):
            for event in backend.stream_chat(MESSAGES, Controls(), None):
                events.append(event)
    assert len([e for e in events if isinstance(e, TokenEvent)]) == 11
    assert "".join(e.text for e in events if isinstance(e, TokenEvent)).startswith("Once upon a time")


def test_a_stream_that_ends_without_a_finish_reason_is_an_error() -> None:
    script = llama_script()
    script.stream = [p for p in script.stream[:8]]  # ends cleanly, but mid-reply
    with FakeServer(script) as server:
        backend = connect(server.url)
        with pytest.raises(ServerError, match="ended the stream mid-reply"):
            run(backend)


def test_cancel_stops_at_once_and_closes_the_connection() -> None:
    script = llama_script()
    script.delay_s = 0.05
    with FakeServer(script) as server:
        backend = connect(server.url)
        cancel = threading.Event()
        events = []
        started = time.perf_counter()
        for event in backend.stream_chat(MESSAGES, Controls(), cancel):
            events.append(event)
            if sum(isinstance(e, TokenEvent) for e in events) == 5:
                cancel.set()
        elapsed = time.perf_counter() - started
    summary = events[-1]
    assert isinstance(summary, SummaryEvent) and summary.stop == "cancelled" and summary.tokens == 5
    assert elapsed < 2.0  # the whole stream would take 2+ s


def test_cancel_while_the_server_is_still_prefilling() -> None:
    script = llama_script()
    script.stall_s = 3.0
    with FakeServer(script) as server:
        backend = connect(server.url)
        cancel = threading.Event()
        threading.Timer(0.3, cancel.set).start()
        started = time.perf_counter()
        events = run(backend, cancel=cancel)
        assert time.perf_counter() - started < 2.0
    assert isinstance(events[-1], SummaryEvent) and events[-1].stop == "cancelled"


def test_json_lines_of_a_remote_reply_say_null_for_what_the_server_does_not_report() -> None:
    with FakeServer(llama_script()) as server:
        events = run(connect(server.url))
    token = json.loads(
        json.dumps(next(e for e in events if isinstance(e, TokenEvent) and e.kind == "accepted").to_json())
    )
    assert token["id"] is None and token["p_target"] is None and token["p_draft"] is None
    round_ = next(e for e in events if isinstance(e, RoundEvent)).to_json()
    assert round_["draft_ms"] is None and round_["verify_ms"] is None
    back = TokenEvent.from_json(token)
    assert (
        back.token_id == -1
        and not known(back.p_target)
        and back.p_draft is not None
        and not known(back.p_draft)
    )


@pytest.fixture
def tls_server(tmp_path: Any) -> Any:
    """The fake llama-server over https, with a self-signed certificate."""
    if shutil.which("openssl") is None:
        pytest.skip("needs openssl to make a certificate")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    server = FakeServer(llama_script())
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.httpd.socket = context.wrap_socket(server.httpd.socket, server_side=True)
    with server:
        yield server.url.replace("http://", "https://")


def test_tls_certificates_are_checked_by_default(tls_server: str) -> None:
    with pytest.raises(ServerError, match="TLS certificate is not trusted"):
        connect(tls_server)
    backend = connect(tls_server, verify=False)  # server_verify_tls = false
    assert isinstance(run(backend)[-1], SummaryEvent)
