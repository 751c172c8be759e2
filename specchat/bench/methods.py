"""What a bench run compares: its methods (plain decoding, specchat's drafters and schedules,
the peers), one or more per drafter of the registry, and the settings every run shares.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from specchat.bench.llamacpp_peer import PLAIN_ROW as LLAMA_PLAIN
from specchat.bench.llamacpp_peer import SPECULATIVE_ROW as LLAMA_SPECULATIVE
from specchat.engine.registry import drafters, find_drafter
from specchat.engine.sampling import SamplingParams
from specchat.params import DRAFT_WINDOW

MethodKind = Literal["plain", "specchat", "hf", "llamacpp"]


@dataclass(frozen=True, slots=True)
class Method:
    name: str
    kind: MethodKind
    drafter: str = "none"
    """specchat: a drafter name or "none"; hf: "model" (assisted) or "none" (plain generate);
    llamacpp: "model" (its speculative server) or "none" (its plain one)."""
    schedule: str = "fixed"
    gamma: int = 0
    """Fixed γ, the starting γ of a schedule, or HF's num_assistant_tokens (0 = transformers' defaults)."""

    @property
    def sweep_gamma(self) -> int | None:
        """γ of specchat's fixed-γ run with a draft model (the points of the γ sweep), else None.

        Peers' speculative rows draft a fixed γ too, but they are lines of their own, not points
        of specchat's curve."""
        if self.kind != "specchat" or self.schedule != "fixed" or self.gamma <= 0:
            return None
        spec = find_drafter(self.drafter)
        if spec is not None and spec.bench == "sweep":
            return self.gamma
        return None

    @property
    def speculative(self) -> bool:
        return self.drafter != "none"


PLAIN = Method("plain", "plain")


def build_methods(
    gammas: Sequence[int],
    *,
    start_gamma: int = 4,
    ngram_gamma: int = 4,
    schedules: Sequence[str] = ("heuristic", "adaptive"),
    hf_gammas: Sequence[int] = (),
    hf_plain: bool = False,
    hf_default: bool = False,
    has_draft: bool = True,
    hybrid: bool = True,
    llama_cpp_draft_max: int | None = None,
) -> list[Method]:
    """Every method of a bench run, one or more per drafter of the registry (in its order);
    ``llama_cpp_draft_max`` (its --spec-draft-n-max) adds llama.cpp's rows.

    ``ngram_gamma`` (the CLI's --ngram-gamma) is the γ of every lookup drafter's row, and
    ``hybrid`` keeps the rows of combined drafters; both read the registry's ``kind``."""
    methods = [PLAIN]
    for spec in drafters():
        if spec.needs_draft_model and not has_draft:
            continue
        if spec.bench == "sweep":
            methods += [Method(f"fixed-{g}", "specchat", spec.name, "fixed", g) for g in gammas]
            methods += [Method(s, "specchat", spec.name, s, start_gamma) for s in schedules]
        elif spec.bench == "row" and (hybrid or spec.kind != "combined"):
            gamma = ngram_gamma if spec.is_lookup else start_gamma
            methods.append(Method(spec.name, "specchat", spec.name, spec.bench_schedule, gamma))
    if hf_plain:
        methods.append(Method("hf-plain", "hf"))
    if has_draft:
        methods += [Method(f"hf-assisted-{g}", "hf", "model", "constant", g) for g in hf_gammas]
        if hf_default:
            methods.append(Method("hf-assisted-default", "hf", "model", "default", 0))
    if llama_cpp_draft_max is not None:
        methods.append(Method(LLAMA_PLAIN, "llamacpp"))
        if has_draft:
            methods.append(Method(LLAMA_SPECULATIVE, "llamacpp", "model", "fixed", llama_cpp_draft_max))
    return methods


@dataclass(frozen=True, slots=True)
class BenchSettings:
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float = 1.0
    seed: int | None = 0
    draft_window: int = DRAFT_WINDOW
    """The draft's window (Controls.draft_window; 0: none)."""

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_k, self.top_p)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
