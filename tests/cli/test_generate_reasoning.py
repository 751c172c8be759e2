"""`specchat generate` and thinking models: the answer alone unless --reasoning, reasoning marked
in jsonl, --no-thinking; and --raw, the text exactly as given."""

from __future__ import annotations

import json
from pathlib import Path

from specchat.testing.tiny_models import ANSWER_SCRIPT, REASONING_SCRIPT, make_tokenizer

from .test_generate import run

ANSWER = "".join(ANSWER_SCRIPT)
REASONING = "<think>" + "".join(REASONING_SCRIPT) + "</think>\n\n"


def think(folders: tuple[Path, Path], *extra: str) -> tuple[int, str, str]:
    target, draft = folders
    return run(
        *("generate", " hi", "--target", str(target), "--draft", str(draft), "--cpu-path", "none"),
        *("--drafter", "model", "--gamma-schedule", "fixed", "--gamma", "3", *extra),
    )


def test_text_prints_the_answer_alone_unless_asked(thinking_folders: tuple[Path, Path]) -> None:
    code, out, _ = think(thinking_folders)
    assert code == 0 and out == ANSWER + "\n"
    code, out, _ = think(thinking_folders, "--reasoning")
    assert code == 0 and out == REASONING + ANSWER + "\n"


def test_ansi_prints_the_answer_and_both_alphas(thinking_folders: tuple[Path, Path]) -> None:
    code, out, _ = think(thinking_folders, "--format", "ansi")
    assert code == 0 and ANSWER in out and "Let me think" not in out
    assert "reasoning 22 tokens α 0.65 · answer α 1.00" in " ".join(out.split())


def test_jsonl_marks_reasoning_tokens(thinking_folders: tuple[Path, Path]) -> None:
    code, out, _ = think(thinking_folders, "--format", "jsonl")
    assert code == 0
    lines = [json.loads(line) for line in out.splitlines()]
    tokens = [line for line in lines if line["type"] == "token"]
    assert "".join(t["text"] for t in tokens if t.get("reasoning") is True) == REASONING
    assert "".join(t["text"] for t in tokens if "reasoning" not in t) == ANSWER
    summary = lines[-1]
    assert summary["reasoning_tokens"] == sum(1 for t in tokens if t.get("reasoning"))
    assert summary["answer_alpha"] == 1.0 and summary["reasoning_alpha"] < 1.0


def test_no_thinking_asks_the_template_to_skip_reasoning(thinking_folders: tuple[Path, Path]) -> None:
    code, out, _ = think(thinking_folders, "--no-thinking", "--reasoning")
    assert code == 0 and out == ANSWER + "\n"


def test_raw_feeds_the_prompt_exactly(tiny_folders: tuple[Path, Path]) -> None:
    target, draft = tiny_folders
    flags = ("--target", str(target), "--draft", str(draft), "--max-new-tokens", "4", "--format", "jsonl")
    prompt = "abc, d"
    _, templated, _ = run("generate", prompt, *flags)
    code, raw, _ = run("generate", prompt, "--raw", *flags)
    assert code == 0
    # The character tokenizer adds no BOS, as its file says: the prompt is the text's own tokens.
    assert (
        json.loads(raw.splitlines()[-1])["prompt_tokens"] == len(make_tokenizer()(prompt)["input_ids"]) == 6
    )
    assert json.loads(templated.splitlines()[-1])["prompt_tokens"] > 6


def test_raw_with_a_server_is_one_line() -> None:
    code, _, err = run("generate", "hi", "--raw", "--server", "http://127.0.0.1:9")
    assert code == 2 and "--raw feeds text to the local engine only" in err and "Traceback" not in err
