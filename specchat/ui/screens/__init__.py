"""Screens: loading, help, saved conversations, system prompt."""
