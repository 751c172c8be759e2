"""`specchat replay FILE`: one clear line for a file it cannot replay, no model loaded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from specchat.cli import main


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def conversation(messages: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "format": "specchat-conversation",
        "version": 1,
        "id": "x",
        "models": {"target": "t", "draft": None},
        "system_prompt": "",
        "messages": messages,
    }


V1_REPLY = {
    "role": "assistant",
    "content": "hi",
    "tokens": [
        {
            "kind": "accepted",
            "id": 5,
            "text": "h",
            "round": 0,
            "position": 0,
            "p_target": 0.9,
            "p_draft": 0.8,
        },
        {
            "kind": "correction",
            "id": 6,
            "text": "i",
            "round": 0,
            "position": 1,
            "p_target": 0.5,
            "p_draft": None,
        },
    ],
    "rounds": [
        {
            "round": 0,
            "gamma": 2,
            "drafted": 2,
            "accepted": 1,
            "draft_ms": 3.0,
            "verify_ms": 9.0,
            "drafter": "model",
        }
    ],
    "stats": None,
    "settings": {"gamma": 2, "drafter": "model"},
}


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ('{"format": "specchat-conv', "not complete JSON"),
        ("[1, 2]", "cannot read the conversation"),
        (json.dumps({"format": "other"}), "not a specchat conversation"),
        (json.dumps(conversation([{"role": "user", "content": "hello"}])), "holds no reply to replay"),
        (b"\xff\xfe".decode("latin-1"), "cannot read the conversation"),
    ],
)
def test_a_file_that_cannot_be_replayed_is_one_line(tmp_path: Path, content: str, expected: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content, encoding="latin-1")
    code, out, err = run("replay", str(path))
    assert code == 2 and out == ""
    assert expected in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_a_missing_file_is_one_line(tmp_path: Path) -> None:
    code, _, err = run("replay", str(tmp_path / "gone.json"))
    assert code == 2 and "no saved conversation at" in err and "Traceback" not in err


def test_replay_opens_the_app_with_no_engine_at_the_chosen_speed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from specchat.ui.app import SpecchatApp

    seen: dict[str, Any] = {}

    def fake_run(self: SpecchatApp, *args: Any, **kwargs: Any) -> None:
        seen.update(
            replay=self.replay_only,
            speed=self.talk_screens.replay_speed,
            backend=self.backend,
            given=self._given,
        )

    monkeypatch.setattr(SpecchatApp, "run", fake_run)
    path = tmp_path / "old.json"
    path.write_text(json.dumps(conversation([{"role": "user", "content": "hello"}, V1_REPLY])))
    code, _, err = run("replay", str(path), "--speed", "0.25")
    assert code == 0, err
    assert seen["speed"] == 0.25 and seen["backend"] is None and seen["given"] is None
    assert seen["replay"].turns[-1].content == "hi"
    code, _, err = run("replay", str(path), "--speed", "3")
    assert code == 2 and "--speed" in err
