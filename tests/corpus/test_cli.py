"""Bad input to `specchat generate` / `chat`: one line, a documented exit status, nothing lost.

Exit statuses (docs/what-happens-when.md, "Exit status"): 2 for anything the user can fix (a flag, a
setting, a variable, the prompt), 1 for an unexpected error, 130 after Ctrl+C, 143 after SIGTERM.

Cases marked ``before_loading`` must be refused before any model is loaded: the loader is
replaced by one that fails the test if it is reached.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest
from click.testing import CliRunner

from specchat import opening
from specchat.cli import main

from .conftest import AlreadySaved, assert_one_clear_line

USER_ERROR = 2


@dataclass(frozen=True)
class Case:
    args: tuple[str, ...]
    words: tuple[str, ...]
    """Words the one line must hold (what is wrong, and what to do)."""
    stdin: bytes | None = None
    env: dict[str, str] = field(default_factory=dict)
    config: str | bytes | None = None
    """Replaces the hand-written config file for the case (None keeps it)."""
    before_loading: bool = True
    command: str = "generate"
    status: int = USER_ERROR
    model_flags: bool = True
    """Point --target/--draft at the tiny test models (cases about the models themselves don't)."""


SEED_LIMIT = str(2**64)
NOT_UTF8 = "caf\udce9"  # how Python hands a non-UTF-8 byte in argv to the program

FLAGS: dict[str, Case] = {
    # out of range
    "gamma 0": Case(("hi", "--gamma", "0"), ("--gamma 0", "greater than or equal to 1")),
    "gamma 17": Case(("hi", "--gamma", "17"), ("--gamma 17", "less than or equal to 16")),
    "temperature negative": Case(("hi", "--temperature", "-1"), ("--temperature -1",)),
    "temperature inf": Case(("hi", "--temperature", "inf"), ("--temperature inf", "finite")),
    "temperature nan": Case(("hi", "--temperature", "nan"), ("--temperature nan", "finite")),
    "top-p 0": Case(("hi", "--top-p", "0"), ("--top-p 0",)),
    "top-p above 1": Case(("hi", "--top-p", "1.5"), ("--top-p 1.5",)),
    "top-k 0": Case(("hi", "--top-k", "0"), ("--top-k 0",)),
    "max-new-tokens 0": Case(("hi", "--max-new-tokens", "0"), ("--max-new-tokens 0",)),
    "seed negative": Case(("hi", "--seed", "-1"), ("--seed -1", "2^64")),
    "seed beyond 64 bits": Case(("hi", "--seed", SEED_LIMIT), ("--seed", "2^64")),
    # wrong type
    "gamma not a number": Case(("hi", "--gamma", "four"), ("'--gamma'", "not a valid integer", "--help")),
    "temperature not a number": Case(("hi", "--temperature", "hot"), ("'--temperature'", "--help")),
    "seed a float": Case(("hi", "--seed", "1e3"), ("'--seed'", "not a valid integer")),
    "max-new-tokens a word": Case(("hi", "--max-new-tokens", "lots"), ("'--max-new-tokens'",)),
    # unknown names
    "unknown drafter": Case(("hi", "--drafter", "oracle"), ("'--drafter'", "'oracle'", "ngram")),
    "unknown schedule": Case(("hi", "--gamma-schedule", "magic"), ("'--gamma-schedule'", "adaptive")),
    "unknown format": Case(("hi", "--format", "yaml"), ("'--format'", "jsonl")),
    "unknown quantization": Case(("hi", "--quant", "2bit"), ("'--quant'", "4bit")),
    "unknown option": Case(("hi", "--gama", "3"), ("--gama", "--help")),
    "unknown command": Case((), ("genrate", "--help"), command="genrate"),
    "unknown cpu path": Case(("hi", "--cpu-path", "int3/fp32"), ("int3/fp32", "auto"), before_loading=False),
    "unknown device": Case(("hi", "--device", "tpu"), ("'tpu'", "cpu"), before_loading=False),
    "cuda without a GPU": Case(
        ("hi", "--device", "cuda:7"), ("cuda:7", "--device cpu"), before_loading=False
    ),
    "unknown dtype": Case(("hi", "--dtype", "float8"), ("'float8'", "float32"), before_loading=False),
    "unknown target model": Case(
        ("hi", "--target", "no-such-model"), ("no-such-model", "specchat models"), before_loading=False
    ),
    "missing model folder": Case(
        ("hi", "--target", "/nonexistent/model"), ("/nonexistent/model",), before_loading=False
    ),
    "missing gguf file": Case(
        ("hi", "--target", "/nonexistent/m.gguf"), ("m.gguf", "does not exist"), before_loading=False
    ),
    "unknown theme": Case(("--theme", "no-such-theme"), ("no-such-theme", "specchat-dark"), command="chat"),
    # conflicting flags
    "prompt twice": Case(("hi", "--prompt-file", "p.txt"), ("either PROMPT or --prompt-file",)),
    "quant with cpu kernels": Case(
        ("hi", "--quant", "4bit", "--cpu-path", "int8/dyn8"), ("--quant 4bit", "--cpu-path int8/dyn8")
    ),
    "model drafter without a draft": Case(
        ("hi", "--drafter", "model"),
        ("--drafter model", "--draft"),
        env={"SPECCHAT_DRAFT": "none"},
        model_flags=False,
    ),
    # the prompt
    "no prompt": Case((), ("no prompt", "--prompt-file")),
    "blank prompt": Case(("   ",), ("empty",)),
    "prompt argument not UTF-8": Case((NOT_UTF8,), ("not UTF-8", "0xe9")),
    "empty stdin": Case(("-",), ("empty",), stdin=b""),
    "binary stdin": Case(("-",), ("binary", "NUL"), stdin=b"\x7fELF\x02\x01\x00\x00"),
    "stdin not UTF-8": Case(("-",), ("standard input", "not UTF-8", "0xff"), stdin=b"hi \xff there"),
    "prompt file missing": Case(
        ("--prompt-file", "/nonexistent/prompt.txt"), ("/nonexistent/prompt.txt", "does not exist")
    ),
    "prompt file is a folder": Case(("--prompt-file", "/"), ("is a folder",)),
    "prompt over the context": Case(
        ("abc " * 100,), ("context holds 256", "shorten the message"), before_loading=False
    ),
}

CONFIG_FILES: dict[str, Case] = {
    "config not TOML": Case(("hi",), ("config.toml", "not valid TOML"), config="gamma = [\n"),
    "config unknown key": Case(
        ("hi",), ("unknown setting 'gama'", "did you mean 'gamma'"), config="gama = 3\n"
    ),
    "config unknown key far from any": Case(
        ("hi",), ("unknown setting 'colour'", "known settings"), config="colour = 3\n"
    ),
    "config wrong type": Case(
        ("hi",), ("gamma = 'four'", "config.toml", "integer"), config='gamma = "four"\n'
    ),
    "config out of range": Case(("hi",), ("top_p = 2.0", "config.toml"), config="top_p = 2.0\n"),
    "config infinite temperature": Case(
        ("hi",), ("temperature = inf", "finite"), config="temperature = inf\n"
    ),
    "config seed beyond 64 bits": Case(("hi",), ("seed = ", "2^64"), config=f"seed = {2**64}\n"),
    "config unknown drafter": Case(("hi",), ("drafter = 'oracle'", "ngram"), config='drafter = "oracle"\n'),
    "config keys not a table": Case(("hi",), ("keys = 'ctrl+up'", "dictionary"), config='keys = "ctrl+up"\n'),
    "config key value not text": Case(("hi",), ("keys.gamma_up = 5",), config="[keys]\ngamma_up = 5\n"),
    "config not UTF-8": Case(("hi",), ("not UTF-8", "0xe9"), config=b'system_prompt = "caf\xe9"\n'),
    "config is a folder": Case(("hi",), ("cannot read config file",), config=None),
}

VARIABLES: dict[str, Case] = {
    "SPECCHAT_GAMMA not a number": Case(
        ("hi",), ("SPECCHAT_GAMMA=abc", "integer"), env={"SPECCHAT_GAMMA": "abc"}
    ),
    "SPECCHAT_SEED beyond 64 bits": Case(
        ("hi",), ("SPECCHAT_SEED=" + SEED_LIMIT, "2^64"), env={"SPECCHAT_SEED": SEED_LIMIT}
    ),
    "SPECCHAT_TEMPERATURE inf": Case(
        ("hi",), ("SPECCHAT_TEMPERATURE=inf", "finite"), env={"SPECCHAT_TEMPERATURE": "inf"}
    ),
    "SPECCHAT_TOP_P negative": Case(("hi",), ("SPECCHAT_TOP_P=-1",), env={"SPECCHAT_TOP_P": "-1"}),
    "SPECCHAT_DRAFTER unknown": Case(
        ("hi",), ("SPECCHAT_DRAFTER=oracle",), env={"SPECCHAT_DRAFTER": "oracle"}
    ),
    "SPECCHAT_SCHEDULE unknown": Case(
        ("hi",), ("SPECCHAT_SCHEDULE=magic", "adaptive"), env={"SPECCHAT_SCHEDULE": "magic"}
    ),
    "SPECCHAT_MAX_NEW_TOKENS zero": Case(
        ("hi",), ("SPECCHAT_MAX_NEW_TOKENS=0",), env={"SPECCHAT_MAX_NEW_TOKENS": "0"}
    ),
    "SPECCHAT_KEYS not a table": Case(
        ("hi",), ("SPECCHAT_KEYS", "TOML", "JSON"), env={"SPECCHAT_KEYS": "gamma_up=ctrl+up"}
    ),
    "SPECCHAT_KEYS value not text": Case(
        ("hi",), ("keys.gamma_up = 5", "SPECCHAT_KEYS"), env={"SPECCHAT_KEYS": '{"gamma_up": 5}'}
    ),
    "SPECCHAT_CONFIG names a missing folder's file": Case(
        ("hi", "--gamma", "0"), ("--gamma 0",), env={"SPECCHAT_CONFIG": "/nonexistent/dir/config.toml"}
    ),
}

# Paths that name something other than a file: read to the end, /dev/zero grew
# the process by 170 MB/s until the kernel killed it at 20 GB.
SPECIAL_FILES: dict[str, Case] = {
    "replay /dev/zero": Case(("/dev/zero",), ("/dev/zero", "device", "not a file"), command="replay"),
    "replay a folder": Case((".",), ("is a directory",), command="replay"),
    "race --load /dev/zero": Case(("--load", "/dev/zero"), ("/dev/zero", "device"), command="race"),
    "prompt file /dev/zero": Case(("--prompt-file", "/dev/zero"), ("/dev/zero", "device")),
    "SPECCHAT_CONFIG /dev/zero": Case(("hi",), ("/dev/zero", "device"), env={"SPECCHAT_CONFIG": "/dev/zero"}),
}

# The bench's own options, refused before any model loads.
BENCH: dict[str, Case] = {
    "bench start-gamma 0": Case(("--start-gamma", "0"), ("--start-gamma", "1<=x<=16"), command="bench"),
    "bench ngram-gamma -1": Case(("--ngram-gamma", "-1"), ("--ngram-gamma", "1<=x<=16"), command="bench"),
    "bench max-new-tokens 0": Case(("--max-new-tokens", "0"), ("--max-new-tokens", "x>=1"), command="bench"),
}

CASES = {**FLAGS, **CONFIG_FILES, **VARIABLES, **SPECIAL_FILES, **BENCH}


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_one_line_and_loses_nothing(
    name: str,
    already_saved: AlreadySaved,
    tiny_folders: tuple[Path, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    case = CASES[name]
    for variable, value in case.env.items():
        monkeypatch.setenv(variable, value)
    if name == "config is a folder":
        monkeypatch.setenv("SPECCHAT_CONFIG", str(tmp_path))
    elif case.config is not None:
        data = case.config.encode() if isinstance(case.config, str) else case.config
        already_saved.config.write_bytes(data)
        already_saved.take()
    if case.before_loading:
        monkeypatch.setattr(opening, "load_local", _must_not_load)
    monkeypatch.chdir(tmp_path)
    target, draft = tiny_folders
    models = ["--target", str(target), "--draft", str(draft), "--cpu-path", "none"]
    args = [case.command, *case.args]
    if case.command == "generate" and case.model_flags and "--target" not in case.args:
        args[1:1] = models  # before the case's own flags, which win
    result = CliRunner().invoke(main, args, input=case.stdin, catch_exceptions=False)
    assert result.exit_code == case.status, result.stderr
    assert_one_clear_line(result.stderr, *case.words)
    if case.before_loading:
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    already_saved.assert_untouched()


@pytest.mark.parametrize(("command", "flag"), [("replay", None), ("race", "--load")])
def test_deeply_nested_json_is_one_line(
    command: str, flag: str | None, already_saved: AlreadySaved, tmp_path: Path
) -> None:
    nested = tmp_path / "nested.json"
    nested.write_text("[" * 100_000)
    result = CliRunner().invoke(main, [command, *([flag] if flag else []), str(nested)])
    assert result.exit_code == USER_ERROR, result.stderr
    assert_one_clear_line(result.stderr, "nests", "too deeply")
    already_saved.assert_untouched()


def _must_not_load(*args: object, **kwargs: object) -> None:
    raise AssertionError("models were loaded before the bad input was refused")


def test_the_corpus_is_large_enough() -> None:
    from . import test_conversations, test_hostile_models, test_keys_and_themes, test_signals

    size = len(CASES) + test_conversations.SIZE + test_keys_and_themes.SIZE + test_signals.SIZE
    size += test_hostile_models.SIZE
    assert size >= 60, size
    assert test_hostile_models.SIZE >= 100, test_hostile_models.SIZE  # crafted model files, both commands
