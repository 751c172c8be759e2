"""A model's chat template, rendered within a time, memory and output budget.

The template comes from the model file (``tokenizer.chat_template``), so it is code a stranger
wrote. transformers renders it in Jinja's sandbox, which keeps it from reaching Python, but not
from looping for hours (two nested ``range(99999)``) or building a 3 GB string in one step
(``'x' * 3000000000``): neither can be stopped from inside the process that runs it. So the
template is rendered in a child process, by transformers' own renderer, under limits:

- :data:`RENDER_SECONDS` of wall time per render (the child is killed past it, and a fresh one
  started for the next render);
- :data:`RENDER_MEMORY` of address space (``RLIMIT_AS``) and a CPU-time limit, set in the child;
- an output cap against the context (:func:`output_limit`): a prompt cannot hold more than
  :data:`CHARS_PER_TOKEN` characters per token of the context, so a longer render is refused
  before it is sent back or tokenized.

Every failure (a budget spent, a syntax error, the template's own ``raise_exception``) becomes a
:class:`ChatTemplateError`: one line, exit status 2. Renders take milliseconds; the child is
started once per process (about a second of imports, overlapping model loading when the engine
warms it up) and serves every render after that. Everything here is in this module so that the
call in the session (:func:`render_chat`) takes extra template variables as they come.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import queue
import struct
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from specchat.errors import SpecchatError
from specchat.untrusted import clipped, visible

RENDER_SECONDS = 10.0
"""Wall time one render may take. Real templates render a long conversation in milliseconds."""
START_SECONDS = 120.0
"""Time the child may take to start (it imports transformers' renderer; slow on a loaded machine)."""
RENDER_MEMORY = 1 << 30
"""Address space of the rendering child: 1 GiB (it needs about 200 MB)."""
RENDER_CPU_SECONDS = 600
"""CPU time of one child over its life: a backstop should the wall-time kill ever miss."""
CHARS_PER_TOKEN = 32
"""Characters a prompt may hold per token of context (real text averages 3 to 5)."""
MIN_OUTPUT_CHARS = 1 << 20
"""The output cap never goes below 1 Mi characters, whatever the context."""


class ChatTemplateError(SpecchatError):
    """The model's chat template failed, or spent its budget, on this conversation."""


class RenderTooLong(ChatTemplateError):
    """The render is longer than any prompt the context holds (:func:`output_limit`): a hostile
    template, or a conversation that has outgrown the context many times over (a chat leaves
    its oldest exchanges out then, see ChatEngine.fit)."""


def output_limit(context_tokens: int | None) -> int:
    """The longest render a context of ``context_tokens`` tokens could hold (None: unknown)."""
    if context_tokens is None:
        return 8 * MIN_OUTPUT_CHARS
    return max(MIN_OUTPUT_CHARS, CHARS_PER_TOKEN * context_tokens)


def render_chat(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    *,
    context_tokens: int | None,
    add_generation_prompt: bool = True,
    template: str | None = None,
    **template_variables: Any,
) -> str:
    """The conversation through the tokenizer's chat template (or ``template``), as transformers'
    ``apply_chat_template(..., tokenize=False)`` renders it, within the budget.
    ``template_variables`` reach the template beside the special tokens (as transformers passes
    its extra keyword arguments: ``enable_thinking=False``, say)."""
    if template is None:
        try:
            template = tokenizer.get_chat_template()
        except ValueError as err:
            raise ChatTemplateError(f"the model's chat template cannot be used: {_shown(err)}") from None
    variables = {**_special_tokens(tokenizer), **template_variables}
    request = {
        "template": template,
        "messages": [dict(message) for message in messages],
        "add_generation_prompt": add_generation_prompt,
        "variables": variables,
        "limit": output_limit(context_tokens),
    }
    return _renderer().render(request, context_tokens)


def warm_up() -> None:
    """Start the rendering child now, so its imports overlap whatever the caller does next."""
    _renderer().start()


def _special_tokens(tokenizer: Any) -> dict[str, Any]:
    tokens = getattr(tokenizer, "special_tokens_map", {}) or {}
    return {key: value for key, value in tokens.items() if isinstance(value, str | list)}


def _shown(err: BaseException | str) -> str:
    return visible(clipped(" ".join(str(err).split()) or type(err).__name__, 200))


class _Child:
    """One rendering process, and the thread that reads its answers: a blocking read works on
    pipes on every platform, and the queue gives each wait its deadline."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.process = process
        self.ready = False
        self.answers: queue.Queue[Any] = queue.Queue()
        threading.Thread(target=self._read, name="chat template renderer", daemon=True).start()

    def _read(self) -> None:
        stream = self.process.stdout
        assert stream is not None
        with contextlib.suppress(OSError, ValueError):
            while len(header := stream.read(8)) == 8:
                (length,) = struct.unpack("<Q", header)
                body = stream.read(length)
                if len(body) < length:
                    break
                self.answers.put(json.loads(body))
        self.answers.put(EOFError("it ended without an answer"))

    def send(self, message: Any) -> None:
        assert self.process.stdin is not None
        data = json.dumps(message).encode()
        self.process.stdin.write(struct.pack("<Q", len(data)) + data)
        self.process.stdin.flush()

    def receive(self, seconds: float) -> Any:
        """The next answer, or TimeoutError once ``seconds`` pass without one."""
        try:
            answer = self.answers.get(timeout=seconds)
        except queue.Empty:
            raise TimeoutError from None
        if isinstance(answer, EOFError):
            raise answer
        return answer

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self.process.kill()
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            self.process.wait(timeout=5)


class _Renderer:
    """One rendering child, shared by every engine of the process; a failed child is replaced."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._child: _Child | None = None

    def start(self) -> None:
        with self._lock:
            self._spawn()

    def render(self, request: dict[str, Any], context_tokens: int | None) -> str:
        with self._lock:
            child = self._spawn()
            if not child.ready:
                self._wait_until_ready(child)
            try:
                child.send(request)
                reply = child.receive(RENDER_SECONDS)
            except TimeoutError:
                self._stop()
                raise ChatTemplateError(
                    f"the model's chat template did not finish rendering this conversation within "
                    f"{RENDER_SECONDS:.0f} s; the template in the model file is broken or hostile"
                ) from None
            except (OSError, EOFError, ValueError) as err:
                self._stop()
                raise ChatTemplateError(
                    f"the model's chat template stopped its renderer ({_shown(err)}); it may have needed "
                    f"more than {RENDER_MEMORY >> 20} MiB"
                ) from None
        return _rendered(reply, request["limit"], context_tokens)

    def _wait_until_ready(self, child: _Child) -> None:
        try:
            _expect(child.receive(START_SECONDS), "ready")
        except (TimeoutError, OSError, EOFError, ValueError) as err:
            self._stop()
            reason = _shown(err) if str(err) else f"not ready after {START_SECONDS:.0f} s"
            raise ChatTemplateError(
                f"the process that renders chat templates could not start ({reason}); is transformers "
                f"importable by {visible(sys.executable)}?"
            ) from None
        child.ready = True

    def _spawn(self) -> _Child:
        if self._child is not None and self._child.process.poll() is None:
            return self._child
        package_root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
        command = [
            sys.executable,
            "-m",
            "specchat.engine.template_child",
            str(RENDER_MEMORY),
            str(RENDER_CPU_SECONDS),
        ]
        process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env
        )
        self._child = _Child(process)
        return self._child

    def _stop(self) -> None:
        child, self._child = self._child, None
        if child is not None:
            child.stop()

    def close(self) -> None:
        with self._lock:
            self._stop()


def _rendered(reply: Any, limit: int, context_tokens: int | None) -> str:
    if not isinstance(reply, dict):
        raise ChatTemplateError("the model's chat template renderer answered nonsense")
    if "text" in reply:
        return str(reply["text"])
    kind, said = reply.get("error"), reply.get("message", "")
    if kind == "too long":
        context = f"a {context_tokens:,}-token context" if context_tokens else "any context"
        raise RenderTooLong(
            f"the model's chat template turned this conversation into {said} characters, more than "
            f"{context} can hold ({limit:,} at most); the template in the model file is broken or hostile"
        )
    if kind == "memory":
        raise ChatTemplateError(
            f"the model's chat template needed more than {RENDER_MEMORY >> 20} MiB to render this "
            "conversation; the template in the model file is broken or hostile"
        )
    raise ChatTemplateError(f"the model's chat template failed on this conversation: {_shown(said)}")


def _expect(reply: Any, word: str) -> None:
    if reply != word:
        raise ValueError(f"it said {clipped(repr(reply), 80)} when starting")


_RENDERER: _Renderer | None = None
_RENDERER_LOCK = threading.Lock()


def _renderer() -> _Renderer:
    global _RENDERER
    with _RENDERER_LOCK:
        if _RENDERER is None:
            _RENDERER = _Renderer()
            atexit.register(_RENDERER.close)
        return _RENDERER
