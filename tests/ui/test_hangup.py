"""The terminal goes away mid-reply (an ssh drop, `tmux kill-server`): the chat saves the reply and exits.

The pseudo-terminal's master side is closed, as a terminal emulator or sshd does when it goes,
and the process gets the SIGHUP the kernel sends to the session. Before specchat's tolerant
driver, Textual's writer thread died on the first EIO, the app blocked forever on its full queue
and ignored every signal but SIGKILL.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.ui.test_terminal import (  # noqa: F401
    Terminal,
    chat,
    conversations,
    long_context_pair,
    sent,
    streaming,
)

pytestmark = [
    pytest.mark.skipif(sys.platform == "win32", reason="needs a POSIX pseudo-terminal"),
    pytest.mark.spawns,
]

EXIT_WITHIN = 5.0


def hang_up(terminal: Terminal, send_sighup: bool) -> float:
    """Close the terminal under the process; returns when the hangup was complete (monotonic seconds)."""
    os.close(terminal.master)
    terminal.master = os.open(os.devnull, os.O_RDWR)  # so Terminal.close() has something to close
    if send_sighup:
        time.sleep(1.0)  # the reply streams on meanwhile: writes to the dead terminal pile up
        terminal.process.send_signal(signal.SIGHUP)
    return time.monotonic()


@pytest.mark.parametrize("send_sighup", [True, False], ids=["sighup", "pty-closed-only"])
def test_a_hangup_mid_reply_saves_the_reply_and_exits_within_seconds(
    chat: Callable[..., Terminal], tmp_path: Path, send_sighup: bool  # noqa: F811
) -> None:
    terminal = chat("--max-new-tokens", "3000")
    terminal.write("hello there")
    time.sleep(0.5)
    terminal.write("\r")
    terminal.wait_for(lambda: bool(sent(tmp_path)), what="the message to be saved")
    terminal.wait_for(lambda: streaming(terminal), what="the reply to stream")
    time.sleep(0.5)
    gone_at = hang_up(terminal, send_sighup)
    try:
        terminal.process.wait(EXIT_WITHIN + 5)
    except Exception:
        pytest.fail("specchat still runs after its terminal hung up")
    took = time.monotonic() - gone_at
    assert took < EXIT_WITHIN, f"specchat took {took:.1f} s to exit after the hangup"
    messages = conversations(tmp_path)[0]
    assert [m["role"] for m in messages] == ["user", "assistant"]
    assert messages[1]["content"], "the partial reply was not saved"
