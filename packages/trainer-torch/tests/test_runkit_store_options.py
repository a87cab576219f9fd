"""Where a training run's store is: ``--store`` / ``--store-url`` / ``--store-servers`` as `store_serving` reads them,
a PostgreSQL database included, and every bad combination as one line."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import pytest

from agentlightning.cli import add_network_arguments
from agentlightning.testing import PostgresServer, free_port
from agentlightning_torch.runkit import UsageError, store_serving

DSN = "postgresql://agl:secret@db.example:5432/agl"


def _serving(*argv: str) -> Any:
    parser = argparse.ArgumentParser()
    add_network_arguments(parser)
    return store_serving(parser.parse_args(list(argv)))


def test_a_database_given_by_store_or_store_url_is_served_by_its_servers(agl_postgres: PostgresServer) -> None:
    dsn = agl_postgres.dsn
    serving = _serving(
        "--store", dsn, "--store-servers", "3", "--serve-store", "0.0.0.0:4747", "--store-token", "t" * 20
    )
    assert (serving.database, serving.servers, serving.url, serving.bind) == (dsn, 3, None, ("0.0.0.0", 4747))
    assert _serving("--store-url", dsn).database == dsn  # the examples' option takes a database too
    assert _serving("--store", "http://trainer:4747/").url == "http://trainer:4747"
    assert _serving("--store-url", "http://a:1,http://b:2").url == "http://a:1,http://b:2"
    default = _serving()
    assert default.database is None and default.url is None and default.servers == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--store", "runs/store.db"], "--store takes a PostgreSQL database"),
        (["--store", DSN, "--store-url", "http://a:1"], "--store and --store-url both say where the store is"),
        (["--store-servers", "2"], "--store-servers needs the store in a PostgreSQL database"),
        (["--store-url", "http://a:1", "--store-servers", "2"], "--store-servers needs the store in a PostgreSQL"),
        (["--store", DSN, "--store-servers", "0"], "--store-servers must be at least 1"),
        (["--store", "postgresql://agl:secret@h/db?bogus=1"], "--store: not a valid PostgreSQL DSN"),
    ],
)
def test_bad_store_options_are_one_line(argv: list[str], message: str) -> None:
    pytest.importorskip("psycopg")
    with pytest.raises(UsageError, match=message) as caught:
        _serving(*argv)
    assert "\n" not in str(caught.value) and "secret" not in str(caught.value)


def test_a_missing_postgresql_driver_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)  # `import psycopg` now raises ImportError
    with pytest.raises(UsageError, match=r'^--store: .*pip install "agentlightning-core\[postgres\]"'):
        _serving("--store", DSN)


def test_an_unreachable_database_is_refused_before_the_run_starts() -> None:
    pytest.importorskip("psycopg")
    with pytest.raises(UsageError, match=r"^--store: cannot connect to the PostgreSQL store agl@127.0.0.1:\d+/agl: "):
        _serving("--store", f"postgresql://agl:secret@127.0.0.1:{free_port()}/agl")  # nothing listens there
