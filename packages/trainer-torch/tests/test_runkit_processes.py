"""A training run's dashboard starts its store server when its address is first visited; a script's fast exit.

Real processes: the port is bound by this process, ``agl store serve --fd`` is started by the first connection
(which waits in the socket's backlog and is then answered by the server), the token the address carries is required.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from agentlightning.cli import stop_children
from agentlightning.store import SqliteStore
from agentlightning_torch.runkit import OnDemandDashboard


def _answer(url: str, token: str | None = None) -> int:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


@pytest.mark.timeout(300)
async def test_the_server_starts_on_the_first_visit_and_answers_it(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    store = SqliteStore(db)
    await store.enqueue_rollout({"i": 1})
    started: list[subprocess.Popen[bytes]] = []
    dashboard = OnDemandDashboard(db, 0, started.append)
    try:
        base, _, token = dashboard.url.partition("/ui#token=")
        assert base.startswith("http://127.0.0.1:") and len(token) >= 32
        assert dashboard.process is None and started == []  # nobody visited: no server
        # the first visit: accepted by the server once it has started (no retry here: the connection waits)
        assert await asyncio.to_thread(_answer, base + "/healthz") == 200
        assert len(started) == 1 and dashboard.process is started[0]
        assert token.encode() not in Path(f"/proc/{started[0].pid}/cmdline").read_bytes()  # `ps` does not show it
        assert await asyncio.to_thread(_answer, base + "/v1/stats") == 401
        assert await asyncio.to_thread(_answer, base + "/v1/stats", token) == 200
        assert await asyncio.to_thread(_answer, base + "/healthz") == 200
        assert len(started) == 1  # one server for every visit
    finally:
        dashboard.close()
        await asyncio.to_thread(stop_children, started)
        await store.close()


async def test_a_dashboard_never_visited_starts_nothing_and_frees_its_port(tmp_path: Path) -> None:
    started: list[subprocess.Popen[bytes]] = []
    dashboard = OnDemandDashboard(tmp_path / "store.db", 0, started.append)
    port = int(dashboard.url.split(":")[2].split("/")[0])
    dashboard.close()
    dashboard.close()  # twice is harmless
    assert started == [] and dashboard.process is None
    with socket.create_server(("127.0.0.1", port)):  # the port is free again
        pass


def test_agl_store_serve_refuses_a_descriptor_that_is_no_listening_socket(tmp_path: Path) -> None:

    read_end, write_end = os.pipe()
    try:
        cmd = [sys.executable, "-m", "agentlightning.cli", "store", "serve", "--db", str(tmp_path / "s.db")]
        done = subprocess.run(
            [*cmd, "--fd", str(read_end)], pass_fds=(read_end,), capture_output=True, text=True, timeout=120
        )
    finally:
        os.close(read_end)
        os.close(write_end)
    assert done.returncode == 2 and "is no listening socket" in done.stderr and "Traceback" not in done.stderr


def test_exit_process_runs_the_exit_handlers_and_flushes_before_it_ends(tmp_path: Path) -> None:
    """A training script's fast exit (`exit_process`): its code, buffered output and atexit work are not lost."""
    marker = tmp_path / "atexit.txt"
    script = (
        "import atexit, sys\n"
        "from agentlightning_torch.runkit import exit_process\n"
        f"atexit.register(lambda: open({str(marker)!r}, 'w').write('ran'))\n"
        "sys.stdout.write('summary without a newline')\n"  # still in the buffer: a pipe is block-buffered
        "sys.stderr.write('table')\n"
        "exit_process(3)\n"
        "print('never')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 3, done.stderr
    assert done.stdout == "summary without a newline" and done.stderr == "table"
    assert marker.read_text() == "ran"
