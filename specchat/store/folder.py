"""Where conversations are kept: ``<data dir>/conversations/<id>.json``, written atomically, listed
newest first; exports go to ``<data dir>/exports/<id>.md``.

Pure Python (no torch, no textual).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from specchat.files import CONVERSATION_LIMIT, read_user_text, write_atomic
from specchat.store.conversation import Conversation, ConversationError, new_id, now
from specchat.store.markdown import to_markdown
from specchat.untrusted import json_text


@dataclass(frozen=True)
class SavedInfo:
    """One row of the conversation list (a file that cannot be read is listed with why)."""

    id: str
    title: str
    updated: str
    turns: int
    alpha: float | None
    path: Path
    problem: str | None = None


class ConversationStore:
    """``<data dir>/conversations/<id>.json``; exports go to ``<data dir>/exports/<id>.md``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.folder = root / "conversations"
        self.exports = root / "exports"
        self._seen: dict[str, tuple[int, int, int]] = {}
        """Each file as this store last read or wrote it (inode, size, mtime)."""

    def path_for(self, conversation_id: str) -> Path:
        return self.folder / f"{conversation_id}.json"

    def save(self, conversation: Conversation) -> Path:
        """Write the conversation atomically. If its file changed since this store read or
        wrote it (another specchat has it open too), that version is kept and this one gets
        a new id and file: two copies never overwrite each other's messages."""
        conversation.updated = now()
        path = self.path_for(conversation.id)
        current = _stamp(path)
        if current is not None and current != self._seen.get(conversation.id):
            conversation.id = new_id()
            path = self.path_for(conversation.id)
        # Compact: json's fast C encoder only runs without indent, and this runs on the UI thread
        # twice per reply, over the whole conversation (every token of every reply).
        write_atomic(path, json_text(conversation.to_json(), separators=(",", ":")))
        self._remember(conversation.id, path)
        return path

    def load(self, conversation_id: str) -> Conversation:
        path = self.path_for(conversation_id)
        conversation = self.load_path(path)
        self._remember(conversation.id, path)
        return conversation

    def _remember(self, conversation_id: str, path: Path) -> None:
        stamp = _stamp(path)
        if stamp is not None:
            self._seen[conversation_id] = stamp

    def delete(self, conversation_id: str) -> None:
        """Remove a conversation's file (one that ended up empty); missing is fine."""
        self.path_for(conversation_id).unlink(missing_ok=True)

    @staticmethod
    def load_path(path: Path) -> Conversation:
        """Read one file. The file is the conversation's identity: its id is the file's name,
        so a file renamed by hand opens and keeps saving to itself."""
        try:
            conversation = Conversation.from_json(json.loads(read_user_text(path, CONVERSATION_LIMIT)))
        except FileNotFoundError as err:
            raise ConversationError(f"no saved conversation at {path} (was it moved or deleted?).") from err
        except UnicodeDecodeError as err:
            raise ConversationError(f"cannot read the conversation {path}: it is not UTF-8 text.") from err
        except json.JSONDecodeError as err:
            raise ConversationError(
                f"cannot read the conversation {path}: it is not complete JSON ({err.msg} at line "
                f"{err.lineno}); the file is left as it is."
            ) from err
        except RecursionError as err:  # json parses nested arrays by recursion
            raise ConversationError(
                f"cannot read the conversation {path}: it nests lists or objects too deeply to be one."
            ) from err
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            reason = err.strerror if isinstance(err, OSError) and err.strerror else _reason(err)
            raise ConversationError(f"cannot read the conversation {path}: {reason}.") from err
        conversation.id = path.stem
        return conversation

    def saved(self) -> list[SavedInfo]:
        """Newest first; files that cannot be read come last, with the reason (never overwritten)."""
        rows: list[SavedInfo] = []
        broken: list[SavedInfo] = []
        for path in self.folder.glob("*.json") if self.folder.is_dir() else []:
            try:
                conversation = self.load_path(path)
            except ConversationError as err:
                reason = str(err).split(": ", 1)[-1]
                broken.append(SavedInfo(path.stem, path.name, "", 0, None, path, reason))
                continue
            replies = [t for t in conversation.turns if t.role == "assistant"]
            drafted = sum(r.drafted for t in replies for r in t.rounds)
            accepted = sum(r.accepted for t in replies for r in t.rounds)
            rows.append(
                SavedInfo(
                    id=conversation.id,
                    title=conversation.title,
                    updated=conversation.updated,
                    turns=len(conversation.turns),
                    alpha=accepted / drafted if drafted else None,
                    path=path,
                )
            )
        rows.sort(key=lambda r: (r.updated, r.id), reverse=True)
        return rows + sorted(broken, key=lambda r: r.id)

    def export_markdown(self, conversation: Conversation, path: Path | None = None) -> Path:
        path = path or self.exports / f"{conversation.id}.md"
        write_atomic(path, to_markdown(conversation))
        return path


def _reason(err: BaseException) -> str:
    if isinstance(err, KeyError):
        return f"it lacks {err.args[0]!r}"
    return str(err) or type(err).__name__


def _stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        info = path.stat()
    except OSError:
        return None
    return info.st_ino, info.st_size, info.st_mtime_ns
