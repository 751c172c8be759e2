"""Every front end builds its backend through specchat.opening.open_backend, and the bench's model
options are the shared ones."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import click
import pytest
from click.testing import CliRunner

from specchat import opening
from specchat.cli import main
from specchat.cli.bench_command import bench
from specchat.cli.options import LOADING_OPTIONS, SAMPLING_OPTIONS, model_options
from specchat.config import Settings
from specchat.errors import SpecchatError
from specchat.ui.workers import bridge


class Opened(SpecchatError):
    """Raised by the stand-in for open_backend: the command got as far as opening its backend."""


def record_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Settings, dict[str, Any]]]:
    calls: list[tuple[Settings, dict[str, Any]]] = []

    def fake_open(settings: Settings, progress: Any = None, **kwargs: Any) -> opening.OpenedBackend:
        calls.append((settings, kwargs))
        raise Opened("open_backend was called")

    monkeypatch.setattr(opening, "open_backend", fake_open)
    return calls


@pytest.mark.parametrize(
    "args",
    [
        ["generate", "hello", "--drafter", "ngram", "--target", "some-target"],
        ["race", "hello", "--drafter", "ngram", "--target", "some-target"],
        ["selftest", "--drafter", "ngram", "--target", "some-target"],
        ["generate", "hello", "--server", "http://127.0.0.1:9"],
    ],
)
def test_the_cli_commands_open_their_backend_through_open_backend(
    monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    calls = record_calls(monkeypatch)
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2 and "open_backend was called" in result.stderr, result.stderr
    [(settings, _)] = calls
    assert settings.target == "some-target" or settings.server == "http://127.0.0.1:9"


def test_the_tui_bridge_opens_through_open_backend(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[dict[str, Any]] = []
    engine = object()

    def fake_open(settings: Settings, progress: Any = None, **kwargs: Any) -> opening.OpenedBackend:
        calls.append(kwargs)
        return opening.OpenedBackend(engine, "t", "d", device="cpu", kernels="int8/dyn8", notes=("n",))  # type: ignore[arg-type]

    monkeypatch.setattr(opening, "open_backend", fake_open)
    loaded = bridge.load_backend(Settings(), lambda event: None)
    assert calls == [{"every_drafter": True}]
    assert loaded == bridge.LoadedBackend(engine, "t", "d", "cpu · int8/dyn8", ("n",))  # type: ignore[arg-type]


@pytest.mark.parametrize("extra", [[], ["--check"]])
def test_the_bench_opens_through_open_backend(monkeypatch: pytest.MonkeyPatch, extra: list[str]) -> None:
    calls = record_calls(monkeypatch)
    result = CliRunner().invoke(bench, ["--quick", "--target", "some-target", "--draft", "none", *extra])
    assert result.exit_code == 2 and "open_backend was called" in result.stderr, result.stderr
    [(settings, kwargs)] = calls
    assert settings.target == "some-target" and settings.draft is None
    assert kwargs["hf_peer"] is True and kwargs["every_drafter"] is True


def _described(command: click.Command, names: tuple[str, ...]) -> list[tuple[Any, ...]]:
    return sorted(
        (str(p.name), tuple(p.opts), repr(p.type), repr(p.default), getattr(p, "help", None))
        for p in command.params
        if p.name in names
    )


def test_the_bench_takes_the_shared_model_options() -> None:
    @click.command()
    @model_options
    def reference(**options: Any) -> None: ...

    names = LOADING_OPTIONS + SAMPLING_OPTIONS
    assert _described(bench, names) == _described(reference, names)
    assert {p.name for p in bench.params} >= set(names)


@pytest.mark.parametrize(
    ("available", "expected"), [(["ngram", "none"], "ngram"), (["none"], "none"), (["model"], "none")]
)
def test_the_drafter_fallback_comes_from_the_registry(available: list[str], expected: str) -> None:
    controls, note = opening.controls_for(Settings(drafter="hybrid"), available)
    assert controls.drafter == expected and note is not None and expected in note


def test_only_a_draft_the_user_named_counts_as_chosen(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    from specchat.config import load_settings

    config = tmp_path / "config.toml"
    config.write_text('target = "mine.gguf"\n')
    assert opening.draft_is_default(load_settings({}, config))
    assert not opening.draft_is_default(load_settings({"draft": "small.gguf"}, config))
    monkeypatch.setenv("SPECCHAT_DRAFT", "small.gguf")
    assert not opening.draft_is_default(load_settings({}, config))


def test_a_command_falls_back_to_a_drafter_that_needs_no_draft_and_says_so(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from specchat.cli.load_progress import controls_after_loading

    class Loaded:
        available_drafters = ("ngram", "none")

    controls = controls_after_loading(Settings(drafter="hybrid"), Loaded())  # type: ignore[arg-type]
    assert controls.drafter == "ngram"
    assert capsys.readouterr().err.strip() == (
        "specchat: drafter 'hybrid' is not available (no draft model loaded): using ngram."
    )


class _Model:
    """A loaded model's stand-in that holds a reference cycle, as torch modules do."""

    def __init__(self) -> None:
        self.itself = self


@pytest.fixture
def unfrozen_after() -> Any:
    yield
    gc.unfreeze()


def test_a_local_open_freezes_what_loading_made_and_the_next_open_frees_it(
    monkeypatch: pytest.MonkeyPatch, unfrozen_after: None
) -> None:
    loaded: list[_Model] = []

    def fake_load(
        settings: Settings, draft: str | None, progress: Any = None, **kwargs: Any
    ) -> opening.OpenedBackend:
        loaded.append(_Model())
        return opening.OpenedBackend(object(), "t", None)  # type: ignore[arg-type]

    monkeypatch.setattr(opening, "load_local", fake_load)
    opening.open_backend(Settings(draft=None, drafter="ngram"))
    first = weakref.ref(loaded.pop())
    assert first() is not None
    tracked = gc.get_objects()
    assert not any(obj is first() for obj in tracked), "full collections would still walk the models"
    del tracked
    opening.open_backend(
        Settings(draft=None, drafter="ngram")
    )  # a reload: the first pair's cycles are garbage now
    assert first() is None and gc.get_freeze_count() > 0
