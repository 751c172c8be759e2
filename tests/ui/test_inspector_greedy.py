"""At T = 0 the inspector shows each model's own softmax beside the rule that decided: argmax
match at T = 0, min(1, p/q) at T > 0; a lookup says it has no probability."""

from __future__ import annotations

import pytest
from rich.console import Console

from specchat.engine.events import UNKNOWN, DraftTrace, RoundEvent, TokenEvent
from specchat.testing.scripted_engines import PausingEngine
from specchat.ui.settings.themes import TokenPalette
from specchat.ui.state.live import Inspected
from specchat.ui.widgets.inspector import InspectorPanel, prob

from .conftest import SIZE, make_app, send, wait_idle

pytestmark = pytest.mark.anyio


def plain(renderable: object, width: int = 140) -> str:
    console = Console(width=width, record=True, color_system=None, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(renderable)
    return console.export_text()


def describe(draft: DraftTrace, drafter: str = "model", kind: str = "accepted") -> str:
    """The inspector's text for the round's first token, standing on ``draft``."""
    accepted = int(draft.verdict == "accepted")
    round_event = RoundEvent(0, 1, 1, accepted, 1.0, 2.0, drafter, (draft,))
    token = TokenEvent(kind, draft.token_id, draft.text, 0, 0, draft.p_target, draft.p_draft, "draft")  # type: ignore[arg-type]
    panel = InspectorPanel(TokenPalette())
    return plain(panel.describe(Inspected(token, round_event, 0, 0)))


async def test_an_accepted_greedy_draft_shows_both_models_own_softmax(engine: PausingEngine) -> None:
    app = make_app(engine)  # T = 0, the model drafter
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "hello there")
        await wait_idle(pilot, app)
        rounds = {r.round: r for r in engine.rounds}
        index = next(i for i, t in enumerate(engine.tokens) if t.kind == "accepted" and t.text)
        token = engine.tokens[index]
        app.main_screen.inspector.inspect_token(len(app.transcript.replies()) - 1, index)
        await pilot.pause()
        text = plain(app.main_screen.query_one(InspectorPanel).content)
    draft = rounds[token.round].drafts[token.position]
    assert draft.p_draft_own < 1.0  # the tiny draft model is never sure: not a one-hot row
    assert "rule at T = 0" in text and "argmax match" in text
    row = next(line for line in text.splitlines() if "argmax match" in line)
    assert row.split("”", 1)[1].split()[:2] == [prob(draft.p_target_own), prob(draft.p_draft_own)]
    assert "each model's own softmax (T = 1)" in text


def test_a_greedy_lookup_draft_says_it_has_no_probability_instead_of_q_1() -> None:
    lookup = DraftTrace(5, "def", 0.977, 1.0, 0.977, None, "accepted", 0.977, UNKNOWN)
    text = describe(lookup, drafter="ngram")
    row = next(line for line in text.splitlines() if "“def”" in line and "argmax" in line)
    assert "lookup" in row and "1.000" not in row
    assert "no probability of its own" in text


def test_a_sure_model_does_not_read_as_a_one_hot_row() -> None:
    assert prob(0.99996) == "0.99996"
    assert prob(0.9996) == "0.9996"
    assert prob(1.0 - 1e-9).startswith(">0.99999")
    assert prob(1.0) == "1.000" and prob(0.977) == "0.977"
    sure = DraftTrace(5, "def", 0.99996, 0.9991, 1.0, None, "accepted", 0.99996, 0.9991)
    assert "0.99996" in describe(sure)


def test_a_sampled_draft_shows_the_paper_s_test_and_the_own_softmax_under_it() -> None:
    shaped = DraftTrace(5, "x", 0.0, 0.25, 0.0, 0.4, "rejected", 0.0312, UNKNOWN)
    text = describe(shaped, kind="correction")
    assert "min(1, p/q)" in text and "0.400" in text and "rule at T = 0" not in text
    assert "own softmax (T = 1, before temperature, top-k, top-p): target 0.031 · draft –" in text


def test_a_greedy_trace_saved_before_the_own_figures_shows_its_softmax() -> None:
    """A v2 file holds no own figures; at T = 0 its p_target and p_draft are the softmax."""
    older = DraftTrace(5, "def", 0.81, 0.62, 1.0, None, "accepted")
    row = next(line for line in describe(older).splitlines() if "argmax match" in line)
    assert "0.810" in row and "0.620" in row


def test_a_draft_s_control_characters_are_shown_not_obeyed() -> None:
    """The step table and the top candidates quote model text: a token may hold ESC or C1."""
    hostile = DraftTrace(5, "\x1b[2J\x9b31m\n", 0.5, 0.4, 0.5, None, "accepted", 0.5, 0.4)
    text = describe(hostile)
    assert "\x1b" not in text and "\x9b" not in text
    assert "“^[[2J\\x9b31m↵”" in text


def test_a_race_lane_shows_control_characters_visibly() -> None:
    from specchat.engine.events import SummaryEvent
    from specchat.engine.race import LaneToken, RaceLane
    from specchat.presenters.race_text import lane_text

    tokens = (LaneToken(0.1, "ok\x1b]0;title\x07", "target", 1),)
    summary = SummaryEvent(1, 1, 0, 0, None, None, 10.0, (), "max_tokens", 0.0, 0.1, 1)
    shown = lane_text(RaceLane("plain", tokens, 0.2, summary), 1.0, {}).plain
    assert shown == "ok^[]0;title^G"
