"""SQLite persistence of conversations (`<state_dir>/chat.sqlite`), safe across threads and restarts.

Writes happen at turn boundaries and at slow checkpoints, never per token. WAL mode keeps a reader
(the UI listing conversations) from waiting on a checkpoint write.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from app.backend.chat.models import Conversation, ConversationSummary, Message, MessageStats
from app.backend.files.modes import create_private

SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id TEXT PRIMARY KEY,
    title TEXT NOT NULL,
    system_prompt TEXT NOT NULL DEFAULT '',
    created REAL NOT NULL,
    updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    conversation_id TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    reasoning TEXT NOT NULL DEFAULT '',
    reasoning_s REAL,
    status TEXT NOT NULL,
    error TEXT NOT NULL DEFAULT '',
    stats TEXT,
    created REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages(conversation_id, id);
"""

INTERRUPTED = "the panel stopped while this reply was streaming"


class ChatStoreError(RuntimeError):
    """The history database cannot be opened or written (message says which file and why)."""


class ChatStore:
    def __init__(self, path: Path, read_only: bool = False):
        """`read_only`: a reader beside a running panel (the A/B CLI picking prompts): no schema writes and
        no recovery, which would mark the panel's live replies as stopped."""
        self.path = path
        try:
            if read_only:
                if not path.exists():
                    raise ChatStoreError(f"no chat history at {path} yet")
                self._db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, check_same_thread=False,
                                           isolation_level=None)
            else:
                create_private(path)
                self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
                self._db.execute("PRAGMA journal_mode=WAL")
                # WAL + NORMAL: no fsync per commit (a send stays fast); a power cut may lose the last
                # write, never corrupt the file.
                self._db.execute("PRAGMA synchronous=NORMAL")
                self._db.execute("PRAGMA foreign_keys=ON")
                self._db.executescript(SCHEMA)
        except (sqlite3.Error, OSError) as exc:
            raise ChatStoreError(f"cannot open chat history {path}: {exc}") from exc
        self._lock = threading.Lock()
        if not read_only:
            self._recover_interrupted()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            try:
                self._db.execute("BEGIN")
                yield self._db
                self._db.execute("COMMIT")
            except sqlite3.Error as exc:
                self._db.execute("ROLLBACK")
                raise ChatStoreError(f"chat history {self.path}: {exc}") from exc

    def _recover_interrupted(self) -> None:
        """Replies cut off by a panel crash keep their partial text and say so."""
        with self._tx() as db:
            db.execute("UPDATE messages SET status='stopped', error=? WHERE status='streaming'", (INTERRUPTED,))

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # conversations -------------------------------------------------------------------------
    def create(self, conv: Conversation) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO conversations(id, title, system_prompt, created, updated) VALUES (?,?,?,?,?)",
                (conv.id, conv.title, conv.system_prompt, conv.created, conv.updated),
            )
            for msg in conv.messages:
                msg.id = _insert_message(db, conv.id, msg)

    def update_conversation(self, conv: Conversation) -> None:
        conv.updated = time.time()
        with self._tx() as db:
            db.execute(
                "UPDATE conversations SET title=?, system_prompt=?, updated=? WHERE id=?",
                (conv.title, conv.system_prompt, conv.updated, conv.id),
            )

    def delete(self, conv_id: str) -> None:
        with self._tx() as db:
            db.execute("DELETE FROM conversations WHERE id=?", (conv_id,))

    def list(self) -> list[ConversationSummary]:
        with self._lock:
            rows = self._db.execute(
                "SELECT c.id, c.title, c.updated, COUNT(m.id) FROM conversations c "
                "LEFT JOIN messages m ON m.conversation_id = c.id GROUP BY c.id ORDER BY c.updated DESC"
            ).fetchall()
        return [ConversationSummary(r[0], r[1], r[2], r[3]) for r in rows]

    def load(self, conv_id: str) -> Conversation | None:
        with self._lock:
            row = self._db.execute(
                "SELECT id, title, system_prompt, created, updated FROM conversations WHERE id=?", (conv_id,)
            ).fetchone()
            if row is None:
                return None
            rows = self._db.execute(
                "SELECT id, role, content, reasoning, reasoning_s, status, error, stats, created "
                "FROM messages WHERE conversation_id=? ORDER BY id",
                (conv_id,),
            ).fetchall()
        try:
            messages = [
                Message(
                    id=r[0], role=r[1], content=r[2], reasoning=r[3], reasoning_s=r[4], status=r[5], error=r[6],
                    stats=MessageStats.from_dict(json.loads(r[7]) if r[7] else None), created=r[8],
                )
                for r in rows
            ]
        except (ValueError, TypeError, AttributeError) as exc:  # a row written by an older, laxer import
            raise ChatStoreError(f"conversation {conv_id} in {self.path} is damaged ({exc}); delete it") from exc
        return Conversation(id=row[0], title=row[1], system_prompt=row[2], created=row[3], updated=row[4],
                            messages=messages)

    # messages ------------------------------------------------------------------------------
    def add_message(self, conv: Conversation, msg: Message) -> None:
        conv.updated = time.time()
        with self._tx() as db:
            msg.id = _insert_message(db, conv.id, msg)
            db.execute("UPDATE conversations SET updated=? WHERE id=?", (conv.updated, conv.id))

    def update_message(self, msg: Message) -> None:
        if msg.id is None:
            raise ValueError("message was never stored")
        with self._tx() as db:
            db.execute(
                "UPDATE messages SET content=?, reasoning=?, reasoning_s=?, status=?, error=?, stats=? WHERE id=?",
                (msg.content, msg.reasoning, msg.reasoning_s, msg.status, msg.error, _stats_json(msg), msg.id),
            )

    def delete_messages(self, ids: Sequence[int]) -> None:  # `list` here is the method below
        if not ids:
            return
        with self._tx() as db:
            db.executemany("DELETE FROM messages WHERE id=?", [(i,) for i in ids])


def _stats_json(msg: Message) -> str | None:
    return json.dumps(msg.stats.to_dict()) if msg.stats else None


def _insert_message(db: sqlite3.Connection, conv_id: str, msg: Message) -> int:
    cur = db.execute(
        "INSERT INTO messages(conversation_id, role, content, reasoning, reasoning_s, status, error, stats, created) "
        "VALUES (?,?,?,?,?,?,?,?,?)",
        (conv_id, msg.role, msg.content, msg.reasoning, msg.reasoning_s, msg.status, msg.error, _stats_json(msg),
         msg.created),
    )
    if cur.lastrowid is None:
        raise sqlite3.Error("INSERT stored no row")
    return cur.lastrowid
