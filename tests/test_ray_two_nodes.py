"""``agl train --runners ray=HEAD:PORT`` on two Ray nodes, for real: a head and a worker node in two network namespaces.

The Ray head runs in one namespace (with the trainer, which serves the store and the proxy on the namespace's
address, with tokens), a Ray worker node in the other (joined by a veth pair). The worker node does not see the
agent's folder (an empty tmpfs over it, in the node's own mount namespace): its runner can only run the agent from
the copy Ray ships (the runtime env's ``working_dir``). The trainer prints where each runner ran
(``ray runner I: node ... pid ... actor ... cwd ...``); a runner's network namespace (``/proc/PID/ns/net``) says
which node it is on, and the store's attempts carry the runner process's pid in their worker id.

Needs root and iproute2 (``ip netns``), as CI has; skipped elsewhere with the reason.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("agentlightning_torch")
pytest.importorskip("langgraph")
pytest.importorskip("ray")

from agentlightning.testing import NetnsPair, netns_pair, wait_until, why_no_netns

ROOT = Path(__file__).resolve().parent.parent
CALC = ROOT / "examples" / "calc"
RAY_PORT, STORE_PORT, PROXY_PORT = 6379, 4747, 4748
PLACE = re.compile(r"ray runner (\d+): node (\w+) host \S+ pid (\d+) actor (\d+) cwd (\S+)")
RESTARTS = re.compile(r"ray runner (\d+): node \w+ host \S+ pid \d+ actor \d+ started (\d+)x")


@dataclass
class Cluster:
    """A Ray head (in ``pair.trainer``) and a worker node (in ``pair.workers``, without ``app``)."""

    pair: NetnsPair
    app: Path
    ray_tmp: Path

    def namespace_of(self, pid: int) -> str:
        """The namespace a process runs in (its network namespace's inode is the named one's)."""
        inode = os.stat(f"/proc/{pid}/ns/net").st_ino
        names = [ns for ns in (self.pair.trainer, self.pair.workers) if os.stat(f"/run/netns/{ns}").st_ino == inode]
        return names[0] if names else "?"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    reason = why_no_netns()
    if reason is not None:
        pytest.skip(reason)
    folder = tmp_path_factory.mktemp("ray-two-nodes")
    app = folder / "app"  # the agent's code alone: the folder shipped to the nodes
    shutil.copytree(CALC, app, ignore=shutil.ignore_patterns("checkpoint", "data", "*.png", "__pycache__"))
    ray_tmp = Path(tempfile.mkdtemp(prefix="aglray", dir="/tmp"))  # short: Ray's socket paths
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_AUTH_MODE": "disabled",  # the namespaces share one home: no cluster token to hand over
        "PYTHONPATH": os.pathsep.join(str(p) for p in sorted((ROOT / "packages").glob("*/src"))),
    }
    ray = [str(Path(sys.executable).parent / "ray"), "start", "--num-cpus=2", "--object-store-memory=100000000"]
    ray += ["--disable-usage-stats", f"--temp-dir={ray_tmp}"]
    try:
        with netns_pair(subnet_byte=215) as pair:
            head = [*ray, "--head", f"--node-ip-address={pair.trainer_ip}", f"--port={RAY_PORT}"]
            pair.start_ray_node(pair.trainer, [*head, "--include-dashboard=false"], env, folder / "ray-head.log")
            worker = [*ray, f"--address={pair.trainer_ip}:{RAY_PORT}", f"--node-ip-address={pair.worker_ip}"]
            node = pair.start_ray_node(pair.workers, worker, env, folder / "ray-worker.log", hide=app)
            # the worker node really lacks the agent's folder: a tmpfs (empty) is mounted over it there
            assert f" {app} " in Path(f"/proc/{node.pid}/mountinfo").read_text()
            yield Cluster(pair, app, ray_tmp)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)


def _train(cluster: Cluster, out: Path) -> subprocess.Popen[str]:
    """``agl train`` in the head's namespace: runners placed by Ray on the cluster, the store served on the link.

    It trains until the test stops it (Ctrl-C) once what it waits for happened: which runner claims what is up to
    the runners, so no fixed number of iterations is sure to show it.
    """
    pair = cluster.pair
    cmd = [
        sys.executable, "-m", "agentlightning.cli", "train", "--agent", "calc_agent:calc_agent",
        "--app-dir", str(cluster.app), "--model", str(CALC / "checkpoint"),
        "--tasks", str(CALC / "data" / "train.jsonl"), "--tool-parser", "calc", "--iterations", "1000",
        "--lr", "3e-4", "--output", str(out),
        "--runners", f"ray={pair.trainer_ip}:{RAY_PORT}", "--runner-processes", "2", "--runner-cpus", "1",
        "--ray-placement", "spread", "--serve-store", f"{pair.trainer_ip}:{STORE_PORT}",
        "--proxy-host", pair.trainer_ip, "--proxy-port", str(PROXY_PORT), "--heartbeat-timeout", "5",
        "--tasks-per-iteration", "4", "--samples-per-task", "4", "--workers", "8", "--max-tokens", "24", "--quiet",
    ]  # fmt: skip
    env = {"AGL_STORE_TOKEN": secrets.token_urlsafe(24), "AGL_PROXY_TOKEN": secrets.token_urlsafe(24)}
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in sorted((ROOT / "packages").glob("*/src")))
    return pair.popen(pair.trainer, cmd, {**env, "OMP_NUM_THREADS": "1"}, out.parent / "trainer.log", cwd=ROOT)


def _log(out: Path) -> str:
    return (out.parent / "trainer.log").read_text()


def _wait(trainer: subprocess.Popen[str], out: Path, condition: Callable[[], bool], what: str) -> None:
    """Wait for ``condition`` (the store's or the log's state), failing with the log if the trainer ends first."""

    def done() -> bool:
        assert trainer.poll() is None, f"the trainer ended waiting for {what}: {_log(out)[-3000:]}"
        return condition()

    wait_until(done, what)


def _stop(trainer: subprocess.Popen[str], out: Path) -> str:
    """Ctrl-C: the run stops (its runners with it); returns the trainer's log."""
    trainer.send_signal(signal.SIGINT)
    assert trainer.wait(240) == 130, _log(out)[-4000:]
    return _log(out)


def _attempts(db: Path) -> list[tuple[str, str, str]]:
    """``(rollout_id, worker_id, status)`` of every attempt; none while the trainer has not made the tables."""
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30) as conn:
            return conn.execute("SELECT rollout_id, worker_id, status FROM attempts").fetchall()
    except sqlite3.OperationalError:
        return []


def _iterations(out: Path) -> int:
    metrics = out / "metrics.jsonl"
    return len([line for line in metrics.read_text().splitlines() if line]) if metrics.exists() else 0


def _pid(worker_id: str | None) -> int:
    return int(str(worker_id).split(":")[1]) if worker_id else 0


def _nothing_recorded_twice(db: Path, iterations: int) -> None:
    """No rollout succeeded twice, no span is stored under two attempts; the first iterations' rollouts succeeded."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        twice = "SELECT rollout_id FROM attempts WHERE status = 'succeeded' GROUP BY rollout_id HAVING COUNT(*) > 1"
        assert conn.execute(twice).fetchall() == []
        spans = "SELECT span_key FROM spans GROUP BY span_key HAVING COUNT(DISTINCT attempt_key) > 1"
        assert conn.execute(spans).fetchall() == []
        for it in range(iterations):
            rows = conn.execute("SELECT status FROM rollouts WHERE rollout_id LIKE ?", (f"it{it}-%",)).fetchall()
            assert [s for (s,) in rows] == ["succeeded"] * 16, (it, rows)


def _places(log: str) -> dict[int, tuple[str, int, int, str]]:
    """Runner index -> (node id, runner pid, actor pid, cwd), as the trainer printed them at the start."""
    return {int(i): (node, int(pid), int(actor), cwd) for i, node, pid, actor, cwd in PLACE.findall(log)}


def _placed(trainer: subprocess.Popen[str], out: Path) -> dict[int, tuple[str, int, int, str]]:
    """Where the two runners run, once the trainer printed it (a line per runner, with its cwd)."""
    _wait(trainer, out, lambda: len(re.findall(r"ray runner \d+: node", _log(out))) >= 2, "the runners' places")
    places = _places(_log(out))
    assert sorted(places) == [0, 1], _log(out)[-3000:]
    return places


@pytest.mark.timeout(900)
def test_runners_on_two_ray_nodes_run_the_shipped_agent_and_survive_a_kill(cluster: Cluster, tmp_path: Path) -> None:
    """One run (one trainer start, the slow part): placement on both nodes and the shipped agent, then SIGKILL of
    the worker node's runner actor (and its runner) while it runs training attempts, mid-iteration: Ray restarts the
    actor on that node, whose new runner claims work; the store retries the killed attempts' rollouts, each
    succeeds once; nothing is recorded twice."""
    out, db = tmp_path / "run", tmp_path / "run" / "store.db"
    trainer = _train(cluster, out)
    places = _placed(trainer, out)
    # one runner on each node: two Ray node ids, one runner process in each namespace
    assert len({node for node, *_ in places.values()}) == 2, places
    where = {cluster.namespace_of(pid): index for index, (_, pid, _, _) in places.items()}
    assert where.keys() == {cluster.pair.trainer, cluster.pair.workers}, where
    # each runs Ray's shipped copy of the agent's folder (under the Ray session), not the folder itself (which the
    # worker node does not have)
    for _, _, _, cwd in places.values():
        assert Path(cwd).is_relative_to(cluster.ray_tmp) and "working_dir" in cwd, cwd
        assert (Path(cwd) / "calc_agent.py").read_bytes() == (cluster.app / "calc_agent.py").read_bytes()
    first = {pid for _, pid, _, _ in places.values()}

    def both_ran_two_iterations() -> bool:
        ran = {_pid(worker) for _, worker, status in _attempts(db) if status == "succeeded"}
        return ran == first and _iterations(out) >= 2

    _wait(trainer, out, both_ran_two_iterations, "2 iterations, and rollouts run by both runners")
    victim = where[cluster.pair.workers]
    _, victim_pid, victim_actor, _ = places[victim]
    killed = _kill_mid_iteration(trainer, out, victim_pid, victim_actor)
    last = max(int(r.split("-")[0][2:]) for r in killed)  # the iteration the kill hit (rollout ids: itN-...)
    restarted: set[int] = set()

    def restarted_and_retried() -> bool:
        restarted.update(_pid(w) for _, w, _ in _attempts(db) if w and _pid(w) not in first)
        return bool(restarted) and _iterations(out) > last  # the killed rollouts' iteration ended

    _wait(trainer, out, restarted_and_retried, "the restarted runner's first claim, and the killed rollouts retried")
    assert {cluster.namespace_of(pid) for pid in restarted} == {cluster.pair.workers}  # on the same node again
    log = _stop(trainer, out)
    assert dict(RESTARTS.findall(log)).get(str(victim)) == "2", log[-3000:]  # the actor started twice
    ended = {r: s for r, w, s in _attempts(db) if _pid(w) == victim_pid and r in killed}
    assert ended.keys() == killed and "succeeded" not in ended.values(), ended
    _nothing_recorded_twice(db, last + 1)  # the killed rollouts among them


def _kill_mid_iteration(trainer: subprocess.Popen[str], out: Path, pid: int, actor: int) -> set[str]:
    """SIGKILL of a runner actor (and its runner) while it runs training attempts; returns their rollouts."""
    db = out / "store.db"

    def runs_training() -> bool:
        return any(s == "running" and r.startswith("it") and _pid(w) == pid for r, w, s in _attempts(db))

    _wait(trainer, out, runs_training, "a training attempt of the worker node's runner")
    os.kill(pid, signal.SIGSTOP)  # frozen first: what it runs when killed is known
    killed = {r for r, w, s in _attempts(db) if s == "running" and _pid(w) == pid}
    os.kill(actor, signal.SIGKILL)
    os.killpg(pid, signal.SIGKILL)  # the actor's death ends it too (its lifeline), but frozen it would wait
    assert killed
    return killed
