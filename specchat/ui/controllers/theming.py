"""The app's themes: found in theme files, registered with Textual, switched, and remembered;
and the token palette that follows them (rejected drafts shown or hidden).

:class:`AppThemes` registers the packaged and user themes when the app is made, picks the one the
settings name (or the default, with a warning), keeps the token palette in step when the theme
changes, and remembers the choice. The theme files and the palette are :mod:`specchat.ui.settings.themes`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Protocol

from rich.style import Style
from textual.theme import Theme

from specchat.ui.settings import themes

if TYPE_CHECKING:
    from specchat.ui.screens.main import MainScreen
    from specchat.ui.state.commands import Commands
    from specchat.ui.state.preferences import Preferences


class ThemeHost(Protocol):
    """The app's Textual themes: registered, listed, switched."""

    theme: str

    @property
    def available_themes(self) -> dict[str, Theme]: ...

    @property
    def current_theme(self) -> Theme: ...

    def register_theme(self, theme: Theme) -> None: ...

    def get_theme(self, theme_name: str) -> Theme | None: ...


class AppThemes:
    """The themes of one app; ``notes`` collects the warnings to show when the app opens."""

    def __init__(
        self,
        app: ThemeHost,
        preferences: Preferences,
        palette: themes.TokenPalette,
        chat_screens: Callable[[], Iterable[MainScreen]],
    ) -> None:
        self.app = app
        self.preferences = preferences
        self.palette = palette
        self.chat_screens = chat_screens
        self.specs, self.notes = themes.discover()
        for spec in self.specs.values():
            app.register_theme(spec.theme)
        app.theme = self._starting(preferences.settings.theme)

    def _starting(self, wanted: str) -> str:
        if wanted in self.app.available_themes:
            return wanted
        self.notes.append(f"unknown theme {wanted!r}: using {themes.DEFAULT_THEME}.")
        return themes.DEFAULT_THEME if themes.DEFAULT_THEME in self.app.available_themes else "textual-dark"

    def start(self) -> None:
        """The app is mounted: colour the tokens (the app then sends every later theme change to
        :meth:`changed`)."""
        self.palette.use(self.styles_of(self.app.theme))

    @property
    def names(self) -> list[str]:
        """Themes from theme files: the packaged four first, then the user's."""
        return themes.ordered_names(self.specs)

    def description(self, name: str) -> str:
        spec = self.specs.get(name)
        return spec.description if spec and spec.description else name

    def styles_of(self, name: str) -> dict[str, Style]:
        """Rich styles of the token kinds (and rejected drafts) in the theme ``name``."""
        return themes.token_styles(self.app.get_theme(name) or self.app.current_theme, self.specs.get(name))

    def add_commands(self, table: Commands) -> None:
        table.add("toggle_rejected", self.toggle_rejected)

    def toggle_rejected(self) -> None:
        """Show or hide the rejected drafts, in every reply on every chat screen."""
        shown = self.palette.toggle_rejected()
        for screen in self.chat_screens():
            screen.live.set_display(show_rejected=shown)
            screen.redraw_tokens()

    def changed(self, theme: Theme) -> None:
        self.palette.use(self.styles_of(theme.name))
        for screen in self.chat_screens():
            screen.redraw_tokens()
        if theme.name != self.preferences.settings.theme:
            self.preferences.change("theme", theme.name)
