"""Root pytest configuration: tests marked ``gpu`` run only where CUDA is available; the suite's worker groups.

``python3 scripts/dev.py test`` runs the suite on two worker processes (pytest-xdist, ``--dist loadgroup``). What
one worker runs at a time, never beside itself on the other (`worker_group`):

* ``ray``: tests that start a Ray cluster or network namespaces (``ray.init()`` joins a local cluster it finds, and
  the namespace tests use fixed names, subnets and ports);
* ``vllm``: the modules that use the session's real vLLM server (one server per session, not one per worker; a
  module in it joins no other group);
* ``node``: the modules that ``npm ci`` in ``examples/node`` (it replaces ``node_modules`` while the other reads it);
* every other module is one group of its own (its module-scoped fixtures are built once).

Under xdist the three shared groups are scheduled first (they are the longest); a plain ``pytest`` run keeps the
collection order.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent


def _hypothesis_profile() -> None:
    """Property tests draw the same examples on every run (``derandomize``): a test command that fails by the luck
    of a draw is a flaky test. ``AGL_HYPOTHESIS=explore`` draws new examples (while developing a property)."""
    try:
        from hypothesis import settings
    except ImportError:  # a package's own tests in an environment without hypothesis
        return
    settings.register_profile("fixed", derandomize=True)
    settings.register_profile("explore", derandomize=False)
    settings.load_profile("explore" if os.environ.get("AGL_HYPOTHESIS") == "explore" else "fixed")


_hypothesis_profile()


def _cuda_available() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _longest_groups_first(config, items)
    # the marker itself: ``item.keywords`` also holds the names of the test's folders and module ("gpu/...")
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items or _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (marked gpu)")
    for item in gpu_items:
        item.add_marker(skip)


SHARED_GROUPS: dict[str, re.Pattern[str]] = {
    "vllm": re.compile(r"\b(lora_)?vllm_server\b"),  # a parameter naming the session's server (fixtures above)
    "ray": re.compile(r'ray\.init\(|"--runners", "ray"|netns_pair|with_name\("verl_(ray|vllm)_loop\.py"\)'),
    "node": re.compile(r'"npm", "ci"'),
}
"""The shared groups, found by what a test module's source says (a new module that starts Ray joins ``ray`` by
itself); the first that matches wins."""


@functools.cache
def worker_group(module: str) -> str:
    """The group of the test module at ``module`` (a path relative to the repository, as in a test id)."""
    source = (ROOT / module).read_text(encoding="utf-8", errors="replace")
    return next((group for group, sign in SHARED_GROUPS.items() if sign.search(source)), module)


def _group_rank(nodeid: str) -> int:
    group = worker_group(nodeid.split("::", 1)[0])
    return list(SHARED_GROUPS).index(group) if group in SHARED_GROUPS else len(SHARED_GROUPS)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup``: xdist's scope scheduling with `worker_group` as the scope. (pytest-xdist's own
    ``xdist_group`` marks name the group by rewriting test ids, which pytest 9 no longer reads.)"""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class WorkerGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return worker_group(nodeid.split("::", 1)[0])

    return WorkerGroups(config, log)


def _longest_groups_first(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker under ``--dist loadgroup``: the shared groups first (they are the longest), so that the
    scheduler, which hands out groups in collection order, starts them first. A plain run keeps its order."""
    if getattr(config.option, "loadgroup", False):  # set on xdist's workers
        items.sort(key=lambda item: _group_rank(item.nodeid))


# The core's pytest plugin comes in through its ``pytest11`` entry point; an editable install made before that
# entry point existed lacks it (reinstall with `.venv/bin/python -m pip install --no-deps -e packages/core`).
if not any(
    ep.value == "agentlightning.testing.pytest_plugin" for ep in importlib.metadata.entry_points(group="pytest11")
):
    pytest_plugins = ["agentlightning.testing.pytest_plugin"]


_EXAMPLES = ROOT / "examples"


def _load_example_script(example: str, name: str) -> ModuleType:
    """``examples/<example>/<name>.py`` imported as ``<example>_<name>`` (entry scripts like ``train.py`` share names).

    The example's folder goes first on ``sys.path`` (its script imports its sibling modules, which every example
    names uniquely: ``calc_agent``, ``math_task``, ``sql_data`` ...); the fixture below puts ``sys.path`` back.
    """
    unique = f"{example}_{name}"
    if unique in sys.modules:
        return sys.modules[unique]
    folder = str(_EXAMPLES / example)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(unique, _EXAMPLES / example / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[unique] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def example_script() -> Callable[[str, str], ModuleType]:
    """``example_script("calc", "train")``: an example's entry script, under a name no other example uses."""
    return _load_example_script


@pytest.fixture(autouse=True)
def _restore_sys_path() -> Iterator[None]:
    """A folder a test (or `agl train`'s --app-dir, run in-process) put first on ``sys.path`` goes again after it."""
    path = list(sys.path)
    yield
    sys.path[:] = path


# ----- a real vLLM, shared by every test of the session that asks for it (starting one costs ~1-2 minutes) -----


@pytest.fixture(scope="session")
def tool_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The warm-started tool-calling test model (`make_tool_chat_model`), tool-call markers as special tokens."""
    from agentlightning_torch.testing import make_tool_chat_model

    return make_tool_chat_model(tmp_path_factory.mktemp("tool-model"), special_tool_tokens=True)


@pytest.fixture(scope="session")
def vllm_server(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A real vLLM (`VLLMServer`) serving ``tool_model_dir`` as model ``tiny``: hermes tool calls, and multi-LoRA
    (adapters loaded at run time; ``/metrics`` on, as the trainer waits on its running count), and vLLM's development
    endpoints (``POST /abort_requests``: the servings' ``abort``), as a LoRA serving launches it.

    One server for the whole session (each start costs ~1-2 minutes on CPU): the tool-calling tests and the tests that
    load LoRA adapters (`lora_vllm_server`) share it; a request naming no adapter is served by the base model, as on a
    server without LoRA. Without vLLM the test fails (never skips) with the one line that installs it. Do not change
    its base weights, and load adapters under names no other test uses: other tests share it (start your own
    `VLLMServer` for anything else).
    """
    from agentlightning_torch.testing import VLLM_TOOL_ARGS, VLLMNotInstalledError, VLLMServer, find_vllm_python
    from agentlightning_torch.vllm import VLLM_LORA_ENV, vllm_lora_args

    try:
        python = find_vllm_python()
    except VLLMNotInstalledError as error:
        pytest.fail(str(error), pytrace=False)
    tool_model_dir: Path = request.getfixturevalue("tool_model_dir")  # built only once vLLM is known to be there
    server = VLLMServer(
        tool_model_dir, served_model_name="tiny", args=[*VLLM_TOOL_ARGS, *vllm_lora_args(4, 16)],
        max_model_len=1024, enforce_eager=True, env={**VLLM_LORA_ENV, "VLLM_SERVER_DEV_MODE": "1"}, python=python,
        metrics=True,
    )  # fmt: skip
    with server:
        yield server


@pytest.fixture(scope="session")
def lora_vllm_server(vllm_server: Any) -> Any:
    """The session's `vllm_server`, for a test that loads LoRA adapters into vLLM (under adapter names of its own)."""
    return vllm_server
