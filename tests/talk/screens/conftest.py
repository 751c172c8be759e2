"""Talk mode's screens run in the chat app: the UI tests' fixtures (a pausing engine, isolated
folders) apply here too, and override tests/talk's plain engine."""

from tests.ui.conftest import anyio_backend, engine, isolated_folders, one_torch_thread, tiny_pair

__all__ = ["anyio_backend", "engine", "isolated_folders", "one_torch_thread", "tiny_pair"]
