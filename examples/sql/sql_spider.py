"""Load the public Spider text-to-SQL data set from local files into this example's task format.

Spider ships ``tables.json`` (one schema per database), question files such as ``dev.json`` / ``train_spider.json``
(``db_id``, ``question``, ``query``) and ``database/<db_id>/<db_id>.sqlite``. Nothing is downloaded; point the loader
at a folder you have::

    tasks = load_spider("path/to/spider", split="dev")   # list[SQLTask], db_path set to the local SQLite file

and train or evaluate on them (``sql_eval.py --spider path/to/spider``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sql_data import SQLTask

__all__ = ["SpiderFormatError", "load_spider", "render_spider_schema"]


class SpiderFormatError(ValueError):
    """A Spider file that is missing or not in the expected format; the message names the file and the entry."""


def _read_list(path: Path) -> list[Any]:
    if not path.is_file():
        raise SpiderFormatError(f"{path} does not exist")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise SpiderFormatError(f"{path}: not valid JSON ({error.msg} at line {error.lineno})") from None
    if not isinstance(data, list):
        raise SpiderFormatError(f"{path}: expected a JSON list, got {type(data).__name__}")
    return data


def render_spider_schema(entry: dict[str, Any]) -> str:
    """One ``tables.json`` entry as the compact schema line the agents see: ``table(col,col) other(col,...)``.

    Raises:
        SpiderFormatError: The entry lacks ``table_names_original`` / ``column_names_original`` or a column points
            at a table that does not exist.
    """
    tables, columns = entry.get("table_names_original"), entry.get("column_names_original")
    if not isinstance(tables, list) or not isinstance(columns, list):
        raise SpiderFormatError(
            f"schema of {entry.get('db_id')!r}: needs lists 'table_names_original' and 'column_names_original'"
        )
    by_table: list[list[str]] = [[] for _ in tables]
    for column in columns:
        if not (isinstance(column, list) and len(column) == 2):
            raise SpiderFormatError(f"schema of {entry.get('db_id')!r}: column entry {column!r} is not [table, name]")
        table, name = column
        if table == -1:  # Spider's "*" pseudo-column
            continue
        if not isinstance(table, int) or not 0 <= table < len(tables):
            raise SpiderFormatError(f"schema of {entry.get('db_id')!r}: column {name!r} names table {table!r}")
        by_table[table].append(str(name))
    return " ".join(f"{table}({','.join(cols)})" for table, cols in zip(tables, by_table, strict=True))


def load_spider(
    root: str | Path,
    split: str = "dev",
    *,
    tables_file: str = "tables.json",
    database_dir: str = "database",
    limit: int | None = None,
) -> list[SQLTask]:
    """Questions of ``root/<split>.json`` as tasks, each with its schema line and local SQLite file.

    Args:
        root: The Spider folder.
        split: Question file name without ``.json`` (``dev``, ``train_spider``, ``train_others``).
        tables_file: Schema file inside ``root``.
        database_dir: Folder of ``<db_id>/<db_id>.sqlite`` inside ``root``.
        limit: Keep only the first ``limit`` questions.

    Raises:
        SpiderFormatError: A file is missing or malformed, a question names a database absent from the schema file,
            or its SQLite file does not exist; the message says which.
    """
    root = Path(root)
    schemas: dict[str, str] = {}
    for number, entry in enumerate(_read_list(root / tables_file)):
        if not isinstance(entry, dict) or not isinstance(entry.get("db_id"), str):
            raise SpiderFormatError(f"{root / tables_file}: entry {number} has no string 'db_id'")
        schemas[entry["db_id"]] = render_spider_schema(entry)
    questions_path = root / f"{split}.json"
    tasks: list[SQLTask] = []
    for number, item in enumerate(_read_list(questions_path)):
        if limit is not None and len(tasks) >= limit:
            break
        where = f"{questions_path}: entry {number}"
        if not isinstance(item, dict):
            raise SpiderFormatError(f"{where} is not an object")
        db_id, question, query = item.get("db_id"), item.get("question"), item.get("query")
        if not (isinstance(db_id, str) and isinstance(question, str) and isinstance(query, str)):
            raise SpiderFormatError(f"{where} needs string 'db_id', 'question' and 'query'")
        if db_id not in schemas:
            raise SpiderFormatError(f"{where}: database {db_id!r} is not in {tables_file}")
        db_path = root / database_dir / db_id / f"{db_id}.sqlite"
        if not db_path.is_file():
            raise SpiderFormatError(f"{where}: database file {db_path} does not exist")
        tasks.append(SQLTask(db_id, schemas[db_id], question.strip(), query.strip(), "spider", str(db_path.resolve())))
    if not tasks:
        raise SpiderFormatError(f"{questions_path} holds no questions")
    return tasks
