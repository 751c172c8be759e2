"""Every key specchat binds, with a stable id so the config file can remap it, and the command
it runs (a name in the one command table the app builds from its controllers,
:mod:`specchat.ui.state.commands`; the screen that binds the key dispatches it).

``[keys]`` in config.toml maps a binding id to one key or several (comma-separated), e.g.::

    [keys]
    gamma_up = "ctrl+up"
    gamma_down = "ctrl+down"

The help screen, the footer and the command palette all read this table, so they always
show the keys actually in force.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import ClassVar, Literal, Protocol, runtime_checkable

from textual.binding import Binding, BindingType
from textual.keys import KEY_NAME_REPLACEMENTS, Keys, key_to_character

from specchat.engine.gamma import SCHEDULES
from specchat.engine.registry import DRAFTERS


@dataclass(frozen=True)
class KeySpec:
    id: str
    key: str
    """Default key(s), Textual spelling, comma-separated."""
    command: str
    """What the key runs, by name: on the chat and talk screens a command of their table
    (:class:`~specchat.ui.state.commands.Commands`, which the app builds from its controllers);
    an ``"app"`` key's is the app's action, a message-box key's the message box's."""
    label: str
    """Short label for the footer."""
    description: str
    """One line for the help screen and the command palette."""
    show: bool = True
    """Shown in the footer."""
    priority: bool = False
    """Checked before the focused widget: the message box binds F6/F7 (select line/all)."""
    scope: Scope = "chat"
    """Where the key works (see :data:`Scope`)."""


Scope = Literal["chat", "talk", "app"]
"""Where a key works: ``"chat"``, on the chat's screen (and a replay, which is one), which runs
its command; ``"talk"``, there and on the race and self-test screens too, whose jobs run with
the same controls; ``"app"``, on every screen, including dialogs (the app's own actions)."""


APP_KEYS: tuple[KeySpec, ...] = (
    KeySpec(
        "help", "f1", "help", "Help", "Show every key and what the colours mean", priority=True, scope="app"
    ),
    KeySpec("stop", "escape", "stop", "Stop", "Stop the reply, keeping what was generated"),
    KeySpec(
        "gamma_down",
        "f2",
        "gamma_down",
        "γ−",
        "Draft one token fewer per round (next round)",
        priority=True,
        scope="talk",
    ),
    KeySpec(
        "gamma_up",
        "f3",
        "gamma_up",
        "γ+",
        "Draft one token more per round (next round)",
        priority=True,
        scope="talk",
    ),
    KeySpec(
        "schedule",
        "f4",
        "cycle_schedule",
        "Sched",
        "Switch the γ schedule: " + " / ".join(SCHEDULES),
        priority=True,
        scope="talk",
    ),
    KeySpec(
        "drafter",
        "f5",
        "cycle_drafter",
        "Drafter",
        "Switch the drafter: " + " / ".join(spec.label for spec in DRAFTERS),
        priority=True,
        scope="talk",
    ),
    KeySpec(
        "temperature_down",
        "f6",
        "temperature_down",
        "T−",
        "Lower the temperature by 0.1 (next round)",
        priority=True,
        scope="talk",
    ),
    KeySpec(
        "temperature_up",
        "f7",
        "temperature_up",
        "T+",
        "Raise the temperature by 0.1 (next round)",
        priority=True,
        scope="talk",
    ),
    KeySpec(
        "view",
        "f8",
        "toggle_view",
        "View",
        "Show finished replies as provenance colours / Markdown",
        priority=True,
    ),
    KeySpec("system_prompt", "f9", "edit_system_prompt", "System", "Edit the system prompt", priority=True),
    KeySpec(
        "inspect",
        "f10",
        "inspect",
        "Inspect",
        "Inspect tokens: a cursor over the reply (←/→ token, ↑/↓ round, Esc leaves; or click a token)",
        priority=True,
    ),
    KeySpec(
        "rejected",
        "f12",
        "toggle_rejected",
        "Rejected",
        "Show or hide the rejected drafts (struck through, before their correction)",
        priority=True,
    ),
    # Ctrl+D: every function key is taken; the message box's delete-right stays on Del.
    KeySpec(
        "reasoning",
        "ctrl+d",
        "toggle_reasoning",
        "Reasoning",
        "Show or fold a thinking model's reasoning (folded: one line, its tokens and its own α)",
        show=False,
        priority=True,
    ),
    KeySpec(
        "step_mode",
        "ctrl+g",
        "toggle_step_mode",
        "Step",
        "Step mode: pause after every round (replay: pause / play)",
        priority=True,
    ),
    KeySpec("step", "ctrl+n", "step", "Next", "Run one more round (step mode and replay)", priority=True),
    KeySpec(
        "screenshot",
        "ctrl+f",
        "save_screenshot",
        "Shot",
        "Save a screenshot of the screen (SVG) in the user data folder",
        show=False,
        priority=True,
        scope="app",
    ),
    KeySpec("regenerate", "ctrl+r", "regenerate", "Regen", "Regenerate the last reply", show=False),
    KeySpec("clear", "ctrl+l", "clear", "Clear", "Clear: start a new conversation", show=False),
    KeySpec("copy", "ctrl+b", "copy_reply", "Copy", "Copy the last reply to the clipboard", show=False),
    KeySpec("open", "ctrl+o", "open_conversations", "Open", "Open a saved conversation", show=False),
    KeySpec(
        "export", "ctrl+s", "export_markdown", "Export", "Export the conversation to Markdown", show=False
    ),
    KeySpec("theme", "ctrl+t", "cycle_theme", "Theme", "Switch to the next theme", show=False, scope="app"),
    # Talk mode (specchat.ui.talk.rules): the race, theory against measurement, the exactness self-test.
    # Off the footer, which is full at 120 columns; F1 and the palette list them. Ctrl+Y, Ctrl+K and
    # Ctrl+E take over the message box's redo, delete-to-end and go-to-end (End and Ctrl+Shift+K
    # remain): every function key is taken, and these are the control keys a terminal sends apart.
    KeySpec(
        "theory",
        "ctrl+y",
        "theory",
        "Theory",
        "Theory against measurement: formulas and the γ advisor",
        show=False,
        priority=True,
    ),
    KeySpec(
        "best_gamma",
        "ctrl+k",
        "best_gamma",
        "Best γ",
        "Apply the γ the advisor predicts fastest (next round, as γ− and γ+ do)",
        show=False,
        priority=True,
    ),
    KeySpec(
        "race",
        "f11",
        "race",
        "Race",
        "Race plain against speculative decoding, then replay",
        show=False,
        priority=True,
    ),
    KeySpec(
        "selftest",
        "ctrl+e",
        "selftest",
        "Self-test",
        "Exactness self-test: histograms both ways",
        show=False,
        priority=True,
    ),
)
"""The chat's keys, in the order its footer shows them; each works wherever the focus is, on the
screens its :attr:`~KeySpec.scope` names. The chat's screen binds them all (the ``"app"`` ones by
the app's actions, so its footer keeps this order); the app binds the ``"app"`` ones."""

APP_WIDE_KEYS: tuple[KeySpec, ...] = tuple(spec for spec in APP_KEYS if spec.scope == "app")
"""Bound on the app: help, the screenshot and the theme work on every screen."""

TALK_SCREEN_KEYS: tuple[KeySpec, ...] = tuple(spec for spec in APP_KEYS if spec.scope != "chat")
"""What the race and self-test screens bind after their own keys: the app-wide ones (help
first, where the footer shows it) and the controls their jobs run with."""


@runtime_checkable
class KeyTable(Protocol):
    """A screen that binds a table of these keys (the command palette lists them over it)."""

    KEY_TABLE: ClassVar[tuple[KeySpec, ...]]


PROMPT_KEYS: tuple[KeySpec, ...] = (
    KeySpec("send", "enter", "submit", "Send", "Send the message"),
    KeySpec("newline", "ctrl+j", "newline", "Newline", "Insert a new line in the message", show=False),
)
"""Keys of the message box."""

TEXTUAL_KEYS: tuple[tuple[str, str], ...] = (
    ("ctrl+p", "Command palette: every action, themes, keys"),
    ("ctrl+q", "Quit"),
    ("tab / shift+tab", "Move the focus (message box, transcript)"),
    ("ctrl+c", "Copy the selected text"),
)
"""Keys Textual provides, listed on the help screen."""

ALL_KEYS: tuple[KeySpec, ...] = APP_KEYS + PROMPT_KEYS
KEYS_BY_ID: dict[str, KeySpec] = {spec.id: spec for spec in ALL_KEYS}
BINDING_IDS = frozenset(KEYS_BY_ID)


def bindings(
    specs: Iterable[KeySpec], *, priority: bool = False, on_screen: bool = False
) -> list[BindingType]:
    """Textual's bindings of ``specs``. ``on_screen``: for a screen's table, whose keys run their
    commands through the screen's one dispatch, and whose app-wide keys run the app's actions (the
    screen lists them only so that its footer keeps the table's order)."""
    return [
        Binding(
            spec.key,
            action_name(spec) if on_screen else spec.command,
            spec.label,
            show=spec.show,
            id=spec.id,
            priority=priority or spec.priority,
        )
        for spec in specs
    ]


def action_name(spec: KeySpec) -> str:
    """The action a key runs from a screen: the app's own for app-wide keys, else the screen's
    dispatch of its command (:class:`~specchat.ui.state.commands.CommandDispatch`)."""
    return f"app.{spec.command}" if spec.scope == "app" else f"run({spec.command!r})"


def key_list(keys: str) -> list[str]:
    """ "ctrl+r, F3,?" -> ["ctrl+r", "f3", "question_mark"]: Textual's names for each key."""
    return [normalize_key(key) for key in keys.split(",") if key.strip()]


def normalize_key(key: str) -> str:
    """A key as Textual names it in its events: one character by its name, the rest lower case."""
    key = key.strip()
    if len(key) == 1:
        return _character_key(key)
    *modifiers, name = key.split("+")
    name = name if len(name) == 1 else name.lower()
    return "+".join([*(m.lower() for m in modifiers), name])


def _character_key(character: str) -> str:
    if character.isalnum():
        return character
    try:
        name = unicodedata.name(character).lower().replace("-", "_").replace(" ", "_")
    except ValueError:
        return character
    return KEY_NAME_REPLACEMENTS.get(name, name)


def effective_key(spec: KeySpec, keymap: Mapping[str, str]) -> str:
    return keymap.get(spec.id, spec.key)


def unknown_ids(keymap: Mapping[str, str]) -> list[str]:
    return sorted(set(keymap) - BINDING_IDS)


MODIFIERS = frozenset({"ctrl", "shift", "alt", "meta", "super", "hyper"})
NAMED_KEYS = frozenset(key.value.rsplit("+", 1)[-1] for key in Keys if not key.value.startswith("<")) | {
    "enter",
    "tab",
    "space",
    "backspace",
    "escape",
    "return",
    "delete",
    "insert",
}
RESERVED: dict[str, str] = {
    "ctrl+q": "quit",
    "ctrl+p": "the command palette",
    "ctrl+c": "copy",
    "tab": "moving the focus",
    "shift+tab": "moving the focus",
}
"""Keys Textual itself binds: remapping an action onto one would hide Textual's."""


def is_known_key(key: str) -> bool:
    """Whether a terminal can send ``key`` (Textual's spelling, as normalize_key returns it)."""
    *modifiers, name = key.split("+")
    if not name or any(m not in MODIFIERS for m in modifiers):
        return False
    return len(name) == 1 or name in NAMED_KEYS or key_to_character(name) is not None


def check_keymap(keymap: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """The remaps that can be honoured, and one warning for each that cannot.

    A remap is dropped (its action keeps its default key) when its id is unknown, when it
    names a key no terminal sends, when it takes a key Textual needs or a printable character
    (typing would trigger it), or when it collides with a key another action uses.
    """
    warnings: list[str] = []
    specs = KEYS_BY_ID
    unknown = unknown_ids(keymap)
    if unknown:
        warnings.append(
            f"[keys] {', '.join(unknown)}: no such action (known: {', '.join(sorted(BINDING_IDS))})."
        )
    accepted: dict[str, list[str]] = {}
    for binding_id, value in keymap.items():
        if binding_id not in specs:
            continue
        problem = _remap_problem(binding_id, str(value))
        if problem:
            default = display_key(specs[binding_id].key)
            warnings.append(f"[keys] {binding_id} = {value!r}: {problem}; keeping {default}.")
        else:
            accepted[binding_id] = key_list(str(value))
    _drop_collisions(accepted, keymap, warnings)
    return {binding_id: ",".join(keys) for binding_id, keys in accepted.items()}, warnings


def _remap_problem(binding_id: str, value: str) -> str | None:
    keys = key_list(value)
    if not keys:
        return "no key given"
    for key in keys:
        if not is_known_key(key):
            return f"{key!r} is not a key a terminal sends"
        if key in RESERVED:
            return f"{display_key(key)} is Textual's key for {RESERVED[key]}"
        if key_to_character(key) is not None and not (binding_id in ("send", "newline") and key == "space"):
            return f"{key!r} types a character, so typing would trigger it"
    return None


def _drop_collisions(accepted: dict[str, list[str]], keymap: Mapping[str, str], warnings: list[str]) -> None:
    """Undo remaps whose keys another action uses, until no key belongs to two actions."""
    specs = KEYS_BY_ID
    while True:
        owners: dict[str, list[str]] = {}
        for spec in ALL_KEYS:
            for key in accepted.get(spec.id) or key_list(spec.key):
                owners.setdefault(key, []).append(spec.id)
        clash = next(((key, ids) for key, ids in owners.items() if len(ids) > 1), None)
        if clash is None:
            return
        key, ids = clash
        remapped = [binding_id for binding_id in ids if binding_id in accepted]
        for binding_id in remapped:
            others = ", ".join(i for i in ids if i != binding_id)
            default = display_key(specs[binding_id].key)
            warnings.append(
                f"[keys] {binding_id} = {keymap[binding_id]!r}: {others} already uses "
                f"{display_key(key)}; keeping {default}."
            )
            del accepted[binding_id]


_NAMES = {
    "escape": "Esc",
    "enter": "Enter",
    "tab": "Tab",
    "up": "↑",
    "down": "↓",
    "left": "←",
    "right": "→",
    "space": "Space",
    "backspace": "Backspace",
    "delete": "Del",
    "pageup": "PgUp",
    "pagedown": "PgDn",
}


def display_key(key: str) -> str:
    """ "ctrl+r,f3" -> "Ctrl+R / F3"."""
    shown = []
    for one in key.split(","):
        parts = one.strip().split("+")
        words = [p.capitalize() if p in ("ctrl", "shift", "alt", "super") else _key_name(p) for p in parts]
        shown.append("+".join(words))
    return " / ".join(shown)


def _key_name(part: str) -> str:
    if part in _NAMES:
        return _NAMES[part]
    if len(part) == 1:
        return part.upper()
    if part.startswith("f") and part[1:].isdigit():
        return part.upper()
    return part
