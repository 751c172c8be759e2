"""`specchat generate` end to end on tiny models saved as Hugging Face folders."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from specchat.cli import main
from specchat.engine.session import ChatEngine
from specchat.testing.tiny_models import make_model, make_tokenizer


def run(*args: str, input: str | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args), input=input, catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def generate(folders: tuple[Path, Path], *extra: str, prompt: str = "abc abc abc") -> tuple[int, str, str]:
    target, draft = folders
    return run(
        "generate", prompt, "--target", str(target), "--draft", str(draft), "--max-new-tokens", "24", *extra
    )


def test_jsonl_is_the_documented_contract(tiny_folders: tuple[Path, Path]) -> None:
    code, out, _ = generate(tiny_folders, "--format", "jsonl", "--temperature", "0")
    assert code == 0
    lines = [json.loads(line) for line in out.splitlines()]
    assert lines[-1]["type"] == "summary"
    assert set(lines[-1]) >= {"tokens", "rounds", "alpha", "tau", "tokens_per_s", "per_position", "stop"}
    tokens = [line for line in lines if line["type"] == "token"]
    rounds = [line for line in lines if line["type"] == "round"]
    assert tokens and rounds
    v1_token = {"type", "kind", "id", "text", "round", "position", "p_target", "p_draft"}
    assert all(set(t) - {"top"} == v1_token | {"drawn_from"} for t in tokens)  # v2 only adds fields
    closing = [t for t in tokens if t["kind"] != "accepted"]
    assert closing and all(len(t["top"]) == 5 and t["top"][0].keys() == {"id", "text", "p"} for t in closing)
    v1_round = {"type", "round", "gamma", "drafted", "accepted", "draft_ms", "verify_ms", "drafter"}
    v2_round = v1_round | {"drafts", "caught_up", "note"}
    assert all(set(r) == v2_round and len(r["drafts"]) == r["drafted"] for r in rounds)
    assert lines[-1]["contract"] == 2
    assert lines[-1]["tokens"] == len(tokens)
    assert lines[-1]["rounds"] == len(rounds)


def texts(out: str) -> str:
    return "".join(json.loads(line)["text"] for line in out.splitlines() if '"type": "token"' in line)


@pytest.mark.parametrize("cpu_path", ["auto", "none"])
@pytest.mark.parametrize("drafter", ["model", "ngram"])
def test_greedy_text_equals_plain_decoding(
    tiny_folders: tuple[Path, Path], drafter: str, cpu_path: str
) -> None:
    kernels = ("--cpu-path", cpu_path)
    _, speculative, _ = generate(
        tiny_folders, "--format", "jsonl", "--drafter", drafter, "--gamma", "3", *kernels
    )
    _, plain, _ = generate(tiny_folders, "--format", "jsonl", "--drafter", "none", *kernels)
    assert texts(speculative) == texts(plain)
    assert '"kind": "target"' in plain


def test_text_and_ansi_formats(tiny_folders: tuple[Path, Path]) -> None:
    code, out, _ = generate(tiny_folders, "--format", "text")
    assert code == 0 and out.endswith("\n")
    code, out, _ = generate(tiny_folders, "--format", "ansi")
    assert code == 0
    assert "accepted draft" in out and "residual correction" in out and "bonus" in out
    assert "tok/s" in out and "α" in out


def test_prompt_from_stdin(tiny_folders: tuple[Path, Path]) -> None:
    target, draft = tiny_folders
    code, out, _ = run(
        "generate",
        "-",
        "--target",
        str(target),
        "--draft",
        str(draft),
        "--max-new-tokens",
        "5",
        "--format",
        "jsonl",
        input="abc abc",
    )
    assert code == 0 and json.loads(out.splitlines()[-1])["type"] == "summary"


def test_ngram_needs_no_draft_model(tiny_folders: tuple[Path, Path]) -> None:
    target, _ = tiny_folders
    code, out, _ = run(
        "generate",
        "abab abab",
        "--target",
        str(target),
        "--draft",
        "no-such-model",
        "--drafter",
        "ngram",
        "--max-new-tokens",
        "8",
        "--format",
        "jsonl",
    )
    assert code == 0, out


BAD_INPUTS = {
    "gamma below one": (["--gamma", "0"], "gamma"),
    "negative temperature": (["--temperature", "-1"], "temperature"),
    "top-p zero": (["--top-p", "0"], "--top-p"),
    "top-p above one": (["--top-p", "1.5"], "--top-p"),
    "unknown CPU path": (["--cpu-path", "int3/fp32"], "CPU path"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_settings_get_one_clear_line(tiny_folders: tuple[Path, Path], case: str) -> None:
    flags, word = BAD_INPUTS[case]
    code, _, err = generate(tiny_folders, *flags)
    assert code == 2
    assert word in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_empty_prompt(tiny_folders: tuple[Path, Path]) -> None:
    code, _, err = generate(tiny_folders, prompt="   ")
    assert code == 2 and "empty" in err


def test_unknown_model_name() -> None:
    code, _, err = run("generate", "hi", "--target", "no-such-model", "--drafter", "none")
    assert code == 2 and "no-such-model" in err and "Traceback" not in err


def test_missing_gguf_file(tmp_path: Path) -> None:
    code, _, err = run("generate", "hi", "--target", str(tmp_path / "missing.gguf"), "--drafter", "none")
    assert code == 2 and "missing.gguf" in err


def test_corrupt_gguf_file(tmp_path: Path) -> None:
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + os.urandom(64))
    code, _, err = run("generate", "hi", "--target", str(bad), "--drafter", "none")
    assert code == 2 and "broken.gguf" in err and "Traceback" not in err


def test_mismatched_tokenizers(tiny_folders: tuple[Path, Path], tmp_path: Path) -> None:
    tokenizer = make_tokenizer("zyxwvutsrqponmlkjihgfedcba .,")
    other = tmp_path / "other-draft"
    make_model(len(tokenizer), seed=9).save_pretrained(other)
    tokenizer.save_pretrained(other)
    code, _, err = run("generate", "hi", "--target", str(tiny_folders[0]), "--draft", str(other))
    assert code == 2 and "cannot draft" in err and "ngram" in err


def test_prompt_longer_than_the_context(tiny_folders: tuple[Path, Path]) -> None:
    code, _, err = generate(tiny_folders, prompt="abc " * 100)
    assert code == 2 and "context" in err


def test_out_of_memory_is_reported(tiny_folders: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    def boom(*args: object, **kwargs: object) -> None:
        raise torch.OutOfMemoryError("CUDA out of memory")

    from specchat.engine import kv

    monkeypatch.setattr(kv.CachedLM, "logits_after", boom)
    code, _, err = generate(tiny_folders)
    assert code == 2 and "out of memory" in err and "Traceback" not in err


def test_ctrl_c_keeps_what_was_generated(
    tiny_folders: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGINT mid-reply: the engine stops at the next round, the summary says so, exit 130."""
    real = ChatEngine.stream_chat

    def interrupt_after_three_tokens(self: ChatEngine, *args: object, **kwargs: object) -> Iterator[object]:
        for index, event in enumerate(real(self, *args, **kwargs)):  # type: ignore[arg-type]
            if index == 3:
                os.kill(os.getpid(), signal.SIGINT)
            yield event

    monkeypatch.setattr(ChatEngine, "stream_chat", interrupt_after_three_tokens)
    code, out, _ = generate(tiny_folders, "--format", "jsonl", "--max-new-tokens", "200", "--gamma", "1")
    lines = [json.loads(line) for line in out.splitlines()]
    assert code == 130
    assert lines[-1]["type"] == "summary" and lines[-1]["stop"] == "cancelled"
    assert 0 < lines[-1]["tokens"] < 200


def test_models_lists_the_packaged_pair() -> None:
    code, out, _ = run("models")
    assert code == 0
    assert "qwen-coder-1.5b" in out and "qwen-coder-0.5b" in out and "smollm2-135m" in out
