"""verl on two Ray nodes, for real: a Ray head in one network namespace, a Ray worker node in another (a veth pair).

The commands are the trainer-verl README's multi-node recipe (its ``ray start`` lines and the rehearsal run, with
this test's addresses): the head and the worker node each get one actor rank (FSDP over gloo across the veth link)
and one vLLM replica (vLLM's CPU build) on their own node; the trainer, in the head's namespace, runs 2 GRPO steps
and checks, after every sync, that each replica received the actor's exact tensors and computes its log-probs.

Needs root and iproute2 (``ip netns``) and the verl + vLLM environment (``python3 scripts/dev.py verl-vllm``), and
``AGL_TEST_TWO_NODES=1`` (it takes ~10 minutes); skipped otherwise with the reason.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentlightning.testing import NetnsPair, netns_pair

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "packages" / "trainer-verl" / "README.md"
HEAD_IP, WORKER_IP = "10.0.0.5", "10.0.0.6"  # the README recipe's addresses


def recipe() -> tuple[list[list[str]], list[str]]:
    """The README's multi-node recipe: its ``ray start`` commands (head first) and the trainer command."""
    section = README.read_text(encoding="utf-8").split("## Multi-node rehearsal", 1)[1].split("\n## ", 1)[0]
    lines = [line for block in re.findall(r"```bash\n(.*?)```", section, re.S) for line in block.splitlines()]
    starts = [shlex.split(line) for line in lines if line.startswith("ray start")]
    trainer = next(shlex.split(line) for line in lines if "verl_vllm_loop.py" in line)
    return starts, trainer


TWO_NODES_ENV = "AGL_TEST_TWO_NODES"
"""Set to 1 to run the two-node rehearsal (~10 minutes on a busy 2-core box: two vLLM engines and two FSDP ranks
start), which CI's time budget leaves out by default; the recipe check below always runs."""


def _why_not() -> str | None:
    if os.environ.get(TWO_NODES_ENV) != "1":
        return f"the two-node rehearsal takes ~10 minutes: {TWO_NODES_ENV}=1 runs it"
    if shutil.which("ip") is None:
        return "needs iproute2 (ip netns)"
    if os.geteuid() != 0:
        return "building network namespaces needs root; CI runs as root"
    venv = Path(os.environ.get("AGL_VERL_VLLM_VENV") or ROOT / ".venv-verl-vllm")
    if not (venv / "bin" / "ray").exists():
        return f"no verl + vLLM CPU environment at {venv}: python3 scripts/dev.py verl-vllm"
    return None


def test_the_recipe_is_what_the_test_runs() -> None:
    starts, trainer = recipe()
    assert starts[0][:3] == ["ray", "start", "--head"] and f"--node-ip-address={HEAD_IP}" in starts[0]
    assert f"--address={HEAD_IP}:6379" in starts[1] and f"--node-ip-address={WORKER_IP}" in starts[1]
    assert trainer[trainer.index("--nnodes") + 1] == "2" and f"{HEAD_IP}:6379" in trainer


@pytest.fixture
def namespaces() -> Iterator[NetnsPair]:
    """The head's namespace (``trainer``) and the worker node's (``workers``); their Ray nodes stop with them."""
    with netns_pair(subnet_byte=214) as pair:
        yield pair


@pytest.mark.slow
@pytest.mark.timeout(2400)
@pytest.mark.skipif(_why_not() is not None, reason=_why_not() or "")
def test_two_grpo_steps_with_one_actor_rank_and_one_vllm_replica_per_node(
    namespaces: NetnsPair, tmp_path: Path
) -> None:
    venv = Path(os.environ.get("AGL_VERL_VLLM_VENV") or ROOT / ".venv-verl-vllm")
    ray_tmp = tempfile.mkdtemp(prefix="aglray", dir="/tmp")  # short: Ray's socket paths
    try:
        _rehearse(namespaces, venv, Path(ray_tmp), tmp_path)
    finally:
        namespaces.stop()  # the Ray nodes first: they write into ray_tmp
        shutil.rmtree(ray_tmp, ignore_errors=True)


def _rehearse(namespaces: NetnsPair, venv: Path, ray_tmp: Path, tmp_path: Path) -> None:
    starts, trainer = recipe()
    roles = {
        "head": (namespaces.trainer, namespaces.trainer_dev),
        "worker": (namespaces.workers, namespaces.worker_dev),
    }
    base_env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "RAY_USAGE_STATS_ENABLED": "0",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        # the namespaces share one home: no cluster token to hand from the head to the worker node
        "RAY_AUTH_MODE": "disabled",
        "PYTHONPATH": os.pathsep.join(str(p) for p in sorted((ROOT / "packages").glob("*/src"))),
    }
    base_env.pop("VIRTUAL_ENV", None)

    def here(cmd: list[str], role: str) -> tuple[list[str], dict[str, str]]:
        text = [a.replace(HEAD_IP, namespaces.trainer_ip).replace(WORKER_IP, namespaces.worker_ip) for a in cmd]
        if text[0] == "ray":
            # its own temp dir: `ray start` records its cluster there, where a plain ray.init() elsewhere on this
            # machine would otherwise find it and try to join
            text = [str(venv / "bin" / "ray"), *text[1:], "--disable-usage-stats", f"--temp-dir={ray_tmp}"]
        elif text[0] in ("python", "python3"):
            text = [str(venv / "bin" / "python"), *text[1:]]
        # gloo (FSDP's collectives across the nodes) must use the veth link, not what the hostname resolves to
        env = {**base_env, "GLOO_SOCKET_IFNAME": roles[role][1]}
        return text, env

    for cmd, role in ((starts[0], "head"), (starts[1], "worker")):
        argv, env = here(cmd, role)
        namespaces.start_ray_node(roles[role][0], argv, env, tmp_path / f"ray-{role}.log")
    argv, env = here([*trainer, "--workdir", str(tmp_path)], "head")
    argv = ["ip", "netns", "exec", namespaces.trainer, *argv]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=2000, cwd=ROOT)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"rc={proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-8000:]}"
    result: dict[str, Any] = json.loads(lines[-1][len("RESULT ") :])
    assert len(result["nodes"]) == 2  # one actor rank on each node
    grpo = result["grpo"]
    assert grpo["steps"] == 2 and grpo["call_versions"] == {"it0": [0], "it1": [1]}
    for sync in grpo["syncs"]:
        # each node's vLLM replica received the actor's exact tensors, and computes the actor's log-probs
        assert sync["received"] == [sync["actor"], sync["actor"]], sync
        assert sync["probe_logprob_diff_max"] < 1e-4, sync
