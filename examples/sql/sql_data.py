"""The text-to-SQL task: generated SQLite databases, template questions with gold queries, execution and reward.

Three schemas, each a parent table and a child table that points at it::

    shop     customers(id,name,city,age)      orders(id,customer_id,item,price)
    school   students(id,name,major,year)     grades(id,student_id,subject,score)
    library  authors(id,name,country,born)    books(id,author_id,title,pages)

A database is one instance of a schema with seeded rows (``shop_3`` is schema ``shop`` filled from seed 3): its file
is built on first use, deterministically, so runners on any machine see the same rows. A question is drawn from five
query shapes (filter by text, filter by number, count, top-1 by order, a join)::

    list the customers whose city is 'Paris'   SELECT name FROM customers WHERE city = 'Paris'
    which customers have age above 40          SELECT name FROM customers WHERE age > 40
    how many customers have city 'Rome'        SELECT COUNT(*) FROM customers WHERE city = 'Rome'
    which customer has the highest age         SELECT name FROM customers ORDER BY age DESC LIMIT 1
    list the item of orders by 'Ann'           SELECT orders.item FROM orders JOIN customers ON ...

Text values are quoted in the question as they are in SQL (so a tiny model copies the same tokens).

The reward is execution match: the rows of the final query against the gold query's rows on the same database
(in order when the gold query orders its rows, as a multiset otherwise).
"""

from __future__ import annotations

import os
import random
import re
import sqlite3
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "DATA_DIR",
    "SCHEMAS",
    "SHAPES",
    "ExecutionResult",
    "SQLTask",
    "Schema",
    "build_database",
    "check_task",
    "database_path",
    "execute",
    "execution_match",
    "load_tasks",
    "make_tasks",
    "result_feedback",
    "task_database",
]

DATA_DIR = Path(__file__).resolve().parent / "data"
"""Shipped task files; generated databases are built into ``DATA_DIR/db`` on first use."""

MAX_ROWS = 200
"""Most rows a query may return before it is cut off (the reward compares at most this many)."""

_MAX_VM_STEPS = 200_000  # SQLite virtual-machine steps a query may take (a cross join of junk stops here)
_CHECK_EVERY = 100  # VM steps between two checks of the budget: a step may be a costly function call (instr, replace)
_MAX_SECONDS = 2.0  # wall-clock time a query may take: a few steps of costly calls each stop here
_MAX_LENGTH = 100_000  # bytes of any string or blob a query may build (one call on two of them stays well under 1 s)
_MAX_PATTERN = 1_000  # characters of a LIKE or GLOB pattern


@dataclass(frozen=True)
class Schema:
    """A parent table (``id, name, <text column>, <number column>``) and a child table pointing at it.

    Attributes:
        name: Schema name, e.g. ``shop``.
        parent: Parent table, e.g. ``customers``.
        singular: One row of the parent, e.g. ``customer``.
        text_col: The parent's text column, e.g. ``city``; its values come from ``text_values``.
        num_col: The parent's number column, e.g. ``age``; values in ``num_range``, unique per database.
        child: Child table, e.g. ``orders``.
        fk: The child's column holding the parent's id, e.g. ``customer_id``.
        child_text: The child's text column, e.g. ``item``.
        child_num: The child's number column, e.g. ``price``.
        names: Pool of parent names (unique per database).
        text_values: Pool of values of ``text_col``.
        child_values: Pool of values of ``child_text``.
        num_range: Range of ``num_col``.
        child_num_range: Range of ``child_num``.
    """

    name: str
    parent: str
    singular: str
    text_col: str
    num_col: str
    child: str
    fk: str
    child_text: str
    child_num: str
    names: tuple[str, ...]
    text_values: tuple[str, ...]
    child_values: tuple[str, ...]
    num_range: tuple[int, int]
    child_num_range: tuple[int, int]

    def render(self) -> str:
        """The compact schema line the agents see: ``customers(id,name,city,age) orders(id,customer_id,...)``."""
        return (
            f"{self.parent}(id,name,{self.text_col},{self.num_col}) "
            f"{self.child}(id,{self.fk},{self.child_text},{self.child_num})"
        )


_NAMES = ("Ann", "Bob", "Cal", "Dan", "Eve", "Fay", "Gus", "Hal", "Ida", "Jon", "Kim", "Leo", "Max", "Ned", "Oli")
SCHEMAS: dict[str, Schema] = {
    schema.name: schema
    for schema in (
        Schema(
            "shop", "customers", "customer", "city", "age", "orders", "customer_id", "item", "price", _NAMES,
            ("Paris", "Rome", "Oslo", "Lima", "Kyiv", "Cairo"), ("book", "lamp", "desk", "pen", "cup", "bag"),
            (18, 80), (1, 99),
        ),
        Schema(
            "school", "students", "student", "major", "year", "grades", "student_id", "subject", "score", _NAMES,
            ("math", "art", "law", "music", "physics", "history"), ("algebra", "poetry", "chess", "drawing",
            "biology", "latin"), (1, 60), (0, 100),
        ),
        Schema(
            "library", "authors", "author", "country", "born", "books", "author_id", "title", "pages", _NAMES,
            ("Peru", "Chile", "Spain", "Italy", "Japan", "Kenya"), ("Dawn", "Rain", "Stone", "River", "Dust",
            "Snow"), (1900, 1999), (50, 900),
        ),
    )
}  # fmt: skip
"""The three generated schemas by name."""

SHAPES = ("filter_text", "filter_num", "count", "top", "join")
"""The query shapes, in the order `make_tasks` cycles through them."""

_DB_ID = re.compile(r"^([a-z]+)_(\d{1,6})$")


def database_path(db_id: str, root: Path | None = None) -> Path:
    """Where the generated database ``db_id`` (``shop_3``) lives, built first if it does not exist yet.

    Raises:
        ValueError: ``db_id`` names no generated schema.
    """
    match = _DB_ID.match(db_id)
    if match is None or match.group(1) not in SCHEMAS:
        raise ValueError(f"unknown generated database {db_id!r}: expected <schema>_<n> with schema in {list(SCHEMAS)}")
    path = (root or DATA_DIR / "db") / f"{db_id}.sqlite"
    if not path.exists():
        build_database(SCHEMAS[match.group(1)], int(match.group(2)), path)
    return path


def _rows(schema: Schema, seed: int) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    rng = random.Random(f"{schema.name}:{seed}")
    count = rng.randint(7, 10)
    names = rng.sample(schema.names, count)
    numbers = rng.sample(range(schema.num_range[0], schema.num_range[1] + 1), count)  # unique: top-1 is unambiguous
    parents = [(i + 1, names[i], rng.choice(schema.text_values), numbers[i]) for i in range(count)]
    children: list[tuple[Any, ...]] = []
    for parent_id in range(1, count + 1):
        for value in rng.sample(schema.child_values, rng.randint(1, 3)):
            children.append((len(children) + 1, parent_id, value, rng.randint(*schema.child_num_range)))
    return parents, children


def build_database(schema: Schema, seed: int, path: Path) -> Path:
    """Write the database of ``schema`` filled from ``seed`` to ``path`` (atomically; same seed, same rows)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    parents, children = _rows(schema, seed)
    handle, temporary = tempfile.mkstemp(dir=path.parent, suffix=".partial")
    os.close(handle)
    try:
        with sqlite3.connect(temporary) as connection:
            connection.execute(
                f"CREATE TABLE {schema.parent} (id INTEGER PRIMARY KEY, name TEXT, {schema.text_col} TEXT, "
                f"{schema.num_col} INTEGER)"
            )
            connection.execute(
                f"CREATE TABLE {schema.child} (id INTEGER PRIMARY KEY, {schema.fk} INTEGER REFERENCES "
                f"{schema.parent}(id), {schema.child_text} TEXT, {schema.child_num} INTEGER)"
            )
            connection.executemany(f"INSERT INTO {schema.parent} VALUES (?, ?, ?, ?)", parents)
            connection.executemany(f"INSERT INTO {schema.child} VALUES (?, ?, ?, ?)", children)
        connection.close()
        os.replace(temporary, path)  # concurrent builders of the same file all write the same rows
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
    return path


@dataclass(frozen=True)
class SQLTask:
    """One question about one database.

    Attributes:
        db_id: The database, e.g. ``shop_3`` (generated) or a Spider ``db_id``.
        schema: The compact schema line the agents see.
        question: The natural-language question.
        gold: The gold SQL query.
        shape: Query shape (one of `SHAPES`, or ``spider``).
        db_path: The SQLite file for databases that are not generated (Spider); ``None`` for generated ones.
    """

    db_id: str
    schema: str
    question: str
    gold: str
    shape: str
    db_path: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly form (what a rollout's ``input`` holds)."""
        task: dict[str, Any] = {
            "db_id": self.db_id,
            "schema": self.schema,
            "question": self.question,
            "gold": self.gold,
            "shape": self.shape,
        }
        if self.db_path is not None:
            task["db_path"] = self.db_path
        return task


def _question(schema: Schema, shape: str, rng: random.Random, seed: int) -> tuple[str, str]:
    parents, children = _rows(schema, seed)
    s, p = schema, schema.parent
    if shape == "filter_text":
        value = rng.choice(parents)[2]
        return f"list the {p} whose {s.text_col} is '{value}'", f"SELECT name FROM {p} WHERE {s.text_col} = '{value}'"
    if shape == "filter_num":
        numbers = sorted(row[3] for row in parents)
        bound = numbers[rng.randint(1, len(numbers) - 2)]  # some rows above, some not
        return f"which {p} have {s.num_col} above {bound}", f"SELECT name FROM {p} WHERE {s.num_col} > {bound}"
    if shape == "count":
        value = rng.choice(schema.text_values)  # sometimes absent: a count of 0 is an answer too
        return (
            f"how many {p} have {s.text_col} '{value}'",
            f"SELECT COUNT(*) FROM {p} WHERE {s.text_col} = '{value}'",
        )
    if shape == "top":
        word, direction = rng.choice((("highest", "DESC"), ("lowest", "ASC")))
        return (
            f"which {s.singular} has the {word} {s.num_col}",
            f"SELECT name FROM {p} ORDER BY {s.num_col} {direction} LIMIT 1",
        )
    if shape == "join":
        parent_ids = sorted({row[1] for row in children})
        name = parents[rng.choice(parent_ids) - 1][1]
        return (
            f"list the {s.child_text} of {s.child} by '{name}'",
            f"SELECT {s.child}.{s.child_text} FROM {s.child} JOIN {p} ON {s.child}.{s.fk} = {p}.id "
            f"WHERE {p}.name = '{name}'",
        )
    raise ValueError(f"unknown shape {shape!r}; expected one of {SHAPES}")


def make_tasks(count: int, *, seed: int, databases: Sequence[int], shapes: Sequence[str] = SHAPES) -> list[SQLTask]:
    """Draw ``count`` questions deterministically: schemas and databases at random, shapes in turn.

    Args:
        count: Number of tasks.
        seed: Seeds the draw.
        databases: Database seeds to ask about (disjoint sets give disjoint train / held-out databases).
        shapes: Query shapes to cycle through.

    Raises:
        ValueError: ``count`` is negative, or ``databases`` or ``shapes`` is empty.
    """
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    if not databases or not shapes:
        raise ValueError("databases and shapes must not be empty")
    rng = random.Random(seed)
    tasks: list[SQLTask] = []
    for index in range(count):
        schema = SCHEMAS[rng.choice(sorted(SCHEMAS))]
        db_seed = rng.choice(list(databases))
        shape = shapes[index % len(shapes)]
        question, gold = _question(schema, shape, rng, db_seed)
        tasks.append(SQLTask(f"{schema.name}_{db_seed}", schema.render(), question, gold, shape))
    return tasks


def check_task(task: dict[str, Any]) -> str | None:
    """What is wrong with a `SQLTask.to_dict` task line, if anything."""
    for key in ("db_id", "schema", "question", "gold"):
        if not isinstance(task.get(key), str) or not task[key]:
            return f"{key!r} must be a non-empty string, got {task.get(key)!r}"
    return None


def load_tasks(path: Path) -> list[dict[str, Any]]:
    """Tasks from a JSONL file of `SQLTask.to_dict` lines, checked (`agentlightning_torch.runkit.load_jsonl_tasks`).

    Raises:
        ValueError: The file is missing, a line is not a JSON object with string ``db_id``, ``schema``,
            ``question`` and ``gold``, or the file holds no task; the message names the line.
    """
    from agentlightning_torch.runkit import load_jsonl_tasks

    return load_jsonl_tasks(path, "task", check_task)


# ----- execution and reward -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExecutionResult:
    """What running one query gave.

    Attributes:
        rows: The rows (at most `MAX_ROWS`), or ``None`` when the query failed.
        error: SQLite's message when it failed.
        ordered: Whether the query orders its rows (``ORDER BY``), so row order matters.
    """

    rows: list[tuple[Any, ...]] | None
    error: str | None = None
    ordered: bool = False


def task_database(task: dict[str, Any]) -> Path:
    """The SQLite file of ``task``: its ``db_path`` (Spider) or its generated ``db_id``, built on first use."""
    if task.get("db_path"):
        return Path(task["db_path"])
    return database_path(str(task["db_id"]))


def execute(db: Path, sql: str) -> ExecutionResult:
    """Run one query read-only against ``db``: a single statement, bounded work, at most `MAX_ROWS` rows."""
    text = sql.strip().rstrip(";").strip()
    if not text:
        return ExecutionResult(None, "empty query")
    if not db.is_file():
        return ExecutionResult(None, f"database file {db} does not exist")
    steps = [0]
    deadline = time.monotonic() + _MAX_SECONDS

    def over() -> bool:
        return steps[0] * _CHECK_EVERY > _MAX_VM_STEPS or time.monotonic() > deadline

    def budget() -> int:
        steps[0] += 1
        return 1 if over() else 0

    connection = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        # One SQL function call is one VM step the progress handler cannot cut short: instr() of two strings the
        # query built with printf() ran for minutes. Bounding what a call gets bounds each step.
        connection.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, _MAX_LENGTH)
        connection.setlimit(sqlite3.SQLITE_LIMIT_LIKE_PATTERN_LENGTH, _MAX_PATTERN)
        connection.set_progress_handler(budget, _CHECK_EVERY)
        rows = connection.execute(text).fetchmany(MAX_ROWS)
    except (sqlite3.Error, sqlite3.Warning, ValueError) as error:
        message = "query too expensive" if over() else str(error)
        return ExecutionResult(None, message)
    finally:
        connection.close()
    return ExecutionResult([tuple(row) for row in rows], ordered=bool(re.search(r"\border\s+by\b", text, re.I)))


def _normal(row: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(round(value, 6) if isinstance(value, float) else value for value in row)


def execution_match(predicted: ExecutionResult, gold: ExecutionResult) -> bool:
    """Whether ``predicted`` returned the gold rows: in order if the gold query orders them, else as a multiset."""
    if predicted.rows is None or gold.rows is None:
        return False
    mine, theirs = [_normal(r) for r in predicted.rows], [_normal(r) for r in gold.rows]
    if gold.ordered:
        return mine == theirs
    return sorted(mine, key=repr) == sorted(theirs, key=repr)


def result_feedback(result: ExecutionResult, limit: int = 3) -> str:
    """The short text the checker and the rewriter read: ``ERR <message>``, ``EMPTY`` or ``ROWS n: a | b | c``."""
    if result.rows is None:
        return f"ERR {' '.join((result.error or 'failed').split()[:6])}"
    if not result.rows:
        return "EMPTY"
    shown = " | ".join(", ".join(str(v) for v in row) for row in result.rows[:limit])
    more = " ..." if len(result.rows) > limit else ""
    return f"ROWS {len(result.rows)}: {shown}{more}"
