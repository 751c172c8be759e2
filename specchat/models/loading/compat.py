"""Can this draft propose tokens for this target? Only if both speak the same token ids."""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

from specchat.errors import TokenizerMismatchError

_SPECIAL = ("eos", "bos", "pad")


def check_tokenizers_compatible(
    target_tok: PreTrainedTokenizerBase,
    draft_tok: PreTrainedTokenizerBase,
    *,
    target_name: str = "the target",
    draft_name: str = "the draft",
) -> None:
    """Raise TokenizerMismatchError unless the vocabularies (token -> id) and special tokens match.

    Embedding matrices may have more rows than the vocabulary (padding to a multiple of 64 or 128),
    and they may differ between the two models; only the tokenizers are compared.
    """
    problem = tokenizer_difference(target_tok, draft_tok)
    if problem:
        raise TokenizerMismatchError(
            f"{draft_name} cannot draft for {target_name}: {problem}; pick a draft from the same model "
            "family, or use --drafter ngram, which needs no draft model"
        )


def tokenizer_difference(
    target_tok: PreTrainedTokenizerBase, draft_tok: PreTrainedTokenizerBase
) -> str | None:
    """How the two tokenizers differ, in words (the vocabulary first, then special tokens); None
    when the draft speaks the target's token ids."""
    return vocab_difference(target_tok, draft_tok) or special_difference(target_tok, draft_tok)


def vocab_difference(target_tok: PreTrainedTokenizerBase, draft_tok: PreTrainedTokenizerBase) -> str | None:
    target_vocab, draft_vocab = target_tok.get_vocab(), draft_tok.get_vocab()
    if target_vocab == draft_vocab:
        return None
    if len(target_vocab) != len(draft_vocab):
        return f"their vocabularies differ in size ({len(target_vocab)} vs {len(draft_vocab)} tokens)"
    target_ids = {i: t for t, i in target_vocab.items()}
    draft_ids = {i: t for t, i in draft_vocab.items()}
    for token_id in sorted(target_ids.keys() | draft_ids.keys()):
        ours, theirs = target_ids.get(token_id), draft_ids.get(token_id)
        if ours != theirs:
            return f"token id {token_id} is {ours!r} in the target but {theirs!r} in the draft"
    return "their vocabularies differ"  # unreachable for dicts of equal size and equal inverses


def special_difference(target_tok: PreTrainedTokenizerBase, draft_tok: PreTrainedTokenizerBase) -> str | None:
    for role in _SPECIAL:
        ours, theirs = _special(target_tok, role), _special(draft_tok, role)
        if ours != theirs:
            return f"their {role} tokens differ ({_show(ours)} vs {_show(theirs)})"
    ours_added, theirs_added = _added_special(target_tok), _added_special(draft_tok)
    if ours_added != theirs_added:
        token_id = min(ours_added.keys() ^ theirs_added.keys() or _differing(ours_added, theirs_added))
        return (
            f"their added special tokens differ at id {token_id} "
            f"({ours_added.get(token_id)!r} vs {theirs_added.get(token_id)!r})"
        )
    return None


def _special(tok: PreTrainedTokenizerBase, role: str) -> tuple[str | None, int | None]:
    return getattr(tok, f"{role}_token"), getattr(tok, f"{role}_token_id")


def _show(special: tuple[str | None, int | None]) -> str:
    token, token_id = special
    return "none" if token is None else f"{token!r} = {token_id}"


def _added_special(tok: PreTrainedTokenizerBase) -> dict[int, str]:
    return {i: t.content for i, t in tok.added_tokens_decoder.items() if t.special}


def _differing(ours: dict[int, str], theirs: dict[int, str]) -> set[int]:
    return {i for i in ours if ours[i] != theirs.get(i)}
