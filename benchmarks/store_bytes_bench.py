"""Bytes the store keeps per LLM call, per span and per rollout: the quickstart's run, this tree against a baseline.

Runs ``examples/calc/train.py`` (the quickstart: LangGraph agent → runner → adapter spans → proxy → local backend →
SQLite store → training) at toy size, once with this tree's code and once with a baseline checkout's
(``--baseline``, e.g. ``git worktree add ../base <commit>`` of the code before a storage change), with the same
settings and seed, then reads each run's ``store.db`` page by page (SQLite's ``dbstat``) and prints the bytes of:

- **per LLM call**: the ``llm_calls`` table and its indexes, plus the ``blobs`` table (shared tools and system
  prompts, counted here in full although spans may share them), divided by the number of calls;
- **per span**: the ``spans`` table (its primary key is its only index) and, from schema version 7 on, the
  ``span_attempts`` table of its attempts' keys, divided by the number of spans;
- **per rollout**: the whole file (every table and index), divided by the number of rollouts.

Pages are counted as SQLite stores them (``pgsize``: page headers and free space included), so the figures are
what a disk holds. Prints a table, then ONE final line: a JSON object of every figure and the ratios.

    .venv/bin/python benchmarks/store_bytes_bench.py --baseline ../base [--iterations 2]
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_quickstart(tree: Path, output: Path, args: argparse.Namespace) -> None:
    """Run the quickstart from ``tree`` (its own sources first on the path) into ``output``."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in sorted((tree / "packages").glob("*/src")))
    cmd = [
        sys.executable, str(tree / "examples" / "calc" / "train.py"), "--quiet", "--no-dashboard",
        "--iterations", str(args.iterations), "--tasks-per-iteration", str(args.tasks),
        "--samples-per-task", str(args.samples), "--eval-size", str(args.eval_size), "--workers", "16",
        "--minutes", "600", "--rollout-timeout", "3600", "--seed", "0", "--output", str(output),
    ]  # fmt: skip
    done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=3600, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the quickstart failed in {tree}:\n{done.stderr[-3000:]}")


def measure(db: Path) -> dict[str, float]:
    """Bytes per call / span / rollout of one store file (see the module docstring)."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        pages = dict(conn.execute("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name").fetchall())
        owners = dict(conn.execute("SELECT name, tbl_name FROM sqlite_schema").fetchall())
        per_table: dict[str, int] = {}
        for name, size in pages.items():
            table = owners.get(name, name)
            per_table[table] = per_table.get(table, 0) + size
        tables = ("llm_calls", "spans", "rollouts")
        counts = {t: conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in tables}
        total = conn.execute("PRAGMA page_count").fetchone()[0] * conn.execute("PRAGMA page_size").fetchone()[0]
    finally:
        conn.close()
    calls_bytes = per_table.get("llm_calls", 0) + per_table.get("blobs", 0)
    return {
        "calls": counts["llm_calls"],
        "spans": counts["spans"],
        "rollouts": counts["rollouts"],
        "bytes_per_call": calls_bytes / max(1, counts["llm_calls"]),
        # schema 7 keys spans by an attempt's integer key, kept in span_attempts: counted with the spans
        "bytes_per_span": (per_table.get("spans", 0) + per_table.get("span_attempts", 0)) / max(1, counts["spans"]),
        "bytes_per_rollout": total / max(1, counts["rollouts"]),
        "blobs_bytes": per_table.get("blobs", 0),
        "file_bytes": total,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", type=Path, required=True, help="a checkout of the code to compare against")
    parser.add_argument("--iterations", type=int, default=2)
    parser.add_argument("--tasks", type=int, default=4, help="tasks per iteration")
    parser.add_argument("--samples", type=int, default=4, help="samples per task")
    parser.add_argument("--eval-size", type=int, default=4)
    args = parser.parse_args(argv)
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="agl-bytes-") as tmp:
        results = {}
        for label, tree in (("baseline", args.baseline), ("this", ROOT)):
            run_quickstart(tree, Path(tmp) / label, args)
            results[label] = measure(Path(tmp) / label / "store.db")
    print(f"{'':22}{'baseline':>12}{'this tree':>12}{'ratio':>8}")
    for key in ("calls", "spans", "rollouts", "bytes_per_call", "bytes_per_span", "bytes_per_rollout", "file_bytes"):
        before, after = results["baseline"][key], results["this"][key]
        ratio = after / before if before else float("nan")
        print(f"{key:22}{before:12.0f}{after:12.0f}{ratio:8.3f}")
        figures[f"baseline.{key}"] = before
        figures[f"this.{key}"] = after
        if key.startswith("bytes") or key == "file_bytes":
            figures[f"ratio.{key}"] = round(ratio, 4)
    figures["this.blobs_bytes"] = results["this"]["blobs_bytes"]
    print(json.dumps(figures, sort_keys=True))


if __name__ == "__main__":
    main()
