"""The "Train your own agent" page runs as a reader follows it: its agent file, its tasks files, its `agl train`
commands, in that order, in a fresh folder; and what the page says about the run is what the run does.

The page's first python block is ``my_agent.py`` (its first line says so); every ``bash`` block runs, in page
order, with ``bash -e`` and this interpreter's ``agl`` first on ``PATH``, from a folder where ``examples/`` is the
repository's (the page's commands are run from the clone's root). Toy sizes: the whole page takes about a minute.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("agentlightning_torch")

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "train-your-own-agent.md"

_FENCE = re.compile(r"^```(\w+)[ \t]*\n(.*?)^```[ \t]*$", re.DOTALL | re.MULTILINE)


def page_blocks(text: str) -> list[tuple[str, str]]:
    """``(language, code)`` of every fenced block of the page, in order."""
    return [(match.group(1), match.group(2)) for match in _FENCE.finditer(text)]


def agent_file(blocks: list[tuple[str, str]]) -> tuple[str, str]:
    """The file name the page's agent block names on its first line (``# my_agent.py: ...``), and its code."""
    code = next(code for language, code in blocks if language == "python")
    named = re.match(r"# (\w+\.py)\b", code)
    assert named is not None, "the page's first python block must start with '# <file>.py'"
    return named.group(1), code


def test_the_page_is_in_the_nav_and_linked_first() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    assert nav.index("train-your-own-agent.md") < nav.index("concepts.md")
    pages = {ROOT / "README.md": "docs/train-your-own-agent.md", ROOT / "docs" / "index.md": "train-your-own-agent.md"}
    for page, link in pages.items():
        first = re.search(r"\]\(([^)#]+\.md)[^)]*\)", page.read_text())  # the first link to a page
        assert first is not None and first.group(1) == link, f"{page.name}: first link is {first and first.group(1)}"


def test_the_page_states_the_task_file_format_its_reader_uses() -> None:
    """The format the page gives is the reader's own docstring (``read_task_file``): one JSON object per line."""
    from agentlightning.cli import read_task_file

    summary = (read_task_file.__doc__ or "").splitlines()[0]
    assert "one JSON object per line" in summary
    text = PAGE.read_text()
    assert "one JSON object per line" in text and "blank lines are skipped" in text


@pytest.mark.slow
@pytest.mark.timeout(900)  # two toy runs: under a minute alone, a few on a loaded 2-core machine
def test_the_page_runs_as_written(tmp_path: Path) -> None:
    text = PAGE.read_text()
    blocks = page_blocks(text)
    name, code = agent_file(blocks)
    (tmp_path / name).write_text(code)
    (tmp_path / "examples").symlink_to(ROOT / "examples", target_is_directory=True)
    script = "\n".join(code for language, code in blocks if language == "bash")
    assert "agl train" in script
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run(
        ["bash", "-e", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=840
    )
    assert done.returncode == 0, f"the page's commands failed:\n{done.stdout[-2000:]}\n{done.stderr[-6000:]}"

    # What the page says the run prints and writes.
    first_run = Path(re.findall(r"--output (\S+)", script)[0])
    assert f"store: {first_run}/store.db   dashboard: http://127.0.0.1:" in done.stderr
    assert "held-out reward_mean before RL:" in done.stderr
    summaries = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [summary["iterations"] for summary in summaries] == [3, 1]
    assert summaries[0]["best_checkpoint"] == f"{first_run}/checkpoint/best"
    outputs = re.findall(r"^\| `([\w/.]+)` \|", text[text.index("**Where the output goes.**") :], re.MULTILINE)
    assert {"checkpoint/", "checkpoint/best/", "metrics.jsonl", "reward_curve.png", "store.db"} <= set(outputs)
    for output in outputs:
        assert (tmp_path / first_run / output).exists(), f"the page lists {output}, the run did not write it"
    kinds = {json.loads(line)["kind"] for line in (tmp_path / first_run / "metrics.jsonl").read_text().splitlines()}
    assert kinds == {"train", "eval"}
    # the continued run started from the first run's weights
    second = summaries[1]
    assert second["checkpoint"] != summaries[0]["checkpoint"]
    assert (tmp_path / second["checkpoint"] / "config.json").is_file()
