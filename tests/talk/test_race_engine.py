"""The race runner on tiny models: both lanes measured, replayable, exported and read back."""

from __future__ import annotations

import json
import threading

import pytest

from specchat.engine.backend import Controls
from specchat.engine.events import SummaryEvent
from specchat.engine.race import LaneToken, RaceCancelled, RaceLane, RaceResult, run_race
from specchat.engine.session import ChatEngine

MESSAGES = [{"role": "user", "content": "the cat sat on the mat. the cat sat on"}]


def test_greedy_race_lanes_are_identical_and_figures_come_from_the_lanes(engine: ChatEngine) -> None:
    seen: list[tuple[str, int]] = []
    result = run_race(
        engine,
        MESSAGES,
        Controls(gamma=3, drafter="model", max_new_tokens=30),
        progress=lambda lane, n: seen.append((lane, n)),
        warm_up_tokens=2,
        models={"target": "tiny-target", "draft": "tiny-draft"},
    )
    assert result.greedy and result.identical and result.first_difference is None
    assert len(result.plain.tokens) == len(result.speculative.tokens) > 0
    assert {kind for kind in (t.kind for t in result.plain.tokens)} == {"target"}
    assert seen[0] == ("plain", 1) and seen[-1] == ("speculative", len(result.speculative.tokens))
    for lane in (result.plain, result.speculative):
        times = [t.t for t in lane.tokens]
        assert times == sorted(times) and times[0] > 0 and times[-1] <= lane.wall_s
        assert lane.tokens_per_s == pytest.approx(len(lane.tokens) / (lane.wall_s - lane.prefill_s))
    assert result.speedup == pytest.approx(result.speculative.tokens_per_s / result.plain.tokens_per_s)
    assert result.alpha == result.speculative.summary.alpha and result.tau == result.speculative.summary.tau
    assert result.settings["gamma"] == 3 and result.models["target"] == "tiny-target"


def test_sampled_race_is_two_samples(engine: ChatEngine) -> None:
    result = run_race(
        engine, MESSAGES, Controls(gamma=2, drafter="model", temperature=1.0, seed=3, max_new_tokens=20)
    )
    assert not result.greedy
    assert result.settings["temperature"] == 1.0


def lane(times: list[float], wall: float, prefill_ms: float) -> RaceLane:
    summary = SummaryEvent(
        len(times), len(times), 0, 0, None, None, 0.0, (), "max_tokens", prefill_ms, 0.0, 3
    )
    tokens = tuple(LaneToken(t, "x", "target", 7) for t in times)
    return RaceLane("plain", tokens, wall, summary)


def test_replay_positions_and_rates() -> None:
    plain = lane([0.2, 0.3, 0.4, 0.5], 0.5, 100.0)
    assert plain.shown_at(0.0) == 0 and plain.shown_at(0.3) == 2 and plain.shown_at(9) == 4
    assert plain.rate_at(0.05) is None  # still reading the prompt
    assert plain.rate_at(0.3) == pytest.approx(2 / 0.2)
    assert plain.tokens_per_s == pytest.approx(4 / 0.4)
    assert not plain.finished_at(0.49) and plain.finished_at(0.5)


def test_json_round_trip(engine: ChatEngine) -> None:
    result = run_race(engine, MESSAGES, Controls(gamma=3, drafter="model", max_new_tokens=12))
    data = json.loads(json.dumps(result.to_json()))
    assert data["lanes"]["plain"]["tokens"][0].keys() == {"t", "text", "kind", "id"}
    back = RaceResult.from_json(data)
    assert back.plain.token_ids == result.plain.token_ids
    assert back.speculative.tokens[-1].t == pytest.approx(result.speculative.tokens[-1].t, abs=1e-6)
    assert back.speedup == pytest.approx(result.speedup, rel=1e-4)
    with pytest.raises(ValueError):
        RaceResult.from_json({"type": "conversation"})


def test_a_cancelled_race_says_so(engine: ChatEngine) -> None:
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(RaceCancelled):
        run_race(engine, MESSAGES, Controls(gamma=3, drafter="model", max_new_tokens=12), cancel=cancel)
