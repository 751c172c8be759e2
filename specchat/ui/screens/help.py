"""The help screen: every key in force (after remapping) and what the colours mean."""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import ClassVar

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from specchat.engine.display import REJECTED
from specchat.engine.events import TOKEN_KINDS
from specchat.engine.registry import DRAFT_STOP_BELOW
from specchat.presenters.kind_labels import KIND_HELP, KIND_LABELS
from specchat.ui.settings.keys import (
    APP_KEYS,
    KEYS_BY_ID,
    PROMPT_KEYS,
    TEXTUAL_KEYS,
    display_key,
    effective_key,
)
from specchat.ui.settings.themes import TokenPalette


class HelpScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q", "dismiss", "Close")]

    def __init__(self, keymap: Mapping[str, str], palette: TokenPalette | None = None) -> None:
        super().__init__()
        self.keymap = keymap
        self.palette = palette if palette is not None else TokenPalette()

    def compose(self) -> ComposeResult:
        with Vertical(id="help-box"):
            yield Static(Text("Keys · Esc closes", style="bold"), id="help-title")
            with VerticalScroll():
                yield Static(id="help-body")

    def on_mount(self) -> None:
        self.query_one("#help-box").border_title = "specchat help"
        self.query_one("#help-body", Static).update(self._body())

    def plain_text(self, width: int = 100) -> str:
        """The help as plain text (for tests and for anyone piping it)."""
        console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
        console.print(self._body())
        return console.export_text()

    def _body(self) -> Group:
        keys = Table(box=None, padding=(0, 2), show_header=True, header_style="bold", expand=True)
        keys.add_column("key", no_wrap=True)
        keys.add_column("action", ratio=1)
        keys.add_column(Text("id for [keys] in config.toml"), style="dim", no_wrap=True)
        for spec in (*PROMPT_KEYS, *APP_KEYS):
            keys.add_row(display_key(effective_key(spec, self.keymap)), spec.description, spec.id)
        for key, what in TEXTUAL_KEYS:
            keys.add_row(display_key(key) if "/" not in key else key, what, "")

        styles = self.palette.styles
        kinds = Table(box=None, padding=(0, 2), show_header=False, expand=True)
        kinds.add_column(no_wrap=True)
        kinds.add_column(ratio=1)
        for kind in TOKEN_KINDS:
            kinds.add_row(Text(f" {KIND_LABELS[kind]} ", styles.get(kind, "")), KIND_HELP[kind])
        kinds.add_row(
            Text(" rejected draft ", styles.get(REJECTED, "strike")),
            "a draft the target threw away, struck through before the correction that replaced it "
            "(not part of the reply)",
        )

        reasoning_key = display_key(effective_key(KEYS_BY_ID["reasoning"], self.keymap))
        figures = Text.from_markup(
            "[b]α[/b] share of drafted tokens the target accepted "
            "(whole conversation; rolling: recent rounds)\n"
            "[b]τ[/b] tokens per round: accepted drafts plus the closing token\n"
            "[b]tokens/s[/b] the current reply (the engine's own figure once it ends); the sparkline "
            "shows each round\n"
            "[b]γ[/b] most tokens drafted per round (the draft model stops sooner where its most likely "
            f"token had less than {DRAFT_STOP_BELOW}); F2/F3 change it for the next round\n"
            "[b]inspector[/b] p = p_target, q = p_draft; a draft is accepted when u < min(1, p/q) "
            "(at T = 0: when it is the target's most likely token); a correction is drawn from the "
            "residual norm(max(p − q, 0))\n"
            f"[b]reasoning[/b] a thinking model's reasoning, folded to one line: its tokens and its own α "
            f"(reasoning and answers accept differently); {reasoning_key} unfolds it, colours and all\n"
            "[b]replay[/b] (Ctrl+O, then r; or specchat replay FILE) Space pauses / plays, N one more "
            "round, + / − speed (×0.25 to ×4), R restart, Esc closes"
        )
        return Group(keys, Text(""), Text("What the colours mean", style="bold"), kinds, Text(""), figures)
