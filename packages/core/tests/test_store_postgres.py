"""PostgresStore: the conformance kit on a real PostgreSQL server, and what is specific to it (DSN and
connection errors, schema versions, storage refusals, sharing one database between stores)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from agentlightning import PostgresStore
from agentlightning.store import LightningStore, RetryPolicy, RolloutRequest, StorageError, StoreError
from agentlightning.testing import PostgresServer, StoreConformanceTests
from agentlightning.testing._store_kit import StoreFactory

psycopg = pytest.importorskip("psycopg", reason='the PostgreSQL driver: pip install "agentlightning-core[postgres]"')
sql = psycopg.sql


class TestPostgresStore(StoreConformanceTests):
    supports_reopen = True
    supports_processes = True

    @pytest.fixture
    async def store_factory(self, agl_postgres: PostgresServer) -> AsyncIterator[StoreFactory]:
        stores: list[PostgresStore] = []

        async def make(retry_policy: RetryPolicy | None = None) -> LightningStore:
            store = PostgresStore(agl_postgres.new_schema(), retry_policy=retry_policy, pool_size=4)
            stores.append(store)
            return store

        yield make
        for store in stores:
            await store.close()

    @pytest.fixture
    async def store_reopener(self) -> Callable[[LightningStore], Awaitable[LightningStore]]:
        async def reopen(store: LightningStore) -> LightningStore:
            assert isinstance(store, PostgresStore)
            cls, kwargs = store.reopen_spec()
            return cls(**kwargs)

        return reopen


# ------------------------------------------------------------------------------------------- opening


AGL = [sys.executable, "-c", "import sys; from agentlightning.cli import main; sys.exit(main())"]


@pytest.mark.parametrize(
    ("dsn", "expected"),
    [
        (
            "postgresql://agl:s3cret-pw@127.0.0.1:1/nothing",
            "cannot connect to the PostgreSQL store agl@127.0.0.1:1/nothing",
        ),
        ("postgresql://agl:s3cret-pw@[::1/x", "not a valid PostgreSQL DSN"),
    ],
    ids=["unreachable", "malformed"],
)
def test_cli_refuses_an_unusable_database_in_one_line_with_exit_code_2(dsn: str, expected: str) -> None:
    done = subprocess.run(
        [*AGL, "store", "serve", "--db", dsn, "--port", "0"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert expected in lines[0]
    assert "s3cret-pw" not in done.stderr  # the password never reaches a message


def test_a_missing_driver_says_how_to_install_it() -> None:
    code = (
        "import sys\n"
        "sys.modules['psycopg'] = None\n"  # as if the extra were not installed
        "from agentlightning import PostgresStore\n"
        "try:\n"
        "    PostgresStore('postgresql://agl@127.0.0.1:1/x')\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert 'pip install "agentlightning-core[postgres]"' in done.stdout


async def test_a_database_of_a_newer_schema_is_refused(agl_postgres: PostgresServer) -> None:
    dsn = agl_postgres.new_schema()
    store = PostgresStore(dsn)
    await store.close()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE agl_schema SET version = 99")
    with pytest.raises(StoreError, match="schema version 99"):
        PostgresStore(dsn)


async def test_servers_opening_one_empty_database_at_once_create_the_schema_once(agl_postgres: PostgresServer) -> None:
    dsn = agl_postgres.new_schema()
    stores = await asyncio.gather(*(asyncio.to_thread(PostgresStore, dsn, pool_size=1) for _ in range(4)))
    try:
        await stores[0].enqueue_rollout("x", rollout_id="r")
        assert [r.rollout_id for r in await stores[3].query_rollouts()] == ["r"]
        with psycopg.connect(dsn, autocommit=True) as conn:
            assert conn.execute("SELECT version FROM agl_schema").fetchall() == [(3,)]
    finally:
        for store in stores:
            await store.close()


async def test_a_database_that_refuses_writes_is_a_storage_error_until_it_accepts_them(
    agl_postgres: PostgresServer,
) -> None:
    """Writes the database refuses (here: privileges taken away) raise `StorageError` (507 when served), are
    reported by ``storage_error`` (``/healthz`` 503), and stop being reported once a write succeeds again."""
    role = f"writer_{uuid.uuid4().hex[:8]}"
    dsn = agl_postgres.new_schema()
    schema = dsn.rsplit("%3D", 1)[1]
    with psycopg.connect(agl_postgres.dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        conn.execute(sql.SQL("GRANT ALL ON SCHEMA {} TO {}").format(sql.Identifier(schema), sql.Identifier(role)))
    store = PostgresStore(dsn.replace("agl@", f"{role}@"))
    try:
        await store.enqueue_rollout("before", rollout_id="before")
        with psycopg.connect(agl_postgres.dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("REVOKE INSERT ON {}.agl_rollouts FROM {}").format(sql.Identifier(schema), sql.Identifier(role))
            )
        with pytest.raises(StorageError, match="database is read-only"):
            await store.enqueue_rollout("refused", rollout_id="refused")
        assert store.storage_error is not None and "read-only" in store.storage_error
        assert [r.rollout_id for r in await store.query_rollouts()] == ["before"]  # reads still work
        with psycopg.connect(agl_postgres.dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("GRANT INSERT ON {}.agl_rollouts TO {}").format(sql.Identifier(schema), sql.Identifier(role))
            )
        await store.enqueue_rollout("after", rollout_id="after")
        assert store.storage_error is None
    finally:
        await store.close()


async def test_text_postgresql_cannot_hold_is_refused_as_bad_input(agl_postgres: PostgresServer) -> None:
    store = PostgresStore(agl_postgres.new_schema())
    try:
        await store.enqueue_rollout({"question": "a\x00b"})  # JSON text: a NUL travels escaped, and comes back
        (rollout,) = await store.query_rollouts()
        assert rollout.input == {"question": "a\x00b"}
        with pytest.raises(ValueError, match="NUL"):  # plain text (ids are refused before, by the one id rule)
            await store.dequeue_rollout("worker\x00")
        assert (await store.stats()).attempts == 0
    finally:
        await store.close()


async def test_one_request_sent_to_two_servers_at_once_claims_one_rollout(agl_postgres: PostgresServer) -> None:
    """A client that retries a dequeue through another server while the first still works on it gets one claim."""
    dsn = agl_postgres.new_schema()
    first, second = PostgresStore(dsn, pool_size=2), PostgresStore(dsn, pool_size=2)
    try:
        # One rollout more than the requests: a try that finds the only queuing row locked by its twin sees an
        # empty queue, and if its answer is remembered first both tries get ``None`` (nothing is claimed twice and
        # the rollout stays queued): consistent, but not what this test is about.
        await first.enqueue_rollouts([RolloutRequest(rollout_id=f"same-{i}") for i in range(31)])
        for i in range(30):
            a, b = await asyncio.gather(
                first.dequeue_rollout("w", request_id=f"req-{i}"), second.dequeue_rollout("w", request_id=f"req-{i}")
            )
            assert a is not None and a == b
        stats = await second.stats()
        assert stats.attempts == 30 and stats.rollouts["running"] == 30 and stats.rollouts["queuing"] == 1
        assert await first.dequeue_rollout("w", request_id="req-0") == await second.dequeue_rollout(
            "w", request_id="req-0"
        )
    finally:
        await first.close()
        await second.close()
