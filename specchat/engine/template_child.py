"""The child process that renders chat templates for :mod:`specchat.engine.template_budget`.

Run as ``python -m specchat.engine.template_child MEMORY CPU_SECONDS``: it limits its own address
space and CPU time, imports transformers' renderer (never torch), says "ready", then answers one
request per message until its input closes. Messages are JSON, each preceded by its length (8
bytes, little-endian). A request holds the template, the messages, add_generation_prompt, the
template's variables and the output limit; the answer is ``{"text": ...}`` or ``{"error": kind,
"message": ...}``. Only the standard library and transformers are imported here.
"""

from __future__ import annotations

import json
import struct
import sys
from typing import Any, BinaryIO


def main() -> None:
    memory, cpu_seconds = int(sys.argv[1]), int(sys.argv[2])
    _limit(memory, cpu_seconds)
    from transformers.utils import chat_template_utils as templates

    inbox, outbox = sys.stdin.buffer, sys.stdout.buffer
    _send(outbox, "ready")
    while (request := _receive(inbox)) is not None:
        _send(outbox, _answer(templates, request))


def _answer(templates: Any, request: dict[str, Any]) -> dict[str, Any]:
    try:
        text = _render(templates, request)
    except MemoryError:
        return {"error": "memory", "message": ""}
    except RecursionError:
        return {"error": "failed", "message": "it recursed too deeply"}
    except Exception as err:  # the template's own error (raise_exception, syntax, a bad operation)
        return {"error": "failed", "message": f"{type(err).__name__}: {err}"[:2000]}
    if len(text) > request["limit"]:
        return {"error": "too long", "message": f"{len(text):,}"}
    return {"text": text}


def _render(templates: Any, request: dict[str, Any]) -> str:
    """As transformers' apply_chat_template(tokenize=False) renders one conversation."""
    normalize = getattr(templates, "_normalize_chat_messages", lambda conversation: conversation)
    rendered, _indices = templates.render_jinja_template(
        conversations=[normalize(request["messages"])],
        tools=None,
        documents=None,
        chat_template=request["template"],
        return_assistant_tokens_mask=False,
        continue_final_message=False,
        add_generation_prompt=request["add_generation_prompt"],
        **request["variables"],
    )
    return str(rendered[0])


def _limit(memory: int, cpu_seconds: int) -> None:
    try:
        import resource
    except ImportError:  # Windows: the wall-time limit in the parent still holds
        return
    for which, value in ((resource.RLIMIT_AS, memory), (resource.RLIMIT_CPU, cpu_seconds)):
        _soft, hard = resource.getrlimit(which)
        if hard == resource.RLIM_INFINITY or value <= hard:
            resource.setrlimit(which, (value, hard))


def _send(stream: BinaryIO, message: Any) -> None:
    data = json.dumps(message).encode()
    stream.write(struct.pack("<Q", len(data)) + data)
    stream.flush()


def _receive(stream: BinaryIO) -> Any:
    header = stream.read(8)
    if len(header) < 8:
        return None
    (length,) = struct.unpack("<Q", header)
    return json.loads(stream.read(length))


if __name__ == "__main__":
    main()
