"""Wording shared by the terminal commands and the chat's screens: plain strings and Rich text.

Nothing here imports textual or torch, so `specchat race`, `specchat selftest`, `generate
--format ansi` and the TUI's screens say the same things from one place.
"""
