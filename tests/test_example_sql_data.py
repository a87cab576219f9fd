"""examples/sql: generated databases, questions and gold queries, execution match, transcripts, the Spider loader."""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

import pytest

pytest.importorskip("langgraph")

SQL = Path(__file__).resolve().parent.parent / "examples" / "sql"
sys.path.insert(0, str(SQL))
try:
    from sql_agent import extract_sql, parse_verdict  # pyright: ignore[reportMissingImports]
    from sql_data import (  # pyright: ignore[reportMissingImports]
        SCHEMAS,
        SHAPES,
        build_database,
        database_path,
        execute,
        execution_match,
        load_tasks,
        make_tasks,
        result_feedback,
    )
    from sql_spider import SpiderFormatError, load_spider  # pyright: ignore[reportMissingImports]
    from sql_transcripts import (  # pyright: ignore[reportMissingImports]
        TranscriptConfig,
        make_conversations,
        mistakes,
        select_list,
    )
finally:
    sys.path.remove(str(SQL))


def test_databases_are_deterministic_real_sqlite_files(tmp_path: Path) -> None:
    first = build_database(SCHEMAS["shop"], 3, tmp_path / "a.sqlite")
    second = build_database(SCHEMAS["shop"], 3, tmp_path / "b.sqlite")
    other = build_database(SCHEMAS["shop"], 4, tmp_path / "c.sqlite")

    def rows(path: Path) -> list[tuple[object, ...]]:
        with sqlite3.connect(path) as connection:
            return connection.execute(
                "SELECT * FROM customers JOIN orders ON orders.customer_id = customers.id"
            ).fetchall()

    assert rows(first) == rows(second) != rows(other)
    assert len(rows(first)) >= 7
    assert database_path("library_5", tmp_path).is_file()  # built on first use
    with pytest.raises(ValueError, match="unknown generated database"):
        database_path("nope_1", tmp_path)


def test_every_gold_query_runs_and_returns_rows_and_tasks_are_deterministic() -> None:
    tasks = make_tasks(60, seed=1, databases=range(3))
    assert tasks == make_tasks(60, seed=1, databases=range(3))
    assert {t.shape for t in tasks} == set(SHAPES)
    for task in tasks:
        result = execute(database_path(task.db_id), task.gold)
        assert result.rows, (task, result)
        if task.shape != "count":
            assert result_feedback(result).startswith("ROWS")


def test_execution_match_is_the_reward_order_only_when_the_gold_orders() -> None:
    db = database_path("shop_1")
    gold = execute(db, "SELECT name FROM customers WHERE age > 30")
    assert execution_match(execute(db, "SELECT name FROM customers WHERE 30 < age ORDER BY name DESC"), gold)
    assert not execution_match(execute(db, "SELECT name FROM customers"), gold)
    assert not execution_match(execute(db, "SELECT nme FROM customers"), gold)
    top = execute(db, "SELECT name FROM customers ORDER BY age DESC LIMIT 2")
    assert top.ordered and not execution_match(execute(db, "SELECT name FROM customers ORDER BY age ASC LIMIT 2"), top)
    failed = execute(db, "SELECT nope FROM customers")
    assert failed.rows is None and result_feedback(failed).startswith("ERR no such")
    assert result_feedback(execute(db, "SELECT name FROM customers WHERE city = 'Atlantis'")) == "EMPTY"


def test_queries_run_read_only_and_bounded() -> None:
    db = database_path("shop_2")
    assert execute(db, "DELETE FROM customers").rows is None  # read-only connection
    assert execute(db, "SELECT 1; SELECT 2").rows is None  # one statement only
    assert execute(db, "").error == "empty query"
    endless = "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n) SELECT count(*) FROM n"
    assert execute(db, endless).error == "query too expensive"
    assert execute(db, "SELECT COUNT(*) FROM customers").rows


def test_a_query_that_would_run_for_minutes_is_cut_off() -> None:
    db = database_path("shop_2")
    # One instr() call over strings the query builds itself: a single VM step (no progress handler sees it) that ran
    # for about six minutes here (a 200 MB haystack, a 50 kB needle).
    one_call = "SELECT instr(printf('%.*c', 200000000, 'a'), printf('%.*c', 50000, 'a') || 'b')"
    assert execute(db, one_call).rows == [(None,)]  # printf() refuses to build a string over the length bound
    assert execute(db, "SELECT length(zeroblob(200000000))").error == "string or blob too big"
    # Many costly calls, each within bounds: cut off by the wall clock before the step budget (about 15 min before).
    many_calls = (
        "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n WHERE x < 5000) "
        "SELECT sum(instr(printf('%.*c', 99000 - x, 'a'), printf('%.*c', 45000, 'a') || 'b')) FROM n"
    )
    assert execute(db, many_calls).error == "query too expensive"
    assert execute(db, "SELECT name FROM customers WHERE name LIKE '%a%'").rows  # ordinary queries still run


def test_reply_parsing() -> None:
    assert extract_sql("```sql\nSELECT a FROM t;\n```") == "SELECT a FROM t"
    assert extract_sql("Here it is: SELECT a FROM t; SELECT b") == "SELECT a FROM t"
    assert extract_sql("SELECT name FROM customers") == "SELECT name FROM customers"
    assert parse_verdict("OK") and parse_verdict("ok, looks right") and not parse_verdict("BAD")
    assert not parse_verdict("")


def test_task_file_loading_names_the_bad_line(tmp_path: Path) -> None:
    good = make_tasks(2, seed=0, databases=[0])
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(json.dumps(t.to_dict()) for t in good) + "\n", encoding="utf-8")
    assert [t["question"] for t in load_tasks(path)] == [t.question for t in good]
    path.write_text(json.dumps({"db_id": "shop_0", "schema": "s", "question": ""}) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"tasks.jsonl:1: 'question' must be a non-empty string"):
        load_tasks(path)


def test_transcripts_are_partly_right_and_the_mistakes_are_wrong() -> None:
    for task in make_tasks(25, seed=5, databases=[0, 1]):
        db = database_path(task.db_id)
        gold = execute(db, task.gold)
        silent, loud = mistakes(task)
        for wrong in (silent, loud):
            assert not execution_match(execute(db, wrong), gold), (task, wrong)
            # The path is decided by what is selected; the rest of the query is the gold query's.
            assert select_list(wrong) != select_list(task.gold)
            assert wrong.split(" FROM ", 1)[1] == task.gold.split(" FROM ", 1)[1]
        assert execute(db, loud).error is not None, loud  # the checker sends it to the rewriter
    conversations = make_conversations(300, seed=0, config=TranscriptConfig(writer_right=0.3))
    writer = [c for c in conversations if c[0]["content"].endswith("Write one SQLite query.")]
    checker = [c for c in conversations if c[0]["content"].endswith("OK or BAD?")]
    rewriter = [c for c in conversations if c[0]["content"].endswith("Write a corrected SQLite query.")]
    assert len(writer) == 300 and rewriter and len(checker) == len(writer) + len(rewriter)
    assert {c[1]["content"] for c in checker} == {"OK", "BAD"}
    golds = {t.gold for t in make_tasks(300, seed=0, databases=range(12))}
    right = sum(c[1]["content"] in golds for c in writer)
    assert 0.15 < right / len(writer) < 0.45


def _spider(root: Path) -> None:
    """A two-question Spider folder written by hand: tables.json, dev.json and one SQLite database."""
    tables = [
        {
            "db_id": "concert_singer",
            "table_names_original": ["singer", "concert"],
            "table_names": ["singer", "concert"],
            "column_names_original": [[-1, "*"], [0, "Singer_ID"], [0, "Name"], [0, "Age"], [1, "concert_ID"]],
            "column_names": [[-1, "*"], [0, "singer id"], [0, "name"], [0, "age"], [1, "concert id"]],
            "column_types": ["text", "number", "text", "number", "number"],
            "primary_keys": [1, 4],
            "foreign_keys": [],
        }
    ]
    dev = [
        {"db_id": "concert_singer", "question": "How many singers do we have?", "query": "SELECT count(*) FROM singer"},
        {
            "db_id": "concert_singer",
            "question": "What is the name of the oldest singer?",
            "query": "SELECT Name FROM singer ORDER BY Age DESC LIMIT 1",
        },
    ]
    (root / "tables.json").write_text(json.dumps(tables), encoding="utf-8")
    (root / "dev.json").write_text(json.dumps(dev), encoding="utf-8")
    (root / "database" / "concert_singer").mkdir(parents=True)
    with sqlite3.connect(root / "database" / "concert_singer" / "concert_singer.sqlite") as connection:
        connection.execute("CREATE TABLE singer (Singer_ID int, Name text, Age int)")
        connection.execute("CREATE TABLE concert (concert_ID int)")
        connection.executemany("INSERT INTO singer VALUES (?, ?, ?)", [(1, "Joe", 52), (2, "Tim", 29)])
    connection.close()


def test_spider_loader_reads_the_public_format(tmp_path: Path) -> None:
    _spider(tmp_path)
    tasks = load_spider(tmp_path, "dev")
    assert [t.question for t in tasks] == ["How many singers do we have?", "What is the name of the oldest singer?"]
    assert tasks[0].schema == "singer(Singer_ID,Name,Age) concert(concert_ID)"
    assert tasks[1].to_dict()["db_path"].endswith("concert_singer.sqlite")
    assert execute(Path(tasks[1].db_path or ""), tasks[1].gold).rows == [("Joe",)]
    assert len(load_spider(tmp_path, "dev", limit=1)) == 1


def test_spider_loader_errors_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(SpiderFormatError, match=r"tables\.json does not exist"):
        load_spider(tmp_path)
    _spider(tmp_path)
    dev = json.loads((tmp_path / "dev.json").read_text())
    dev.append({"db_id": "missing_db", "question": "q", "query": "SELECT 1"})
    (tmp_path / "dev.json").write_text(json.dumps(dev))
    with pytest.raises(SpiderFormatError, match=r"entry 2: database 'missing_db' is not in tables.json"):
        load_spider(tmp_path)
    (tmp_path / "dev.json").write_text('[{"db_id": "concert_singer", "question": 3}]')
    with pytest.raises(SpiderFormatError, match="entry 0 needs string 'db_id', 'question' and 'query'"):
        load_spider(tmp_path)
