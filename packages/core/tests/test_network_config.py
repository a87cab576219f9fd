"""The trainer side's network settings and its served store: tokens off loopback, advertised address, access log."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from pydantic import ValidationError

import agentlightning as agl
from agentlightning.store._serving import parse_host_port
from agentlightning.testing import free_port

TOKEN = "a-token-of-24-characters"


def test_defaults_keep_the_store_a_local_file(tmp_path: Path) -> None:
    serving = agl.StoreServing()
    assert serving.bind is None

    async def check() -> None:
        opened = await serving.open(tmp_path / "s.db")
        assert isinstance(opened.store, agl.SqliteStore) and opened.server is None
        assert opened.runner_args == ["--db", str(tmp_path / "s.db")]
        await opened.close()

    asyncio.run(check())


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"serve": "0.0.0.0:4747"}, "the store on 0.0.0.0 without a token"),
        ({"serve": "10.1.2.3:4747", "token": "x" * 15}, "15-character token"),
        ({"serve": "4747"}, "HOST:PORT"),
        ({"serve": "h:70000"}, "between 0 and 65535"),
        ({"serve": "127.0.0.1:1", "url": "http://x:1"}, "exclude each other"),
        ({"url": "trainer:4747"}, "http://"),
    ],
)
def test_unsafe_or_unusable_store_settings_are_refused(fields: dict[str, str], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        agl.StoreServing(**fields)  # pyright: ignore[reportArgumentType]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"host": "10.1.2.3"}, "LLM proxy on 10.1.2.3 without a token"),
        ({"host": "10.1.2.3", "token": "short"}, "use at least 16 characters"),
        ({"host": "0.0.0.0", "token": TOKEN}, "advertised_url"),
        ({"host": "10.1.2.3", "token": TOKEN, "admin_token": "short"}, "admin routes"),
    ],
)
def test_unsafe_proxy_settings_are_refused(fields: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        agl.ProxySettings(**fields).check_exposure()  # pyright: ignore[reportArgumentType]


def test_settings_for_runners_on_other_machines() -> None:
    serving = agl.StoreServing(serve="[::]:4747", token=TOKEN)
    assert serving.bind == ("::", 4747)
    assert parse_host_port(":4747") == ("0.0.0.0", 4747)
    proxy = agl.ProxySettings(host="0.0.0.0", port=4748, advertised_url="http://trainer.example:4748/", token=TOKEN)
    proxy.check_exposure()
    assert proxy.advertised_url == "http://trainer.example:4748"


def test_serving_opens_the_file_and_serves_it(tmp_path: Path) -> None:
    port = free_port()
    serving = agl.StoreServing(serve=f"127.0.0.1:{port}", token=TOKEN, heartbeat_timeout_s=7, access_log=True)

    async def check() -> None:
        opened = await serving.open(tmp_path / "run" / "s.db", fresh=True)
        try:
            assert opened.server is not None and opened.server.url == f"http://127.0.0.1:{port}"
            assert opened.store.retry_policy.heartbeat_timeout == 7
            rollout = await opened.store.enqueue_rollout({"q": 1})
            client = agl.StoreClient(opened.server.url, token=TOKEN)
            assert (await client.get_rollout(rollout.rollout_id)).rollout_id == rollout.rollout_id
            assert (await client.fetch_retry_policy()).heartbeat_timeout == 7  # the served store applies it too
            await client.close()
        finally:
            await opened.close()

    asyncio.run(check())
    assert (tmp_path / "run" / "store_server.log").read_text()


def test_store_server_serves_the_file_with_its_token_and_logs_client_addresses(tmp_path: Path) -> None:
    db = tmp_path / "trainer.db"
    log = tmp_path / "store.log"
    trainer_store = agl.SqliteStore(db)
    with agl.StoreServerProcess(db, "127.0.0.1", free_port(), token=TOKEN, access_log=True, log_file=log) as server:

        async def remote() -> None:
            ours = await trainer_store.enqueue_rollout({"q": 1})
            anonymous = agl.StoreClient(server.url, retries=0)
            with pytest.raises(agl.StoreError, match=r"401|token"):
                await anonymous.get_rollout(ours.rollout_id)
            await anonymous.close()
            client = agl.StoreClient(server.url, token=TOKEN)
            claim = await client.dequeue_rollout("remote-worker")
            assert claim is not None and claim.rollout.rollout_id == ours.rollout_id
            await client.close()

        asyncio.run(remote())
        assert TOKEN not in " ".join(server.command())  # the token travels in the environment, not in `ps`
    asyncio.run(trainer_store.close())
    lines = log.read_text()
    assert "127.0.0.1:" in lines and '"POST /v1/rollouts/dequeue HTTP/1.1" 200' in lines


def test_store_server_refuses_to_serve_off_loopback_without_a_token(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="without a token"):
        agl.StoreServerProcess(tmp_path / "x.db", "0.0.0.0", 4747)
