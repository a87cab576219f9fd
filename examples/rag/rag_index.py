"""The search index of the RAG example: SQLite FTS5 with BM25 ranking (Python's standard ``sqlite3``).

Documents are indexed by title and text; a title match weighs ten times a text match, so searching an entity's name
finds its own document first. Queries are free text: each word becomes a quoted FTS5 term and any term may match
(BM25 ranks documents that match more of them higher), so no query can be an FTS5 syntax error.

The index is a real SQLite file. `cached_index` builds it once per corpus (named by the corpus's content hash, in
the temp folder) and atomically, so any number of runner processes can ask for it at once.
"""

from __future__ import annotations

import hashlib
import os
import re
import sqlite3
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

from rag_task import Document

__all__ = ["SearchIndex", "build_index", "cached_index", "fts_query"]

TITLE_WEIGHT = 10.0
"""BM25 weight of the title column against 1.0 for the text."""

_WORD = re.compile(r"\w+")
_MAX_TERMS = 16


def fts_query(text: str) -> str:
    """The FTS5 query of free text: its words, each quoted, joined by ``OR`` (empty when it has no word)."""
    words = _WORD.findall(text)[:_MAX_TERMS]
    return " OR ".join('"' + word.replace('"', '""') + '"' for word in words)


def _fill(connection: sqlite3.Connection, documents: Sequence[Document]) -> None:
    connection.execute("CREATE VIRTUAL TABLE docs USING fts5(title, text, tokenize='unicode61')")
    connection.executemany("INSERT INTO docs(title, text) VALUES (?, ?)", [(d.title, d.text) for d in documents])
    connection.commit()


def build_index(documents: Sequence[Document], path: Path) -> Path:
    """Write an FTS5 index of ``documents`` to ``path`` (replaced atomically); returns ``path``.

    Raises:
        ValueError: ``documents`` is empty.
    """
    if not documents:
        raise ValueError("cannot index an empty corpus")
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, partial = tempfile.mkstemp(prefix=path.name + ".", suffix=".partial", dir=path.parent)
    os.close(handle)
    try:
        connection = sqlite3.connect(partial)
        try:
            _fill(connection, documents)
        finally:
            connection.close()
        os.replace(partial, path)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise
    return path


def cached_index(corpus: Path, directory: Path | None = None) -> Path:
    """The index file of the corpus JSONL file ``corpus``, built on first use; named by the file's SHA-256.

    Args:
        corpus: A ``corpus.jsonl`` of ``{"title", "text"}`` lines (see `rag_task.read_corpus`).
        directory: Where index files live (default: the system temp folder).
    """
    from rag_task import read_corpus

    digest = hashlib.sha256(corpus.read_bytes()).hexdigest()[:16]
    path = (directory or Path(tempfile.gettempdir())) / f"agl-rag-index-{digest}.sqlite"
    if not path.exists():
        build_index(read_corpus(corpus), path)
    return path


class SearchIndex:
    """BM25 search over an index file written by `build_index` (read-only; safe to share between threads).

    Args:
        path: The index file.

    Raises:
        FileNotFoundError: ``path`` does not exist.
    """

    def __init__(self, path: Path) -> None:
        if not path.is_file():
            raise FileNotFoundError(f"search index {str(path)!r} does not exist; build it with build_index()")
        self.path: Path | None = path
        self._connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)
        self._lock = threading.Lock()

    @classmethod
    def in_memory(cls, documents: Sequence[Document]) -> SearchIndex:
        """An index of ``documents`` held in memory (the same ranking; for making transcripts and tests).

        Raises:
            ValueError: ``documents`` is empty.
        """
        if not documents:
            raise ValueError("cannot index an empty corpus")
        index = cls.__new__(cls)
        index.path = None
        index._connection = sqlite3.connect(":memory:", check_same_thread=False)
        index._lock = threading.Lock()
        _fill(index._connection, documents)
        return index

    def search(self, query: str, k: int = 2) -> list[Document]:
        """The ``k`` best documents for ``query`` by BM25 (title weighted `TITLE_WEIGHT`); none for no words."""
        match = fts_query(query)
        if not match or k < 1:
            return []
        with self._lock:
            rows = self._connection.execute(
                "SELECT title, text FROM docs WHERE docs MATCH ? ORDER BY bm25(docs, ?, 1.0) LIMIT ?",
                (match, TITLE_WEIGHT, k),
            ).fetchall()
        return [Document(str(title), str(text)) for title, text in rows]

    def close(self) -> None:
        """Close the SQLite connection."""
        self._connection.close()
