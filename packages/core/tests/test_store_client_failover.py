"""One store, several servers: `StoreClient` over a list of URLs fails over when its server dies, `agl runner`
spreads its processes over the list, and `StoreServing(database=..., servers=N)` opens the database and its servers.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

import agentlightning as agl
from agentlightning.cli._runner import spread_urls
from agentlightning.store import PostgresStore, StoreClient, StoreError
from agentlightning.testing import PostgresServer, StoreServerProcessForTests, free_port

TOKEN = "a-token-of-24-characters"


def test_a_client_takes_several_urls_and_refuses_a_bad_one() -> None:
    client = StoreClient("http://a:1/, http://b:2", token=TOKEN)
    assert client.urls == ("http://a:1", "http://b:2") and client.url == "http://a:1"
    assert StoreClient(["http://a:1", "http://b:2"]).urls == client.urls
    assert client.reopen_spec()[1]["url"] == "http://a:1,http://b:2"
    with pytest.raises(ValueError, match="'b:2'"):
        StoreClient("http://a:1,b:2")
    with pytest.raises(ValueError, match="http://host:port"):
        StoreClient(" , ")


def test_runner_processes_prefer_different_servers_in_turn() -> None:
    urls = "http://a:1,http://b:2,http://c:3"
    assert [spread_urls(urls, index) for index in range(4)] == [
        "http://a:1,http://b:2,http://c:3",
        "http://b:2,http://c:3,http://a:1",
        "http://c:3,http://a:1,http://b:2",
        "http://a:1,http://b:2,http://c:3",
    ]
    assert spread_urls("http://a:1", 5) == "http://a:1"


def test_a_client_fails_over_to_the_next_server_when_its_own_dies(agl_postgres: PostgresServer) -> None:
    dsn = agl_postgres.new_schema()
    with (
        StoreServerProcessForTests(db=dsn, token=TOKEN) as first,
        StoreServerProcessForTests(db=dsn, token=TOKEN) as second,
    ):

        async def check() -> None:
            client = StoreClient([first.url, second.url], token=TOKEN, backoff=0.01)
            try:
                await client.enqueue_rollout({"q": 1}, rollout_id="r-1")
                claim = await client.dequeue_rollout(worker_id="w")
                assert claim is not None and client.url == first.url
                await asyncio.to_thread(first.kill)  # SIGKILL: the kept-alive connection dies unanswered
                await client.add_spans([])  # nothing to send still reaches a server
                await client.finish_attempt("r-1", claim.attempt.attempt_id, "succeeded")
                assert client.url == second.url  # the next server answered, and keeps answering
                assert (await client.get_rollout("r-1")).status == "succeeded"
                assert [a.status for a in await client.query_attempts("r-1")] == ["succeeded"]
            finally:
                await client.close()

        asyncio.run(check())


def test_serving_a_database_opens_it_and_its_servers(agl_postgres: PostgresServer, tmp_path: Path) -> None:
    dsn = agl_postgres.new_schema()
    serving = agl.StoreServing(database=dsn, servers=2)
    assert serving.describe(tmp_path / "store.db").startswith("postgresql://agl@127.0.0.1:")

    async def check() -> None:
        opened = await serving.open(tmp_path / "store.db", fresh=True)
        try:
            assert isinstance(opened.store, PostgresStore) and len(opened.servers) == 2
            assert opened.server is opened.servers[0] and opened.token
            flag, urls = opened.runner_args
            assert flag == "--store-url" and urls.split(",") == [server.url for server in opened.servers]
            await opened.store.enqueue_rollout({"q": 1}, rollout_id="r-1")
            for server in opened.servers:  # every server serves the one database
                client = StoreClient(server.url, token=opened.token)
                assert (await client.get_rollout("r-1")).rollout_id == "r-1"
                await client.close()
        finally:
            await opened.close()
        assert all(server.pid is None for server in opened.servers)
        with pytest.raises(StoreError, match=r"holds 1 rollouts already .* a schema of its own"):
            await serving.open(tmp_path / "store.db", fresh=True)

    asyncio.run(check())


def test_an_unreachable_database_is_one_line(tmp_path: Path) -> None:
    pytest.importorskip("psycopg")
    serving = agl.StoreServing(database=f"postgresql://agl:secret@127.0.0.1:{free_port()}/agl", servers=2)
    with pytest.raises(StoreError) as caught:
        asyncio.run(serving.open(tmp_path / "store.db", fresh=True))
    message = str(caught.value)
    assert "cannot connect to the PostgreSQL store agl@127.0.0.1:" in message
    assert "\n" not in message and "secret" not in message


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"servers": 2}, "several store servers need the store in PostgreSQL"),
        ({"database": "runs/store.db"}, "must be a PostgreSQL database: postgresql://"),
        ({"database": "postgresql://h/db", "url": "http://x:1"}, "url and database exclude each other"),
        ({"database": "postgresql://h/db", "servers": 0}, "greater than or equal to 1"),
        ({"url": "http://a:1,b:2"}, "'b:2'"),
    ],
)
def test_unusable_database_settings_are_refused(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        agl.StoreServing(**fields)  # pyright: ignore[reportArgumentType]


def test_a_missing_driver_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)  # `import psycopg` now raises ImportError
    with pytest.raises(ImportError, match=r'pip install "agentlightning-core\[postgres\]"'):
        agl.StoreServing(database="postgresql://agl@127.0.0.1/agl").check_database()
