"""The Textual TUI. ``specchat.ui.app.run_chat`` is the entry point the CLI calls.

Nothing here imports torch at module level: the worker bridge loads the engine lazily.
"""
