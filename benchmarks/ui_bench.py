"""Dashboard benchmark: the rollout table's first page with 100,000 rollouts in a SQLite store.

Run: ``.venv/bin/python benchmarks/ui_bench.py [--rollouts N] [--repeats N]``. Needs Debian's ``chromium`` and
the ``playwright`` package for the browser part (skipped with a note otherwise).

What it measures, against a real ``agl store serve`` process (SQLite file, bearer token):

* API: ``POST /v1/rollouts/list`` (one page of summaries, filters, a deep page) and ``POST /v1/runs/stats``,
  against the baseline of the same run: ``POST /v1/rollouts/query`` (the plain list endpoint, every rollout),
  which is what a dashboard without server-side paging would have to load.
* Browser: headless Chromium opens ``/ui#/rollouts`` and the page reports, through the Performance API, the time
  from the start of the view to the laid-out table (fetch + JSON + DOM + layout), for several pages.

The store is filled with SQL in one transaction (rollouts, their attempts with final reward and model version,
as a run leaves them), because filling 100,000 rollouts through the API takes minutes on a small machine; the
reads under test all go through the served API. Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sqlite3
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from agentlightning.store import SqliteStore
from agentlightning.testing import StoreServerProcessForTests

TOKEN = "bench-token"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]  # fmt: skip


def fill(path: Path, n: int, seed: int = 0) -> None:
    """A store file with ``n`` rollouts in the shapes a training run leaves (statuses, retries, rewards, versions)."""
    import asyncio

    asyncio.run(SqliteStore(path).close())  # creates the file with the current schema
    rng = random.Random(seed)
    rollouts: list[tuple[Any, ...]] = []
    attempts: list[tuple[Any, ...]] = []
    t0 = time.time() - n * 0.05
    for i in range(n):
        t = t0 + i * 0.05
        roll = rng.random()
        status = "succeeded" if roll < 0.72 else "failed" if roll < 0.90 else "running" if roll < 0.95 else "queuing"
        version = i // 1000
        mode = "val" if i % 10 == 9 else "train"
        rid = f"it{version}-{i:06d}"
        tries = 2 if status == "failed" else (0 if status == "queuing" else 1)
        rollouts.append((rid, status, json.dumps({"question": f"Q:{i}*7+3="}), mode, f"it{version}-g{i // 8}", None,
                         max(0, tries - 1), t, t + 1.0, "{}"))  # fmt: skip
        for seq in range(1, tries + 1):
            last = seq == tries
            a_status = status if last and status != "failed" else "failed"
            end = None if a_status == "running" else t + seq * 0.6
            error = "ValueError: the agent could not parse the tool result" if a_status == "failed" else None
            reward = float(rng.random() < 0.6) if a_status == "succeeded" else None
            attempts.append((rid, f"at-{i}-{seq}", seq, "host:1:0", a_status, t + (seq - 1) * 0.6, end,
                             end or t, error, reward, 0 if reward is not None else None, version, mode))  # fmt: skip
    conn = sqlite3.connect(path)
    with conn:
        conn.executemany(
            "INSERT INTO rollouts (rollout_id, status, input, mode, group_id, resources_id, retry_count, created_at, "
            "updated_at, metadata) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            rollouts,
        )
        conn.executemany(
            "INSERT INTO attempts (rollout_id, attempt_id, sequence, worker_id, status, start_time, end_time, "
            "last_heartbeat, error, reward, reward_seq, model_version, mode) VALUES "
            "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            attempts,
        )
    conn.close()


def post(url: str, body: dict[str, Any]) -> tuple[float, int]:
    """One POST; returns (milliseconds, response bytes)."""
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST",
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )  # fmt: skip
    start = time.perf_counter()
    with urllib.request.urlopen(request, timeout=300) as resp:
        data = resp.read()
    return (time.perf_counter() - start) * 1000, len(data)


def timed(url: str, body: dict[str, Any], repeats: int) -> tuple[float, int]:
    runs = [post(url, body) for _ in range(repeats)]
    return statistics.median(ms for ms, _ in runs), runs[0][1]


# the view has drawn the address in the bar (data-loaded names the route drawn; absent while one loads)
DRAWN = "() => document.querySelector('main#view').dataset.loaded === (location.hash || '#/')"


def browser(url: str, pages: int) -> dict[str, float] | None:
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        print("note: playwright is not installed; browser figures skipped")
        return None
    if not Path(chromium).exists():
        print("note: chromium is not installed; browser figures skipped")
        return None
    measure = "() => performance.getEntriesByName('rollouts-render').at(-1).duration"
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, args=FLAGS, headless=True)
        try:
            page = b.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(url + "/ui")
            page.fill("#token", TOKEN)
            page.click("#login-submit")
            page.wait_for_selector("main#view[data-view=runs][data-loaded]", timeout=120_000)
            renders: list[float] = []
            for n in range(pages):  # a fresh hash each time: the view fetches and draws the page again
                page.evaluate(f"location.hash = '#/rollouts?page={n}'")
                page.wait_for_function(DRAWN, timeout=120_000)
                renders.append(page.evaluate(measure))
            page.evaluate("location.hash = '#/rollouts?status=failed&mode=val'")
            page.wait_for_function(DRAWN, timeout=120_000)
            filtered = page.evaluate(measure)
            rows = page.locator("#rollouts-table tbody tr").count()
            plain = page.evaluate(
                """async (token) => {
                    const t = performance.now();
                    const r = await fetch('/v1/rollouts/query', {method: 'POST', body: '{}',
                        headers: {'Authorization': 'Bearer ' + token, 'Content-Type': 'application/json'}});
                    const data = await r.json();
                    return [performance.now() - t, data.rollouts.length];
                }""",
                TOKEN,
            )
        finally:
            b.close()
    return {
        "render_first_page_ms": renders[0],
        "render_page_median_ms": statistics.median(renders),
        "render_filtered_ms": filtered,
        "rows_on_page": rows,
        "browser_plain_list_fetch_ms": plain[0],
        "browser_plain_list_rows": plain[1],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rollouts", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=15, help="timed requests per API figure (median)")
    parser.add_argument("--pages", type=int, default=5, help="table pages rendered in the browser")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "bench.db"
        started = time.perf_counter()
        fill(db, args.rollouts)
        fill_s = time.perf_counter() - started
        with StoreServerProcessForTests(db, token=TOKEN) as server:
            api = server.url + "/v1"
            post(api + "/rollouts/list", {})  # warm the server and SQLite's page cache
            figures: dict[str, Any] = {"rollouts": args.rollouts, "fill_seconds": round(fill_s, 2)}
            mid = args.rollouts // 2
            rows = [
                ("first page (50, newest)", "/rollouts/list", {"limit": 50}),
                ("failed, first page", "/rollouts/list", {"status": ["failed"], "limit": 50}),
                ("one model version", "/rollouts/list", {"model_version": mid // 1000, "limit": 50}),
                ("one group", "/rollouts/list", {"group_id": f"it{mid // 1000}-g{mid // 8}", "limit": 50}),
                ("id contains", "/rollouts/list", {"search": "099", "limit": 50}),
                ("last page (offset n-50)", "/rollouts/list", {"limit": 50, "offset": args.rollouts - 50}),
                ("run stats", "/runs/stats", {}),
                ("baseline: plain list, every rollout", "/rollouts/query", {}),
            ]
            print(f"{args.rollouts} rollouts (filled in {fill_s:.1f} s), served by agl store serve, median of "
                  f"{args.repeats} requests (baseline: 3)")  # fmt: skip
            print(f"{'API request':40s} {'ms':>9s} {'KiB':>9s}")
            keys = ["api_first_page_ms", "api_failed_ms", "api_version_ms", "api_group_ms", "api_search_ms",
                    "api_last_page_ms", "api_run_stats_ms", "api_plain_list_ms"]  # fmt: skip
            for key, (label, path, body) in zip(keys, rows, strict=True):
                ms, size = timed(api + path, body, 3 if path == "/rollouts/query" else args.repeats)
                figures[key] = round(ms, 2)
                print(f"{label:40s} {ms:9.1f} {size / 1024:9.1f}")
            figures["api_speedup_vs_plain_list"] = round(figures["api_plain_list_ms"] / figures["api_first_page_ms"], 1)
            shown = browser(server.url, args.pages)
    if shown is not None:
        figures.update({k: round(v, 1) for k, v in shown.items()})
        print(f"{'in Chromium (view start -> table laid out)':40s} {'ms':>9s}")
        print(f"{'first page':40s} {shown['render_first_page_ms']:9.1f}")
        print(f"{'median of ' + str(args.pages) + ' pages':40s} {shown['render_page_median_ms']:9.1f}")
        print(f"{'failed + val filter':40s} {shown['render_filtered_ms']:9.1f}")
        print(f"{'baseline: fetch + parse plain list':40s} {shown['browser_plain_list_fetch_ms']:9.1f}")
        figures["first_page_under_1s"] = shown["render_first_page_ms"] < 1000
    print(f"first page vs plain list (API): {figures['api_speedup_vs_plain_list']}x faster")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
