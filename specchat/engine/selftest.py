"""Exactness on screen: speculative decoding samples what the target alone samples.

At T > 0 :class:`ExactnessSampler` draws the first tokens of a reply to one fixed prompt again
and again, alternately by speculative decoding (the current drafter and γ, a fixed schedule, one
round per step) and by the target alone (the engine's independent plain loop), and counts each
outcome. :class:`ExactnessReport` compares the two histograms: the total variation distance, the
band sampling noise alone fills at the current sample count and how often noise alone reaches
that TV (a permutation test: the pooled samples dealt again into two lanes), and a chi-square
test of homogeneity. At T = 0 :func:`greedy_equality` instead
checks token-for-token equality on a few prompts.

Speed on a real pair: every sample reuses the prompt's KV cache (nothing is prefilled twice) and
stops as soon as it has its tokens, so a speculative sample costs γ draft passes and one verify
pass, and a target sample one pass per token.

The report's statistics run with the engine (torch); the report itself is plain data the UI
reads without loading torch.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from specchat.engine.backend import chat_messages
from specchat.engine.compare import first_difference
from specchat.engine.events import SummaryEvent, TokenEvent

if TYPE_CHECKING:
    from specchat.engine.backend import Controls, LocalBackend, Message


Outcome = tuple[int, ...]
"""The first tokens of one sampled reply (shorter when the reply ended first)."""

SELFTEST_PROMPT = "Name one fruit. Answer with a single word."
"""Short, and its first reply tokens are spread over several likely choices at T = 1."""
GREEDY_PROMPTS = (
    "Write a Python function that checks whether a number is prime.",
    "Explain in two sentences what a hash table is.",
    "Translate to French: The weather is nice today.",
)
SIGNIFICANCE = 0.01
"""A p-value below this would be evidence against exactness."""
NOISE_QUANTILE = 0.95
"""The noise band is this quantile of the TV distance between two samples of one distribution."""
NOISE_DRAWS = 400
MIN_EXPECTED = 5.0
"""Chi-square cells expecting fewer counts than this are pooled into one."""
END = "⏎end"
"""How an outcome shows that the reply stopped before all its tokens."""


# ---------------------------------------------------------------------------------- statistics


def total_variation(a: Counter[Outcome], b: Counter[Outcome]) -> float:
    """½ Σ |a(x)/n_a − b(x)/n_b|: 0 for identical histograms, 1 for disjoint ones."""
    na, nb = sum(a.values()), sum(b.values())
    if not na or not nb:
        return 0.0
    return 0.5 * sum(abs(a[x] / na - b[x] / nb) for x in set(a) | set(b))


def chi_square_homogeneity(
    a: Counter[Outcome], b: Counter[Outcome], min_expected: float = MIN_EXPECTED
) -> tuple[float, int]:
    """Pearson's statistic and degrees of freedom for "both histograms come from one distribution".

    Outcomes whose expected count in either histogram is below ``min_expected`` are pooled into
    one cell (the approximation needs about five per cell).
    """
    na, nb = sum(a.values()), sum(b.values())
    total = na + nb
    if not na or not nb:
        return 0.0, 0
    cells: list[tuple[float, float]] = []
    rare = [0.0, 0.0]
    for x in set(a) | set(b):
        pooled = (a[x] + b[x]) / total
        if min(pooled * na, pooled * nb) < min_expected:
            rare[0] += a[x]
            rare[1] += b[x]
        else:
            cells.append((a[x], b[x]))
    if sum(rare):
        cells.append((rare[0], rare[1]))
    statistic = 0.0
    for count_a, count_b in cells:
        pooled = (count_a + count_b) / total
        for count, n in ((count_a, na), (count_b, nb)):
            expected = pooled * n
            statistic += (count - expected) ** 2 / expected
    return statistic, max(len(cells) - 1, 0)


def chi_square_p_value(statistic: float, dof: int) -> float | None:
    """P(χ²_dof ≥ statistic): the regularised upper incomplete gamma Q(dof/2, statistic/2)."""
    if dof < 1:
        return None
    import torch

    q = torch.special.gammaincc(
        torch.tensor(dof / 2.0, dtype=torch.float64), torch.tensor(statistic / 2.0, dtype=torch.float64)
    )
    return float(q)


def tv_noise(
    a: Counter[Outcome], b: Counter[Outcome], *, draws: int = NOISE_DRAWS, seed: int = 0
) -> tuple[float, float]:
    """The TV distance sampling noise alone gives at these sample counts: (mean, 95th percentile)."""
    tv = tv_null_draws(a, b, draws=draws, seed=seed)
    if not len(tv):
        return 0.0, 0.0
    import numpy as np

    return float(tv.mean()), float(np.quantile(tv, NOISE_QUANTILE))


def tv_null_draws(
    a: Counter[Outcome], b: Counter[Outcome], *, draws: int = NOISE_DRAWS, seed: int = 0
) -> Any:
    """TV distances of ``draws`` re-deals of the pooled samples (a numpy array; empty without samples).

    A permutation test: if both lanes sample one distribution, which lane drew which of the
    pooled samples is arbitrary, so the pooled samples are dealt again at random into two
    histograms of the same sizes (a multivariate hypergeometric draw per deal) and their TV
    distance measured. Unlike resampling from the pooled histogram this stays honest when most
    outcomes were seen once or never.
    """
    import numpy as np

    na, nb = sum(a.values()), sum(b.values())
    if not na or not nb:
        return np.zeros(0)
    # Sorted: the same counts give the same band however they were gathered (a saved report).
    outcomes = sorted(set(a) | set(b))
    pooled = np.array([a[x] + b[x] for x in outcomes], dtype=np.int64)
    dealt = np.random.default_rng(seed).multivariate_hypergeometric(
        pooled, na, size=draws, method="marginals"
    )
    return 0.5 * np.abs(dealt / na - (pooled - dealt) / nb).sum(axis=1)


def permutation_p_value(observed: float, null_draws: Any) -> float | None:
    """P(TV ≥ observed) under the permutation null, counting the observed deal itself."""
    if not len(null_draws):
        return None
    # A small tolerance: equal histograms dealt again give float sums that differ in the last bit.
    at_least = int((null_draws >= observed - 1e-12).sum())
    return (at_least + 1) / (len(null_draws) + 1)


# ------------------------------------------------------------------------------------ reports


@dataclass(frozen=True)
class OutcomeRow:
    outcome: Outcome
    label: str
    speculative: int
    target: int


@dataclass(frozen=True)
class ExactnessReport:
    """Where a sampling self-test stands: both histograms and how far apart they are."""

    samples: int
    """Samples per lane."""
    speculative: Counter[Outcome]
    target: Counter[Outcome]
    labels: dict[Outcome, str]
    tv: float
    noise_mean: float
    noise_band: float
    """TV below this is within sampling noise (95% of same-distribution pairs stay below it)."""
    chi2: float
    dof: int
    p_value: float | None
    elapsed_s: float
    settings: dict[str, Any] = field(default_factory=dict)
    tokens: int = 2
    tv_p_value: float | None = None
    """How often sampling noise alone gives a TV at least this large (the permutation test)."""

    @property
    def within_noise(self) -> bool:
        """TV inside the 95% band: descriptive (noise alone leaves it 5% of the time)."""
        return self.tv <= self.noise_band

    @property
    def consistent(self) -> bool:
        """No evidence against exactness: neither test significant at SIGNIFICANCE.

        The verdict reads the tests' p-values at 1%, not "TV inside the 95% band": a screen
        that updates twice a second would otherwise cry wolf once in twenty looks.
        """
        return all(p is None or p >= SIGNIFICANCE for p in (self.tv_p_value, self.p_value))

    @property
    def samples_per_s(self) -> float:
        return 2 * self.samples / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def rows(self, limit: int | None = None) -> list[OutcomeRow]:
        """Outcomes by pooled count, most frequent first."""
        outcomes = sorted(
            set(self.speculative) | set(self.target),
            key=lambda x: (-(self.speculative[x] + self.target[x]), x),
        )
        return [
            OutcomeRow(x, self.labels.get(x, str(x)), self.speculative[x], self.target[x])
            for x in outcomes[:limit]
        ]

    def to_json(self) -> dict[str, object]:
        return {
            "type": "selftest",
            "samples_per_lane": self.samples,
            "tokens": self.tokens,
            "settings": self.settings,
            "tv": self.tv,
            "noise_mean": self.noise_mean,
            "noise_band": self.noise_band,
            "tv_p_value": self.tv_p_value,
            "chi2": self.chi2,
            "dof": self.dof,
            "p_value": self.p_value,
            "elapsed_s": self.elapsed_s,
            "outcomes": [
                {"ids": list(r.outcome), "text": r.label, "speculative": r.speculative, "target": r.target}
                for r in self.rows()
            ],
        }


def report_from_json(data: dict[str, Any]) -> ExactnessReport:
    """A report saved by :meth:`ExactnessReport.to_json`, its statistics recomputed from the counts."""
    if data.get("type") != "selftest" or "outcomes" not in data:
        raise ValueError("not a sampling self-test saved by specchat")
    speculative: Counter[Outcome] = Counter()
    target: Counter[Outcome] = Counter()
    labels: dict[Outcome, str] = {}
    for row in data["outcomes"]:
        outcome = tuple(int(i) for i in row["ids"])
        speculative[outcome] += int(row["speculative"])
        target[outcome] += int(row["target"])
        labels[outcome] = str(row["text"])
    return build_report(
        speculative,
        target,
        labels,
        float(data["elapsed_s"]),
        dict(data.get("settings") or {}),
        int(data.get("tokens", 2)),
    )


def build_report(
    speculative: Counter[Outcome],
    target: Counter[Outcome],
    labels: dict[Outcome, str],
    elapsed_s: float,
    settings: dict[str, Any] | None = None,
    tokens: int = 2,
) -> ExactnessReport:
    statistic, dof = chi_square_homogeneity(speculative, target)
    null = tv_null_draws(speculative, target)
    observed = total_variation(speculative, target)
    noise_mean, noise_band = (float(null.mean()), float(_quantile(null))) if len(null) else (0.0, 0.0)
    return ExactnessReport(
        samples=min(sum(speculative.values()), sum(target.values())),
        speculative=Counter(speculative),
        target=Counter(target),
        labels=dict(labels),
        tv=observed,
        noise_mean=noise_mean,
        noise_band=noise_band,
        chi2=statistic,
        dof=dof,
        p_value=chi_square_p_value(statistic, dof),
        elapsed_s=elapsed_s,
        settings=dict(settings or {}),
        tokens=tokens,
        tv_p_value=permutation_p_value(observed, null),
    )


def _quantile(values: Any) -> float:
    import numpy as np

    return float(np.quantile(values, NOISE_QUANTILE))


# ------------------------------------------------------------------------------------ sampling


class ExactnessSampler:
    """Samples the first ``tokens`` tokens of one prompt's reply, speculatively and plainly.

    The speculative lane runs the engine's step API with the current drafter and γ under a fixed
    schedule (the adaptive one may switch drafting off, and then there is nothing to test); each
    sample stops after the round that completed its tokens. The target lane is the engine's
    independent plain loop. Sample i of each lane has its own seed, so a run is repeatable.
    """

    def __init__(
        self,
        engine: LocalBackend,
        messages: Sequence[Message],
        controls: Controls,
        *,
        tokens: int = 2,
        seed: int = 0,
    ) -> None:
        if controls.temperature <= 0:
            raise ValueError("the sampling self-test needs a temperature above 0")
        self.engine = engine
        self.tokens = tokens
        self.seed = seed
        self.prompt_ids = engine.prompt_ids(messages)
        # Room for γ drafts in the first round: the engine never drafts past the token budget.
        self.speculative_controls = replace(
            controls, schedule="fixed", max_new_tokens=max(controls.gamma + 1, tokens)
        )
        self.target_controls = replace(controls, max_new_tokens=tokens)
        self.speculative_controls.validate()
        self.speculative: Counter[Outcome] = Counter()
        self.target: Counter[Outcome] = Counter()
        self.labels: dict[Outcome, str] = {}
        self.elapsed_s = 0.0

    @property
    def samples(self) -> int:
        return min(sum(self.speculative.values()), sum(self.target.values()))

    @property
    def settings(self) -> dict[str, Any]:
        c = self.speculative_controls
        return {
            "gamma": c.gamma,
            "drafter": c.drafter,
            "temperature": c.temperature,
            "top_k": c.top_k,
            "top_p": c.top_p,
            "tokens": self.tokens,
        }

    def sample_pair(self) -> None:
        """One sample of each lane."""
        start = time.perf_counter()
        index = self.samples
        found = self._speculative_sample(self.seed + 2 * index)
        self.speculative[found] += 1
        plain = self._target_sample(self.seed + 2 * index + 1)
        self.target[plain] += 1
        self.elapsed_s += time.perf_counter() - start

    def run(
        self,
        samples: int,
        *,
        cancel: threading.Event | None = None,
        report_every: float = 0.5,
        on_report: Callable[[ExactnessReport], None] | None = None,
    ) -> ExactnessReport:
        """Sample until ``samples`` per lane (or ``cancel``), reporting every ``report_every`` s."""
        last = time.monotonic()
        while self.samples < samples and not (cancel is not None and cancel.is_set()):
            self.sample_pair()
            if on_report is not None and time.monotonic() - last >= report_every:
                on_report(self.report())
                last = time.monotonic()
        report = self.report()
        if on_report is not None:
            on_report(report)
        return report

    def report(self) -> ExactnessReport:
        return build_report(
            self.speculative, self.target, self.labels, self.elapsed_s, self.settings, self.tokens
        )

    def _speculative_sample(self, seed: int) -> Outcome:
        controls = replace(self.speculative_controls, seed=seed)
        reply = self.engine.start_ids(self.prompt_ids, controls)
        got: list[TokenEvent] = []
        while not reply.done and len(got) < self.tokens:
            got.extend(e for e in reply.step() if isinstance(e, TokenEvent))
        if not reply.done:
            reply.finish()
        return self._outcome(got[: self.tokens])

    def _target_sample(self, seed: int) -> Outcome:
        controls = replace(self.target_controls, seed=seed)
        got = [e for e in self.engine.stream_plain(self.prompt_ids, controls) if isinstance(e, TokenEvent)]
        return self._outcome(got[: self.tokens])

    def _outcome(self, tokens: list[TokenEvent]) -> Outcome:
        outcome = tuple(t.token_id for t in tokens)
        if outcome not in self.labels:
            pieces = [self.engine.token_text(t) for t in outcome]
            if len(outcome) < self.tokens:
                pieces.append(END)
            self.labels[outcome] = "".join(pieces)
        return outcome


# ------------------------------------------------------------------------------------ greedy


@dataclass(frozen=True)
class GreedyCheck:
    """One prompt decoded greedily both ways."""

    prompt: str
    plain_ids: tuple[int, ...]
    speculative_ids: tuple[int, ...]
    text: str
    """The plain reply's text."""
    alpha: float | None

    @property
    def identical(self) -> bool:
        return self.plain_ids == self.speculative_ids

    @property
    def first_difference(self) -> int | None:
        return first_difference(self.plain_ids, self.speculative_ids)

    def to_json(self) -> dict[str, object]:
        return {
            "prompt": self.prompt,
            "tokens": len(self.plain_ids),
            "identical": self.identical,
            "first_difference": self.first_difference,
            "alpha": self.alpha,
            "text": self.text,
        }


def greedy_equality(
    engine: LocalBackend,
    controls: Controls,
    prompts: Sequence[str] = GREEDY_PROMPTS,
    *,
    system_prompt: str | None = None,
    cancel: threading.Event | None = None,
) -> Iterator[GreedyCheck]:
    """Each prompt decoded at T = 0 plainly and speculatively (current drafter and γ)."""
    greedy = replace(controls, temperature=0.0)
    for prompt in prompts:
        if cancel is not None and cancel.is_set():
            return
        ids = engine.prompt_ids(chat_messages(system_prompt, prompt))
        plain = [e for e in engine.stream_plain(ids, greedy, cancel) if isinstance(e, TokenEvent)]
        alpha: float | None = None
        speculative: list[TokenEvent] = []
        for event in engine.stream_ids(ids, greedy, cancel):
            if isinstance(event, TokenEvent):
                speculative.append(event)
            elif isinstance(event, SummaryEvent):
                alpha = event.alpha
        if cancel is not None and cancel.is_set():
            return  # a stream cut short is no evidence: the lanes would differ in length
        yield GreedyCheck(
            prompt,
            tuple(e.token_id for e in plain),
            tuple(e.token_id for e in speculative),
            "".join(e.text for e in plain),
            alpha,
        )


def selftest_messages(prompt: str = SELFTEST_PROMPT, system_prompt: str | None = None) -> list[Message]:
    return chat_messages(system_prompt, prompt)


def expected_noise(speculative: Counter[Outcome], target: Counter[Outcome]) -> float:
    """The normal approximation of the mean TV between two same-distribution samples:
    Σ √(p(1−p)(1/n_a + 1/n_b) / (2π)). Cheap, and a check on the simulation in tests."""
    na, nb = sum(speculative.values()), sum(target.values())
    if not na or not nb:
        return 0.0
    total = na + nb
    spread = 1.0 / na + 1.0 / nb
    return sum(
        math.sqrt(p * (1 - p) * spread / (2 * math.pi))
        for x in set(speculative) | set(target)
        if 0 < (p := (speculative[x] + target[x]) / total) < 1
    )
