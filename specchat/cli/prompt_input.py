"""Reading a prompt from an argument, a file or standard input, checked before any model loads."""

from __future__ import annotations

import sys
from pathlib import Path

from specchat.errors import InvalidSettingError
from specchat.files import PROMPT_LIMIT, read_user_file


def read_prompt(prompt: str | None, prompt_file: str | None) -> str:
    """The prompt as text, checked before any model loads: one clear line when it is unusable."""
    if prompt is not None and prompt_file is not None:
        raise InvalidSettingError("give the prompt once: either PROMPT or --prompt-file, not both.")
    if prompt_file is not None:
        text = decode_prompt(read_prompt_file(prompt_file), f"the prompt file {prompt_file}")
    elif prompt == "-":
        text = decode_prompt(sys.stdin.buffer.read(), "standard input")
    elif prompt is not None:
        text = check_prompt_argument(prompt)
    else:
        raise InvalidSettingError(
            "no prompt: pass PROMPT, '-' to read standard input, or --prompt-file FILE."
        )
    if not text.strip():
        raise InvalidSettingError("the prompt is empty: pass some text, or '-' to read it from stdin.")
    return text


def read_prompt_file(name: str) -> bytes:
    if name == "-":
        return sys.stdin.buffer.read()
    try:
        return read_user_file(Path(name), PROMPT_LIMIT)
    except FileNotFoundError as err:
        raise InvalidSettingError(f"the prompt file {name} does not exist.") from err
    except IsADirectoryError as err:
        raise InvalidSettingError(f"the prompt file {name} is a folder: name a text file.") from err
    except OSError as err:
        raise InvalidSettingError(f"cannot read the prompt file {name}: {err.strerror or err}.") from err


def decode_prompt(data: bytes, where: str) -> str:
    if b"\x00" in data:
        raise InvalidSettingError(f"{where} looks binary (it holds NUL bytes): the prompt must be text.")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InvalidSettingError(
            f"{where} is not UTF-8 text (byte {data[err.start]:#04x} at offset {err.start}): "
            "convert it first, e.g. with iconv -t UTF-8."
        ) from err


def check_prompt_argument(prompt: str) -> str:
    """Bytes that are not UTF-8 reach argv as lone surrogates: refuse them before loading."""
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as err:
        byte = ord(prompt[err.start]) - 0xDC00 if 0xDC80 <= ord(prompt[err.start]) <= 0xDCFF else None
        what = f"byte {byte:#04x}" if byte is not None else f"character {prompt[err.start]!r}"
        raise InvalidSettingError(
            f"the prompt argument is not UTF-8 text ({what} at position {err.start}): "
            "check your terminal's encoding, or pass the text with --prompt-file."
        ) from err
    return prompt
