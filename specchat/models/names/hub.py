"""Hugging Face ids: the local hub cache first, a download only when allowed and needed.

The cache is tried first even when online: a chat app should start offline with what it already
has, and no default path of specchat may touch the network.
"""

from __future__ import annotations

import os
from pathlib import Path

from specchat.errors import ModelNotFoundError
from specchat.models.errors_util import one_line
from specchat.models.records import LoadProgress, ProgressCallback, emit

# What a causal LM folder needs; skips other frameworks' weights and GGUF copies in the same repo.
PATTERNS = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.tiktoken", "*.py"]


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


def hub_folder(repo_id: str, progress: ProgressCallback | None = None) -> Path:
    """The local snapshot folder of `repo_id`, downloading it only if it is not cached."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id, local_files_only=True, allow_patterns=PATTERNS))
    except LocalEntryNotFoundError:
        pass
    if hub_offline():
        raise ModelNotFoundError(
            f"{repo_id} is not in the Hugging Face cache and HF_HUB_OFFLINE is set; "
            "download it once while online, or pass a local folder or .gguf file"
        )
    emit(progress, LoadProgress(repo_id, "load", 0, None, f"downloading {repo_id} from the Hugging Face hub"))
    return _download(repo_id)


def _download(repo_id: str) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    try:
        return Path(snapshot_download(repo_id, allow_patterns=PATTERNS))
    except GatedRepoError as err:
        raise ModelNotFoundError(
            f"{repo_id} is gated on the Hugging Face hub; accept its terms and log in"
        ) from err
    except RepositoryNotFoundError as err:
        raise ModelNotFoundError(
            f"{repo_id} does not exist on the Hugging Face hub; check the id, or run `specchat models`"
        ) from err
    except Exception as err:  # connection refused, DNS, proxy, timeouts: all "unreachable" to the user
        raise ModelNotFoundError(
            f"could not download {repo_id} (the hub is unreachable: {one_line(err, 120)}); "
            "pass a local folder or .gguf file, or a packaged model"
        ) from err
