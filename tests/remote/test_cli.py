"""`specchat generate --server` and `specchat bench --server` against a loopback server."""

from __future__ import annotations

import json

from click.testing import CliRunner

from specchat.cli import main
from tests.remote.server import DATA, FakeServer, Script, llama_script, sse_events

PROMPT = "Tell a very short story about a cat who learns to fly."


def test_generate_with_server_prints_the_reply_and_what_is_inferred() -> None:
    with FakeServer(llama_script()) as server:
        result = CliRunner().invoke(
            main, ["generate", PROMPT, "--server", server.url, "--max-new-tokens", "40"]
        )
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("Once upon a time, there was a cat named Whiskers")
    assert "attached to llama-server" in result.stderr
    assert "measured: α, tok/s · inferred: τ, per-position acceptance" in result.stderr


def test_generate_jsonl_with_server_says_null_for_unknowns() -> None:
    with FakeServer(llama_script()) as server:
        result = CliRunner().invoke(main, ["generate", PROMPT, "--server", server.url, "--format", "jsonl"])
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    tokens = [x for x in lines if x["type"] == "token"]
    assert tokens[0]["id"] is None and tokens[0]["p_target"] is None
    assert lines[-1]["type"] == "summary" and lines[-1]["drafted"] == 50 and lines[-1]["accepted"] == 22


def test_generate_against_a_dead_server_is_one_line_and_status_2() -> None:
    with FakeServer(Script()) as server:
        url = server.url
    result = CliRunner().invoke(main, ["generate", "hi", "--server", url])
    assert result.exit_code == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("specchat: cannot")]
    assert len(errors) == 1 and "connection refused" in errors[0] and "Traceback" not in result.stderr


def test_generate_keeps_the_text_of_a_cut_stream() -> None:
    script = llama_script()
    script.cut_after = 12
    with FakeServer(script) as server:
        result = CliRunner().invoke(main, ["generate", PROMPT, "--server", server.url])
    assert result.exit_code == 2
    assert result.stdout.startswith("Once upon a time")
    assert "closed the connection mid-reply" in result.stderr and "what arrived is kept" in result.stderr


def test_server_from_the_environment_is_used(monkeypatch) -> None:
    with FakeServer(llama_script()) as server:
        monkeypatch.setenv("SPECCHAT_SERVER", server.url)
        result = CliRunner().invoke(main, ["generate", PROMPT])
    assert result.exit_code == 0 and result.stdout.startswith("Once upon a time")


def test_bench_server_without_a_per_request_off_switch_says_why_there_is_no_baseline() -> None:
    script = llama_script()
    with FakeServer(script) as server:
        result = CliRunner().invoke(
            main,
            ["bench", "--server", server.url, "--quick", "--categories", "code", "--max-new-tokens", "40"],
        )
    assert result.exit_code == 0, result.output
    # The probe asked for n_max = 0 and the (replayed) server drafted anyway.
    assert [r.get("speculative.n_max") for r in script.requests] == [4, 0]
    assert "no plain baseline: this llama-server drafted although asked not to" in result.output
    assert "α" in result.output and "0.44" in result.output


def without_draft_counters(payload: str) -> str:
    """A captured chunk as a server without a draft model sends it (no draft_n totals)."""
    if payload == "[DONE]":
        return payload
    data = json.loads(payload)
    if "timings" in data:
        data["timings"] = {k: v for k, v in data["timings"].items() if not k.startswith("draft")}
    return json.dumps(data)


def test_bench_server_with_a_baseline_server_compares_texts_and_speed() -> None:
    plain = llama_script("llama_cat_story_t0.sse", speculative=False)
    plain.stream = [without_draft_counters(p) for p in sse_events(DATA / "llama_cat_story_t0.sse")]
    with FakeServer(llama_script()) as server, FakeServer(plain) as base:
        result = CliRunner().invoke(
            main,
            [
                "bench",
                "--server",
                server.url,
                "--baseline-server",
                base.url,
                "--quick",
                "--categories",
                "code",
            ],
        )
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if line.startswith("code"))
    assert row.endswith("yes")  # the same text at temperature 0
    assert "overall:" in result.output and "tok/s plain" in result.output


def test_baseline_server_alone_is_a_user_error() -> None:
    result = CliRunner().invoke(main, ["bench", "--baseline-server", "http://127.0.0.1:1"])
    assert result.exit_code == 2 and "--baseline-server needs --server" in result.output


def test_server_before_the_command_applies_to_it() -> None:
    with FakeServer(llama_script()) as server:
        result = CliRunner().invoke(main, ["--server", server.url, "generate", PROMPT])
    assert result.exit_code == 0 and result.stdout.startswith("Once upon a time")
