"""The docs site builds in strict mode, and the checks that keep it honest do fail when they should.

``mkdocs build --strict`` (what ``python3 scripts/dev.py docs`` runs) turns every warning into an error: a link to a
page or an anchor that does not exist, a page left out of the navigation, a nav entry without its page, an API
name (``::: module.Name``) that no longer exists. The API reference lists each package's ``__all__``, read from the
sources by mkdocstrings. The code blocks of ``docs/`` run in ``tests/test_readme_blocks.py``.

Also checked here, without a build: every benchmark figure on the performance page names the command that produces
it, and every benchmark script is on that page.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PERFORMANCE = DOCS / "performance.md"

# A command that produces a figure: a benchmark script, an example's training script, or a dev.py job.
_COMMAND = re.compile(r"benchmarks/\w+\.py|examples/\w+/train\.py|scripts/dev\.py \w+")
# A measured figure: a number with a unit, a rate or a ratio (plain counts such as "16 runners" are not figures).
_FIGURE = re.compile(
    r"\d[\d,.]*\s?(?:µs|ms|s\b|KB|MB|B\b|×|x\b|%|k? ?(?:spans|rollouts|rows|dequeues|tokens)/s|CPU-s)", re.UNICODE
)


def _mkdocs() -> list[str]:
    """The mkdocs of this interpreter (the dev group installs it), or a skip that says why outside CI."""
    try:
        import mkdocs  # noqa: F401  # pyright: ignore[reportUnusedImport]
        import mkdocstrings  # noqa: F401  # pyright: ignore[reportUnusedImport]
    except ImportError:
        message = "mkdocs is not installed (python3 scripts/dev.py test installs the dev group, which has it)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return [sys.executable, "-m", "mkdocs"]


def _build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    command = [*_mkdocs(), "build", "--strict", "--config-file", str(config), "--site-dir", str(site)]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_the_site_builds_in_strict_mode(tmp_path: Path) -> None:
    """``python3 scripts/dev.py docs`` (here with this interpreter's environment as its venv) builds the whole site."""
    _mkdocs()
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "AGL_VENV": sys.prefix}
    command = [sys.executable, str(ROOT / "scripts" / "dev.py"), "docs", "--site-dir", str(tmp_path / "site")]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout[-4000:]}\n{done.stderr[-8000:]}"
    api = (tmp_path / "site" / "api" / "core" / "index.html").read_text()
    assert 'id="agentlightning.Runner"' in api and 'id="agentlightning.SqliteStore"' in api  # generated, from __all__
    assert (tmp_path / "site" / "frameworks" / "langchain" / "index.html").exists()
    widths = _signature_widths(tmp_path / "site" / "api" / "core" / "index.html")
    assert widths and max(widths) <= 100, f"signatures not wrapped: widest line {max(widths)} characters"


def test_the_docs_tools_wrap_signatures() -> None:
    """``dev.py docs`` installs a formatter with mkdocs: mkdocstrings wraps signatures only when it finds one."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import dev  # pyright: ignore[reportMissingImports]
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    tools = [req.split(">")[0].split("=")[0].split("[")[0].strip().lower() for req in dev.docs_tools()]  # pyright: ignore
    assert "ruff" in tools and any(tool.startswith("mkdocstrings") for tool in tools), tools


def _signature_widths(page: Path) -> list[int]:
    """The widest line of each signature block of a built API page."""
    import html

    signature = r'class="doc-signature highlight"><pre><span></span><code>(.*?)</code></pre>'
    blocks = re.findall(signature, page.read_text(), re.S)
    return [max(len(line) for line in html.unescape(re.sub(r"<[^>]+>", "", block)).splitlines()) for block in blocks]


def _small_site(tmp_path: Path, pages: dict[str, str], nav: list[str]) -> Path:
    """A site with this project's mkdocs settings (validation, plugins) but only ``pages``: a fast strict build."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    handler = config["plugins"][1]["mkdocstrings"]["handlers"]["python"]
    handler["paths"] = [str(ROOT / path) for path in handler["paths"]]
    for extension in config["markdown_extensions"]:
        if isinstance(extension, dict) and "pymdownx.snippets" in extension:
            extension["pymdownx.snippets"]["base_path"] = [str(ROOT)]
    docs = tmp_path / "docs"
    docs.mkdir()
    for name, text in pages.items():
        (docs / name).write_text(text)
    config.update(docs_dir=str(docs), site_dir=str(tmp_path / "site"), nav=nav)
    path = tmp_path / "mkdocs.yml"
    path.write_text(yaml.safe_dump(config, allow_unicode=True))
    return path


_HOME = "# Home\n"
_CASES = [
    pytest.param(
        {"index.md": _HOME + "[API](api.md)\n", "api.md": "::: agentlightning.Runner\n"},
        ["index.md", "api.md"],
        "",
        id="nothing wrong",
    ),
    pytest.param({"index.md": _HOME + "[gone](missing.md)\n"}, ["index.md"], "missing.md", id="a broken link"),
    pytest.param(
        {"index.md": _HOME + "[x](other.md#nowhere)\n", "other.md": "# Other\n"},
        ["index.md", "other.md"],
        "nowhere",
        id="a broken anchor",
    ),
    pytest.param({"index.md": _HOME, "stray.md": "# Stray\n"}, ["index.md"], "stray.md", id="a page not in the nav"),
    pytest.param({"index.md": _HOME}, ["index.md", "gone.md"], "gone.md", id="a nav entry without its page"),
    pytest.param(
        {"index.md": "::: agentlightning.NoSuchName\n"},
        ["index.md"],
        "NoSuchName",
        id="an API name that no longer exists",
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize(("pages", "nav", "complaint"), _CASES)
def test_a_strict_build_fails_on(pages: dict[str, str], nav: list[str], complaint: str, tmp_path: Path) -> None:
    """The settings the site is built with turn each kind of mistake into a failed build (and a fine site passes)."""
    done = _build(_small_site(tmp_path, pages, nav), tmp_path / "site")
    output = done.stdout + done.stderr
    if not complaint:
        assert done.returncode == 0, output[-4000:]
    else:
        assert done.returncode != 0 and complaint in output, output[-4000:]


def test_every_package_has_an_api_page() -> None:
    """Each published package's import name is rendered from its sources on a page of the API reference."""
    pages = [page.read_text() for page in (DOCS / "api").glob("*.md")]
    rendered = {match.group(1) for text in pages for match in re.finditer(r"^::: ([\w.]+)", text, re.M)}
    packages = {init.parent.name for init in ROOT.glob("packages/*/src/*/__init__.py") if "_template" not in init.parts}
    assert packages and packages <= rendered, sorted(packages - rendered)
    nav = (ROOT / "mkdocs.yml").read_text()
    assert all(f"api/{page.name}" in nav for page in (DOCS / "api").glob("*.md"))


def _sections(text: str) -> list[tuple[str, str]]:
    """``(heading, body)`` for every ``##`` / ``###`` section of a markdown page (the part before the first too)."""
    parts = re.split(r"^(#{1,3} .*)$", text, flags=re.M)
    sections = [("(top)", parts[0])]
    sections += [(parts[i].strip(), parts[i + 1]) for i in range(1, len(parts) - 1, 2)]
    return sections


def unsourced_figures(text: str, root: Path = ROOT) -> list[str]:
    """What is wrong with a performance page: sections whose figures name no command, and commands that do not
    exist. A section's figures are sourced when the section names a command (`_COMMAND`)."""
    problems: list[str] = []
    for heading, body in _sections(text):
        figures = [m.group(0) for m in _FIGURE.finditer(body)]
        commands = _COMMAND.findall(body)
        if figures and not commands:
            problems.append(f"{heading}: figures ({', '.join(figures[:3])}) without the command that produces them")
        problems += [
            f"{heading}: {command} does not exist"
            for command in commands
            if "/" in command and " " not in command and not (root / command).exists()
        ]
    return problems


def test_every_benchmark_figure_names_its_command() -> None:
    assert unsourced_figures(PERFORMANCE.read_text()) == []


def test_every_benchmark_is_on_the_performance_page() -> None:
    text = PERFORMANCE.read_text()
    scripts = sorted((ROOT / "benchmarks").glob("*.py"))
    missing = [path.name for path in scripts if f"benchmarks/{path.name}" not in text]
    assert missing == []


def test_the_figure_check_is_not_vacuous() -> None:
    page = (
        "# Performance\n\n## Sourced\n\n`benchmarks/store_bench.py`: 1,200 rollouts/s.\n\n"
        "## Unsourced\n\n| per | before | after |\n|---|---|---|\n| span | 975 B | 273 B |\n\n"
        "## Gone\n\n`benchmarks/no_such_bench.py`: 3.5 ms.\n"
    )
    problems = unsourced_figures(page)
    assert len(problems) == 2, problems
    assert problems[0].startswith("## Unsourced: figures (975 B") and "no_such_bench.py does not exist" in problems[1]
