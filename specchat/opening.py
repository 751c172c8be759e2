"""Opening a backend from settings: the one way chat, generate, race, selftest, the TUI's load
worker and the bench turn a :class:`~specchat.config.Settings` into what the engine runs on.

:func:`open_backend` attaches to ``settings.server`` when one is set, and otherwise loads the
target (and the draft) on the CPU kernels ``settings.cpu_path`` chooses, reporting each stage
through ``progress``. The drafter's need for a draft model is checked here, before anything
loads, from the drafter registry (:mod:`specchat.engine.registry`).

Pure Python at import time: torch, transformers and the HTTP client load inside the functions.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from specchat.engine.registry import drafter_spec, drafters
from specchat.errors import InvalidSettingError

if TYPE_CHECKING:
    from specchat.config import Settings
    from specchat.engine.backend import Backend, Controls
    from specchat.engine.session import ChatEngine
    from specchat.models import LoadProgress
    from specchat.models.loading.loader import DecodingPair

Progress = Callable[["LoadProgress"], None]


@dataclass(frozen=True)
class OpenedBackend:
    """A backend and what the front ends say about it."""

    backend: Backend
    target_name: str
    draft_name: str | None
    device: str = ""
    """Where the models run ("cpu", "cuda:0"); empty for a server."""
    kernels: str = ""
    """The CPU path applied ("int8/dyn8+head32768", "none"); empty for a server."""
    dtype: str | None = None
    quant: str | None = None
    notes: tuple[str, ...] = ()
    """Lines to show the user once (what a server cannot report)."""
    peer: tuple[Any, Any] | None = None
    """The Hugging Face target and draft sharing the engine's layers, for the bench's peer rows
    (only with ``hf_peer``; None where that peer cannot run on the chosen kernels)."""

    @property
    def label(self) -> str:
        """Where and how it runs, for status lines: "cpu · int8/dyn8+head32768"."""
        if not self.kernels or self.kernels == "none":
            return self.device
        return f"{self.device} · {self.kernels}"


def draft_to_load(settings: Settings, *, every_drafter: bool = False) -> str | None:
    """The draft model to load: the named one when the drafter needs it (or when any drafter may
    be switched to later, ``every_drafter``). A drafter that needs one, with none named, is
    refused here, before anything loads."""
    needs_draft = drafter_spec(settings.drafter).needs_draft_model
    if needs_draft and not settings.draft and not every_drafter:
        raise InvalidSettingError(
            f"--drafter {settings.drafter} needs a draft model: pass --draft, or use --drafter ngram."
        )
    return (settings.draft or None) if needs_draft or every_drafter else None


def draft_is_default(settings: Settings) -> bool:
    """Whether the draft is the settings' default rather than one the user named (flag, variable
    or file): a default draft that cannot draft for the user's target is dropped with a notice,
    a named one is refused."""
    return "draft" not in settings.model_fields_set


def open_backend(
    settings: Settings,
    progress: Progress | None = None,
    *,
    every_drafter: bool = False,
    hf_peer: bool = False,
    lean: bool = True,
) -> OpenedBackend:
    """The backend ``settings`` describe: a server connection, or the local engine on its models.

    ``every_drafter`` loads the named draft model whatever the drafter (the chat switches
    drafters while it runs; the bench runs them all); otherwise a draft is loaded only for a
    drafter that needs one. ``hf_peer`` (the bench) keeps the Hugging Face models beside the
    engine where the kernels allow; ``lean`` False decodes with their stock forward.
    """
    if settings.server:
        return connect_server(settings)
    draft = draft_to_load(settings, every_drafter=every_drafter)
    gc.unfreeze()  # what an earlier load froze (a test's, a reload's) is collectable again
    opened = load_local(settings, draft, progress, hf_peer=hf_peer, lean=lean)
    _freeze_what_loading_made()
    return opened


def _freeze_what_loading_made() -> None:
    """Take the objects that exist once the models are loaded (torch's, transformers', the
    tokenizer's: about 400,000) out of the garbage collector's reach. Without this every full
    collection walks them all, stalling a reply for 0.1-0.3 s each time the chat's or the
    bench's own objects set one off; frozen, it walks only what decoding and the screen made."""
    gc.collect()
    gc.freeze()


def load_local(
    settings: Settings,
    draft: str | None,
    progress: Progress | None = None,
    *,
    hf_peer: bool = False,
    lean: bool = True,
) -> OpenedBackend:
    """Load the target and ``draft`` as the settings say, and build the engine on them."""
    if hf_peer or not lean:
        return _load_with_peer(settings, draft, progress, lean=lean)
    from specchat.models import load_for_decoding

    pair = load_for_decoding(
        settings.target,
        draft,
        device=settings.device,
        dtype=settings.dtype,
        quant=settings.quant,
        cpu_path=settings.cpu_path,
        progress=progress,
        draft_optional=draft_is_default(settings),
    )
    return _engine_on(pair, quant=settings.quant)


def _engine_on(pair: DecodingPair, *, quant: str | None = None, dtype: str | None = None) -> OpenedBackend:
    """The engine on a loaded pair, described for the front ends."""
    return _opened_engine(
        (pair.target, pair.tokenizer, pair.draft),
        (pair.target_name, pair.draft_name),
        device=str(pair.device),
        kernels=pair.kernels,
        dtype=dtype,
        quant=quant,
    )


def _opened_engine(
    models: tuple[Any, Any, Any],
    names: tuple[str, str | None],
    *,
    device: str,
    kernels: str,
    dtype: str | None,
    quant: str | None,
    peer: tuple[Any, Any] | None = None,
) -> OpenedBackend:
    """The local engine on (target, tokenizer, draft), with the names and the description the
    front ends show: the one place a ChatEngine becomes an OpenedBackend."""
    from specchat.engine.session import ChatEngine

    target, tokenizer, draft = models
    return OpenedBackend(
        ChatEngine(target, tokenizer, draft),
        names[0],
        names[1],
        device=device,
        kernels=kernels,
        dtype=dtype,
        quant=quant,
        peer=peer,
    )


def connect_server(settings: Settings) -> OpenedBackend:
    """Probe ``settings.server`` and attach to it."""
    from specchat.remote import connect

    assert settings.server
    backend = connect(settings.server, timeout=settings.server_timeout, verify=settings.server_verify_tls)
    return OpenedBackend(backend, backend.label, None, notes=tuple(backend.notes))


def _load_with_peer(
    settings: Settings, draft: str | None, progress: Progress | None, *, lean: bool
) -> OpenedBackend:
    """The bench's loading: on specchat's own kernels the packed models, exactly as chat runs
    them (Hugging Face's ``generate`` cannot run those, so no peer); elsewhere the float models
    loaded once, both the engine and the Hugging Face peer running on the same prepared layers."""
    from specchat.models import load_for_decoding, load_pair
    from specchat.models.compute.cpu_quant import prepare_cpu_pair
    from specchat.models.loading.loader import choose_cpu_path

    chosen = choose_cpu_path(settings.cpu_path, settings.device, settings.quant, progress)
    if chosen is not None and chosen.native:
        pair = load_for_decoding(
            settings.target,
            draft,
            cpu_path=str(chosen),
            progress=progress,
            draft_optional=draft_is_default(settings),
        )
        return _engine_on(pair, dtype="float32")
    target_lm, draft_lm = load_pair(
        settings.target,
        draft,
        device=settings.device,
        dtype=settings.dtype,
        quant=settings.quant,
        progress=progress,
        draft_optional=draft_is_default(settings),
    )
    if progress is not None:
        from specchat.models import LoadProgress

        progress(LoadProgress("CPU kernels", "kernels", 0, 1, "preparing CPU kernels…"))
    cpu_path = str(chosen) if chosen is not None else settings.cpu_path
    prepared = prepare_cpu_pair(target_lm.model, draft_lm.model if draft_lm else None, cpu_path, lean=lean)
    # Prepared models (or their lean wrappers) offer the forward, config and device the engine uses.
    return _opened_engine(
        (prepared.target, target_lm.tokenizer, prepared.draft),
        (target_lm.name, draft_lm.name if draft_lm else None),
        device=str(target_lm.device),
        kernels=prepared.path + (" (lean forward)" if prepared.lean else ""),
        dtype=str(target_lm.dtype).removeprefix("torch."),
        quant=target_lm.quant,
        peer=(prepared.hf_target, prepared.hf_draft),
    )


def local_engine(opened: OpenedBackend) -> ChatEngine:
    """The local engine behind ``opened``, for what times and counts tokens itself (the race, the
    self-test, the bench): a server is refused in one line."""
    from specchat.engine.session import ChatEngine

    if not isinstance(opened.backend, ChatEngine):
        raise InvalidSettingError(f"{opened.target_name} is a server: this needs local models.")
    return opened.backend


def fallback_drafter(available: Sequence[str]) -> str:
    """The drafter to use when the asked one is not loaded: the registry's first available one
    that drafts without a draft model, else its entry that drafts nothing."""
    entries = drafters()
    for spec in entries:
        if spec.drafts and not spec.needs_draft_model and spec.name in available:
            return spec.name
    return next(spec.name for spec in entries if not spec.drafts)


def controls_for(settings: Settings, available: Sequence[str]) -> tuple[Controls, str | None]:
    """Controls from the settings for a backend offering the ``available`` drafters; the drafter
    falls back when the asked one is not loaded (no draft model). Returns the controls and, when
    a fallback happened, a note for the user. A server (no drafters listed) keeps the settings'."""
    drafter = settings.drafter
    note = None
    if available and drafter not in available:
        drafter = fallback_drafter(available)
        note = f"drafter {settings.drafter!r} is not available (no draft model loaded): using {drafter}."
    return controls_from(settings, drafter), note


def controls_from(settings: Settings, drafter: str | None = None) -> Controls:
    """The decoding controls the settings give (``drafter`` overrides theirs)."""
    from specchat.engine.backend import Controls

    return Controls(
        gamma=settings.gamma,
        schedule=settings.schedule,
        drafter=drafter or settings.drafter,
        temperature=settings.temperature,
        top_k=settings.top_k,
        top_p=settings.top_p,
        max_new_tokens=settings.max_new_tokens,
        seed=settings.seed,
        thinking=settings.thinking,
        raw=settings.raw,
        draft_window=settings.draft_window,
    )
