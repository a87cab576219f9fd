"""Every ```python block of every README.md in the repository and of every page of the docs site (``docs/``) runs,
as a reader would paste it.

Each block is written to a file in a fresh directory (with ``examples/`` linked in, for paths such as
``examples/calc/checkpoint``) and run as ``python block.py`` with this interpreter. A block with top-level
``await`` (a fragment, as in a notebook or ``python -m asyncio``) runs in an event loop instead.

A block that is a fragment declares what it needs in an HTML comment right above its fence, which renders as
nothing on the page:

    <!-- readme-test
    from agentlightning.testing import ScriptedModelServer
    server = ScriptedModelServer().start()
    proxy_url = server.base_url
    -->

The comment's code (the *prelude*) runs first, in the same namespace. A ``<!-- readme-test-after ... -->``
comment right below the closing fence runs after the block (an *epilogue*: call what the block defined, check
what it did). ``<!-- readme-test skip: REASON -->`` skips a block that cannot run here (say, it needs a GPU);
the reason is shown in the test report.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

_BLOCK = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.DOTALL | re.MULTILINE)
_MARKER = re.compile(r"<!--\s*readme-test(?!-after)\b(.*?)-->\Z", re.DOTALL)
_AFTER = re.compile(r"\s*<!--\s*readme-test-after\b(.*?)-->", re.DOTALL)

# Runs one block file: compiled with top-level await allowed; a coroutine result is run to completion.
_RUNNER = """
import ast, asyncio, sys
path = sys.argv[1]
sys.path.insert(0, ".")
source = open(path).read()
code = compile(source, path, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
namespace = {"__name__": "__main__", "__file__": path}
result = eval(code, namespace)
if asyncio.iscoroutine(result):
    asyncio.run(result)
"""


@dataclass
class Block:
    readme: Path
    line: int
    code: str
    prelude: str = ""
    epilogue: str = ""
    skip: str | None = None

    @property
    def source(self) -> str:
        return "\n".join(part for part in (self.prelude, self.code, self.epilogue) if part)

    @property
    def id(self) -> str:
        return f"{self.readme.relative_to(ROOT).as_posix()}:{self.line}"


def _readmes() -> list[Path]:
    """The project's READMEs and the docs site's pages: none under a hidden folder (virtualenvs such as ``.venv`` and
    ``.venv-vllm``, ``.git``) or an installed tree (pruned while walking: a virtualenv holds tens of thousands of
    files). A docs page that includes a README (``--8<--``) has no block of its own: the README's run here."""
    skip = {"node_modules", "__pycache__", "site-packages"}
    found: list[Path] = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in skip]
        if "README.md" in files:
            found.append(Path(folder) / "README.md")
    found += (ROOT / "docs").rglob("*.md")
    return sorted(found)


def parse_blocks(readme: Path, text: str | None = None) -> list[Block]:
    """The python blocks of one README with their markers."""
    text = readme.read_text() if text is None else text
    blocks: list[Block] = []
    for match in _BLOCK.finditer(text):
        before = text[: match.start()].rstrip()
        line = text.count("\n", 0, match.start()) + 1
        block = Block(readme, line, match.group(1))
        marker = _MARKER.match(before[before.rfind("<!--") :]) if before.endswith("-->") else None
        if marker is not None:
            body = marker.group(1)
            head = body.strip()
            if head.startswith("skip:"):
                block.skip = head.removeprefix("skip:").strip() or "no reason given"
            else:
                block.prelude = textwrap.dedent(body.strip("\n"))
        after = _AFTER.match(text, match.end())
        if after is not None:
            block.epilogue = textwrap.dedent(after.group(1).strip("\n"))
        blocks.append(block)
    return blocks


ALL_BLOCKS = [block for readme in _readmes() for block in parse_blocks(readme)]


def run_block(block: Block, workdir: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """Run ``block`` (prelude first) in ``workdir`` with this interpreter; returns the finished process."""
    (workdir / "examples").symlink_to(ROOT / "examples", target_is_directory=True)
    script = workdir / "readme_block.py"
    script.write_text(block.source)
    try:
        compile(block.source, script.name, "exec")
        command = [sys.executable, script.name]  # exactly what a reader who pasted it into a file runs
    except SyntaxError:
        command = [sys.executable, "-c", _RUNNER, script.name]  # top-level await
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        command,
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_every_readme_is_found() -> None:
    found = {block.readme.relative_to(ROOT).as_posix() for block in ALL_BLOCKS}
    assert {"README.md", "packages/core/README.md", "packages/adapter-langchain/README.md"} <= found
    assert {"docs/getting-started.md", "docs/frameworks/langchain.md", "docs/frameworks/autogen.md"} <= found


def test_markers_are_read(tmp_path: Path) -> None:
    text = (
        "intro\n\n```python\nprint(1)\n```\n\n<!-- readme-test\nx = 2\n-->\n```python\nprint(x)\n```\n\n"
        "<!-- readme-test skip: needs a GPU -->\n\n```python\nimport torch\n```\n"
        "<!-- readme-test-after\nassert torch\n-->\n"
    )
    first, second, third = parse_blocks(tmp_path / "README.md", text)
    assert (first.prelude, first.skip, first.code, first.epilogue) == ("", None, "print(1)\n", "")
    assert (second.prelude, second.skip, second.epilogue) == ("x = 2", None, "")
    assert second.source == "x = 2\nprint(x)\n"
    assert (third.skip, third.epilogue) == ("needs a GPU", "assert torch")


def test_a_failing_block_fails(tmp_path: Path) -> None:
    """The runner reports a block's error (and runs top-level await): the check is not vacuous."""
    ok = run_block(Block(tmp_path / "README.md", 1, "import asyncio\nawait asyncio.sleep(0)\nprint('ran')\n"), tmp_path)
    assert ok.returncode == 0 and ok.stdout.strip() == "ran", ok.stderr
    (tmp_path / "b").mkdir()
    bad = run_block(Block(tmp_path / "README.md", 1, "print(undefined_name)\n"), tmp_path / "b")
    assert bad.returncode != 0 and "NameError" in bad.stderr


@pytest.mark.slow
@pytest.mark.parametrize("block", ALL_BLOCKS, ids=[block.id for block in ALL_BLOCKS])
def test_readme_block_runs(block: Block, tmp_path: Path) -> None:
    if block.skip is not None:
        pytest.skip(f"{block.id}: {block.skip}")
    done = run_block(block, tmp_path)
    assert done.returncode == 0, (
        f"the python block at {block.id} failed (exit {done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    )
