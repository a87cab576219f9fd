"""Worker ids name the runner process, whether its workers run in it or in its watched host process."""

from __future__ import annotations

import os
import socket

from agentlightning.runner._workers import HOSTED_BY, worker_id_of, worker_prefix
from agentlightning.store import runner_of


def test_a_runners_own_worker_id_names_its_process() -> None:
    host = socket.gethostname()
    assert worker_id_of(3) == f"{host}:{os.getpid()}:3"
    assert runner_of(worker_id_of(3)) == f"{host}:{os.getpid()}"


def test_a_hosted_worker_id_names_the_runner_and_its_host_process() -> None:
    host = socket.gethostname()
    HOSTED_BY[:] = [4242]
    try:
        worker_id = worker_id_of(5)
    finally:
        HOSTED_BY.clear()
    assert worker_id == f"{host}:4242:w{os.getpid()}.5"
    assert worker_id.startswith(worker_prefix(os.getpid(), 4242))
    assert not worker_id.startswith(worker_prefix(os.getpid()))  # the host's own prefix is the runner's, not its pid
    assert runner_of(worker_id) == f"{host}:4242"  # counted with its runner (agl train's per-runner counts)
    assert worker_id.split(":")[1] == "4242"


def test_other_ids_are_their_own_runner() -> None:
    for worker_id in ("runner-1", "host:12:wx.3", "host:12:w3.", "host:12:w3.x"):
        assert runner_of(worker_id) == worker_id
