"""Typed views the tests take of what the engine hands back as a union or duck-types.

Each helper asserts what the test knows (a CPU draft is read back to the host, "model" names the
draft model's drafter), so mypy checks the attribute the test then reads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from specchat.engine.drafters import DeviceDraft, Draft, ModelDrafter

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from specchat.engine.session import ChatEngine


def host_draft(draft: Draft | DeviceDraft) -> Draft:
    """A draft read back to the host: what a draft on the CPU always proposes."""
    assert isinstance(draft, Draft), "a draft on the CPU is read back"
    return draft


def model_drafter(engine: ChatEngine) -> ModelDrafter:
    """The engine's draft-model drafter (the engine was given a draft model)."""
    drafter = engine.drafter("model")
    assert isinstance(drafter, ModelDrafter)
    return drafter


def decoded(tokenizer: PreTrainedTokenizerBase, ids: list[int]) -> str:
    """One sequence's text (decode returns a list only for a batch)."""
    text = tokenizer.decode(ids)
    assert isinstance(text, str)
    return text
