"""Every headline figure the README and the docs state is the one in ``benchmarks/headlines.json``.

One claim, one figure: the examples' table (README, examples page, performance page) row for row, the quickstart's
learning figures wherever a paragraph speaks of the quickstart, and the framework's overhead on the performance
page. A new measurement changes the JSON file and the pages together, or this test fails.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "benchmarks" / "headlines.json"
PAGES = ["README.md", "docs/index.md", "docs/getting-started.md", "docs/examples.md", "docs/performance.md"]
TABLES = ["README.md", "docs/examples.md", "docs/performance.md"]

_ARROW = re.compile(r"\d\.\d\d → \d\.\d\d")


def _source() -> dict[str, Any]:
    return json.loads(SOURCE.read_text(encoding="utf-8"))


def example_rows(text: str) -> list[list[str]]:
    """The cells of every table row about an example (its first cell names ``examples/...``)."""
    rows = [line for line in text.splitlines() if line.startswith("| `examples/")]
    return [[cell.strip() for cell in row.strip().strip("|").split("|")] for row in rows]


def problems(text: str, source: dict[str, Any], *, table: bool) -> list[str]:
    """What on one page disagrees with the source (empty: nothing)."""
    found: list[str] = []
    if table:
        expected = [
            [e["example"], e["framework"], e["trained"], e["command"], e["budget"], e["figure"]]
            for e in source["examples"]
        ]
        rows = example_rows(text)
        if rows != expected:
            found.append(f"the examples table differs from the source: {rows} != {expected}")
    quickstart = source["quickstart"]
    allowed = {quickstart["figure"], quickstart["sampled_reward"], quickstart["tool_call_rate"]}
    for paragraph in re.split(r"\n\s*\n", text):
        if "quickstart" not in paragraph.lower() or paragraph.lstrip().startswith("|"):
            continue
        found += [f"a quickstart figure {figure!r} is not the source's" for figure in _ARROW.findall(paragraph)
                  if figure not in allowed]  # fmt: skip
    return found


def test_the_pages_state_the_sources_figures() -> None:
    source = _source()
    found = {page: problems((ROOT / page).read_text(), source, table=page in TABLES) for page in PAGES}
    assert {page: issues for page, issues in found.items() if issues} == {}


def test_the_performance_page_states_the_overhead_of_the_source() -> None:
    overhead = _source()["overhead"]
    text = (ROOT / "docs" / "performance.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| plain OpenAI"))
    assert f"| {overhead['plain_openai_wall']} | {overhead['plain_openai_cpu']} |" in row, row
    row = next(line for line in text.splitlines() if line.startswith("| LangGraph"))
    assert f"| {overhead['langgraph_wall']} |" in row, row


def test_a_page_that_disagrees_is_caught() -> None:
    source = _source()
    good = (ROOT / "docs" / "examples.md").read_text()
    assert problems(good, source, table=True) == []
    stale_row = good.replace("0.00 → 0.89", "0.00 → 0.97", 1)
    assert problems(stale_row, source, table=True) != []
    stale_prose = "The quickstart, measured today:\nheld-out greedy accuracy 0.00 → 0.91.\n"
    assert problems(stale_prose, source, table=False) == ["a quickstart figure '0.00 → 0.91' is not the source's"]
