"""`netns_pair`: two "machines" on one Linux host, two network namespaces joined by a veth pair, for tests.

Each namespace has its own loopback and one address on the link (``10.213.X.1`` and ``.2``); a process started in
one (`NetnsPair.popen`, `NetnsPair.start_ray_node`) reaches the other only over the link. Namespaces separate the
network, not processes or files: a Ray node started here has its own ``--temp-dir`` so that no ``ray.init()``
elsewhere on the host finds it, and is stopped by its own process group, never by ``ray stop`` (which would stop
every Ray cluster of the host). `NetnsPair.start_ray_node` can hide a folder from a node (an empty tmpfs over it,
in the node's own mount namespace): a node that "does not have" the folder.

Needs root and iproute2 (`why_no_netns` says why not, for a skip reason).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["NetnsPair", "netns_pair", "why_no_netns"]

_counter = itertools.count()


def why_no_netns() -> str | None:
    """Why network namespaces cannot be built here (a skip reason), or ``None`` when they can."""
    if sys.platform != "linux":
        return "network namespaces are a Linux feature"
    if os.geteuid() != 0:
        return "building network namespaces (ip netns add) needs root; CI runs as root"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed (apt-get install iproute2; scripts/dev.py test does it in CI)"
    probe = f"aglprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` failed here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


@dataclass
class NetnsPair:
    """Two namespaces joined by a veth pair: ``trainer`` (``trainer_ip``) and ``workers`` (``worker_ip``).

    Attributes:
        trainer: The first namespace's name (the trainer's machine; a Ray head's too).
        workers: The second namespace's name (the runners' machine; a Ray worker node's).
        trainer_ip: The first namespace's address on the link.
        worker_ip: The second namespace's address on the link.
        trainer_dev: The first namespace's end of the link (an interface name).
        worker_dev: The second namespace's end.
        procs: Processes started in the namespaces, ended (SIGKILL) when the pair is torn down.
        nodes: Ray nodes started in the namespaces, stopped (``ray start`` gets SIGTERM, then its group SIGKILL).
    """

    trainer: str
    workers: str
    trainer_ip: str
    worker_ip: str
    trainer_dev: str = ""
    worker_dev: str = ""
    procs: list[subprocess.Popen[str]] = field(default_factory=lambda: [])
    nodes: list[subprocess.Popen[str]] = field(default_factory=lambda: [])

    def popen(
        self, ns: str, cmd: Sequence[str], env: Mapping[str, str], log: Path, cwd: Path | None = None
    ) -> subprocess.Popen[str]:
        """``cmd`` in namespace ``ns`` (this process's environment plus ``env``), its output appended to ``log``."""
        with log.open("a") as out:
            proc = subprocess.Popen(
                ["ip", "netns", "exec", ns, *cmd], env={**os.environ, **env}, stdout=out, stderr=out, text=True, cwd=cwd
            )
        self.procs.append(proc)
        return proc

    def start_ray_node(
        self, ns: str, argv: Sequence[str], env: Mapping[str, str], log: Path, hide: Path | None = None
    ) -> subprocess.Popen[str]:
        """``ray start ... --block`` in ``ns`` and its own session; returns once it says the node runs.

        Args:
            ns: The namespace.
            argv: The ``ray start`` command (``--block`` is added).
            env: The node's whole environment.
            log: Its output, written as it comes.
            hide: A folder this node does not see (an empty tmpfs over it, in the node's own mount namespace).

        Raises:
            AssertionError: ``ray start`` ended before the node ran (with its log).
        """
        cmd = ["ip", "netns", "exec", ns]
        if hide is not None:  # private mounts: the tmpfs is seen by this node's processes only
            mount = 'mount -t tmpfs -o size=1m agl-hidden "$0" && exec "$@"'
            cmd += ["unshare", "--mount", "--propagation", "private", "sh", "-c", mount, str(hide)]
        node = subprocess.Popen(
            [*cmd, *argv, "--block"], env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,
        )  # fmt: skip
        self.nodes.append(node)
        assert node.stdout is not None
        with log.open("w") as out:
            for line in node.stdout:
                out.write(line)
                if "Ray runtime started" in line:
                    break
            else:
                out.close()
                raise AssertionError(f"ray start ended (rc={node.wait()}): {log.read_text()[-3000:]}")
        threading.Thread(target=_drain, args=(node, log), daemon=True).start()
        return node

    def stop(self) -> None:
        """End the processes and stop the Ray nodes started here (each Ray node by its own process group)."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        # worker nodes before the head, each by its `ray start` alone: it drains the node through the head's GCS,
        # which a signal to its whole process group would have ended first (a 30 s wait for it, in vain)
        for node in reversed(self.nodes):
            with contextlib.suppress(ProcessLookupError):
                node.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.wait(timeout=60)
            with contextlib.suppress(ProcessLookupError):  # whatever of the node is left
                os.killpg(node.pid, signal.SIGKILL)
            node.wait()


def _drain(node: subprocess.Popen[str], log: Path) -> None:
    assert node.stdout is not None
    with log.open("a") as out:
        for line in node.stdout:
            out.write(line)
            out.flush()


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@contextlib.contextmanager
def netns_pair(subnet_byte: int = 213) -> Generator[NetnsPair]:
    """Two new namespaces joined by a veth pair (on ``10.<subnet_byte>.X.0/24``); torn down on the way out.

    Names and subnet are made from this process's id and a counter, so concurrent test processes do not collide.
    On the way out the processes and Ray nodes started through the pair end (`NetnsPair.stop`), then the
    namespaces go (and the link with them).
    """
    n = next(_counter)
    tag = f"{os.getpid() % 100000}x{n}"
    subnet = f"10.{subnet_byte}.{(os.getpid() + n) % 250 + 1}"
    pair = NetnsPair(f"agl{tag}t", f"agl{tag}w", f"{subnet}.1", f"{subnet}.2", f"v{tag}t", f"v{tag}w")
    made: list[str] = []
    try:
        for ns in (pair.trainer, pair.workers):
            _ip("netns", "add", ns)
            made.append(ns)
        _ip(
            "link", "add", pair.trainer_dev, "netns", pair.trainer, "type", "veth", "peer", "name", pair.worker_dev,
            "netns", pair.workers,
        )  # fmt: skip
        ends = ((pair.trainer, pair.trainer_dev, pair.trainer_ip), (pair.workers, pair.worker_dev, pair.worker_ip))
        for ns, dev, ip in ends:
            _ip("-n", ns, "addr", "add", f"{ip}/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        yield pair
    finally:
        pair.stop()
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
