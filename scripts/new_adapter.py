"""Create packages/adapter-<name>/ from packages/_template (see packages/_template/README.md).

python scripts/new_adapter.py myframework --dist myframework-core --range ">=1.2,<2" --title "My Framework"
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = ROOT / "packages" / "_template"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Create a new framework adapter package from the template.")
    parser.add_argument("name", help="short adapter name, lowercase letters/digits/underscores (e.g. crewai)")
    parser.add_argument("--dist", required=True, help="the framework's distribution name on PyPI")
    parser.add_argument("--range", default=">=1.0,<2", help="supported framework versions (specifier)")
    parser.add_argument("--title", default=None, help="human-readable framework name")
    parser.add_argument("--out", type=Path, default=ROOT / "packages", help="folder to create the package in")
    args = parser.parse_args(argv)
    if not re.fullmatch(r"[a-z][a-z0-9_]*", args.name):
        parser.error(f"name {args.name!r} must be lowercase letters, digits and underscores, starting with a letter")
    target = args.out.resolve() / f"adapter-{args.name.replace('_', '-')}"
    if target.exists():
        parser.error(f"{target} already exists; nothing was changed")
    title = args.title or args.name
    camel = "".join(part.capitalize() for part in args.name.split("_"))
    replacements = [
        ("agentlightning_template", f"agentlightning_{args.name}"),
        ("agentlightning-template", f"agentlightning-{args.name.replace('_', '-')}"),
        ("TemplateAdapter", f"{camel}Adapter"),
        ("TestTemplateConformance", f"Test{camel}Conformance"),
        ('NAME: ClassVar[str] = "template"', f'NAME: ClassVar[str] = "{args.name}"'),
        ("template = ", f"{args.name} = "),
        (">=1.0,<2", args.range),
        ("TEMPLATE_DIST", args.dist),
        ("TEMPLATE_FRAMEWORK", title),
    ]
    shutil.copytree(TEMPLATE, target, ignore=shutil.ignore_patterns("__pycache__", "README.md"))
    (target / "src" / "agentlightning_template").rename(target / "src" / f"agentlightning_{args.name}")
    (target / "tests" / "test_adapter_template.py").rename(target / "tests" / f"test_adapter_{args.name}.py")
    readme = (
        f"# agentlightning-{args.name}\n\nAgent Lightning adapter for {title}.\n\n"
        f"```bash\npip install agentlightning-{args.name}\n```\n\n"
        f"Its tests run the shared adapter kit: `pip install -e '.[test]' && pytest`.\n"
    )
    (target / "README.md").write_text(readme)
    for path in target.rglob("*"):
        if path.is_file() and path.suffix in {".py", ".toml", ".md"}:
            text = path.read_text()
            for old, new in replacements:
                text = text.replace(old, new)
            path.write_text(text)
    print(f"created {target}; implement _instrument/_uninstrument, then: pip install -e '.[test]' && pytest")
    return 0


if __name__ == "__main__":
    sys.exit(main())
