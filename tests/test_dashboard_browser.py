"""The dashboard in a real headless Chromium, against a store filled by a real run of a LangGraph agent.

A real ``agl store serve`` process (SQLite, bearer token) is filled by `agl.Runner` running an ordinary LangGraph
agent (LangChain adapter) whose LLM calls go through the real `LLMProxy` to core's `ScriptedModelServer`; some
rollouts raise after their LLM calls, so they fail with a traceback and are retried once. Chromium (Debian's
``chromium``, driven by Playwright) then logs in, is refused with a wrong token, filters the rollout table to
failed rollouts, opens one and sees its span tree, the traceback, the chat and the transitions. Every view is
saved as a screenshot under ``runs/test-artifacts/dashboard`` (or ``$AGL_TEST_ARTIFACTS``).

Started without a token, ``agl store serve`` makes one and prints the dashboard's address with it (``#token=``):
Chromium opens that address straight into the runs view. A page of another origin in the same browser tries what
a malicious site would (a ``no-cors`` fetch that replaces the resources, a form post that enqueues a rollout) and
changes nothing.
"""

from __future__ import annotations

import asyncio
import html
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest

pytest.importorskip("langgraph")

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, SystemMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode

import agentlightning as agl
from agentlightning.proxy import LLMProxy
from agentlightning.testing import ScriptedModelServer, ScriptedReply, StoreServerProcessForTests, free_port
from agentlightning_langchain import LangChainAdapter

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "dashboard-test-token"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _chromium() -> str:
    """Debian's chromium, or a skip that says why (CI installs it: ``scripts/dev.py test`` runs apt as root)."""
    path = shutil.which("chromium") or "/usr/bin/chromium"
    missing = None
    if not os.path.exists(path):
        missing = "Debian's chromium is not installed (apt-get install chromium; scripts/dev.py test does it as root)"
    try:
        import playwright.sync_api  # noqa: F401  # pyright: ignore[reportUnusedImport]
    except ImportError:
        missing = "the playwright Python package is not installed (pip install playwright)"
    if missing is not None:
        if os.environ.get("CI"):
            pytest.fail(f"browser tests must run in CI: {missing}")
        pytest.skip(missing)
    return path


@tool
def lookup(city: str) -> str:
    """Look up a fact about a city."""
    return f"{city} has a river."


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def _graph(base_url: str) -> Any:
    """researcher (LLM + tool) -> writer (LLM)."""
    llm = ChatOpenAI(base_url=base_url, api_key="unused", model="toy")
    researcher_llm = llm.bind_tools([lookup])

    async def researcher(state: State) -> dict[str, Any]:
        return {"messages": [await researcher_llm.ainvoke(state["messages"])]}

    async def writer(state: State) -> dict[str, Any]:
        reply = await llm.ainvoke([SystemMessage("writer: answer in one sentence"), *state["messages"][-1:]])
        return {"messages": [AIMessage(content=reply.content, name="writer")]}

    def route(state: State) -> str:
        last = state["messages"][-1]
        return "tools" if isinstance(last, AIMessage) and last.tool_calls else "writer"

    g = StateGraph(State)
    g.add_node("researcher", researcher)
    g.add_node("writer", writer)
    g.add_node("tools", ToolNode([lookup]))
    g.add_edge(START, "researcher")
    g.add_conditional_edges("researcher", route, {"tools": "tools", "writer": "writer"})
    g.add_edge("tools", "researcher")
    g.add_edge("writer", END)
    return g.compile()


def _script(body: dict[str, Any]) -> ScriptedReply:
    messages = body.get("messages") or []
    if messages and messages[0].get("role") == "system":
        return ScriptedReply(content="It has a river." if "Paris" in str(messages[-1]) else "No idea.")
    if body.get("tools") and not any(m.get("role") == "tool" for m in messages):
        city = "Paris" if "Paris" in str(messages) else "Oslo"
        return ScriptedReply(tool_calls=[{"name": "lookup", "arguments": {"city": city}}])
    return ScriptedReply(content="Paris has a river." if "Paris" in str(messages) else "Oslo, maybe.")


@agl.rollout
async def city_agent(task: dict[str, Any], resources: agl.Resources) -> float:
    """An ordinary LangGraph agent; tasks marked ``explode`` raise after their LLM calls."""
    result = await _graph(agl.llm_base_url()).ainvoke({"messages": [HumanMessage(task["question"])]})
    if task.get("explode"):
        raise RuntimeError("the agent lost its way after the LLM calls")
    return 1.0 if "river" in str(result["messages"][-1].content) else 0.0


async def _fill(url: str) -> None:
    """Two model versions of rollouts through the real runner, proxy and scripted model."""
    store = agl.StoreClient(url, token=TOKEN)
    adapter = LangChainAdapter.default()
    with ScriptedModelServer(_script) as model:
        # one LoRA policy per agent: the writer's calls go to adapter "writer", the researcher's to "researcher"
        policies = agl.PolicyMap(agents={"writer": "writer", "researcher": "researcher"})
        async with LLMProxy(store, [model.base_url], model_version=1, policies=policies) as proxy:
            adapter.instrument()
            try:
                for version in (1, 2):
                    proxy.model_version = version
                    llm = proxy.llm_resource("toy")
                    await store.add_resources(agl.Resources(resources_id=f"policy-v{version}", items={"llm": llm}))
                    requests = [
                        agl.RolloutRequest(
                            rollout_id=f"v{version}-{city}-{i}",
                            input={"question": f"{city}?", "explode": city == "Rome"},
                            group_id=f"v{version}-g{i}",  # Paris (reward 1), Oslo (0), Rome (fails)
                            mode="train",
                            resources_id=f"policy-v{version}",
                        )
                        for city in ("Paris", "Oslo", "Rome")
                        for i in range(2)
                    ]
                    await store.enqueue_rollouts(requests)
                    runner = agl.Runner(city_agent, store, n_workers=3, stop_when_idle=True, poll_interval=0.05)
                    await runner.arun()
                await proxy.flush()
            finally:
                adapter.uninstrument()
        stats = await store.stats()
        await store.close()
    assert stats.rollouts["succeeded"] == 8 and stats.rollouts["failed"] == 4, stats
    assert stats.llm_calls >= 12 * 3


def _artifacts() -> Path:
    folder = Path(os.environ.get("AGL_TEST_ARTIFACTS", ROOT / "runs" / "test-artifacts")) / "dashboard"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def test_dashboard_in_chromium(tmp_path: Path) -> None:
    chromium = _chromium()
    from playwright.sync_api import sync_playwright

    policy = agl.RetryPolicy(max_attempts=2, retry_on=frozenset({"failed"}))
    shots = _artifacts()
    with StoreServerProcessForTests(tmp_path / "store.db", token=TOKEN, retry_policy=policy) as server:
        asyncio.run(_fill(server.url))
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS, headless=True)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                errors: list[str] = []
                page.on("pageerror", lambda exc: errors.append(str(exc)))
                # CSP refusals and failed loads are console errors; the expected 401s of the wrong token are not
                page.on(
                    "console",
                    lambda msg: errors.append(msg.text) if msg.type == "error" and "401" not in msg.text else None,
                )
                _walk(page, server.url, shots)
                assert errors == [], f"JavaScript errors in the page: {errors}"
            finally:
                browser.close()
    print(f"dashboard screenshots: {shots}")


_DRAWN = """name => {
    const view = document.querySelector("main#view");
    return view.dataset.view === name && view.dataset.loaded === (location.hash || "#/");
}"""


def _wait_drawn(page: Any, name: str) -> None:
    """Until the view ``name`` has drawn the data of the address in the bar: ``data-loaded`` names the route whose data
    is on screen, so a flag left by the previous route (the unfiltered rows) never passes for the new one."""
    page.wait_for_function(_DRAWN, arg=name)


def _walk(page: Any, url: str, shots: Path) -> None:
    page.goto(url + "/ui")
    page.wait_for_selector("#login-form", state="visible")

    # a wrong token is refused and forgotten
    page.fill("#token", "not-the-token")
    page.click("#login-submit")
    page.wait_for_selector("#login-error", state="visible")
    assert "Wrong token" in page.inner_text("#login-error")
    assert page.evaluate("sessionStorage.length") == 0 and page.is_hidden("#nav")
    page.screenshot(path=str(shots / "login-refused.png"))

    # the right token opens the runs view; it lives in sessionStorage only, never in the URL
    page.fill("#token", TOKEN)
    page.click("#login-submit")
    _wait_drawn(page, "runs")
    assert page.is_hidden("#login") and page.is_visible("#nav")
    assert TOKEN not in page.url and page.evaluate("localStorage.length") == 0
    assert TOKEN in page.evaluate("Object.values(sessionStorage)")
    assert page.inner_text("#card-failed .n") == "4" and page.inner_text("#card-succeeded .n") == "8"
    assert page.inner_text("#card-failed-attempts .n") == "8"
    assert page.locator("#chart-reward circle.point").count() == 2  # one point per model version
    assert page.locator("#versions-table tbody tr").count() == 2
    # one reward curve per policy, a point per model version each (Paris 1, Oslo 0; the failed ones unrewarded)
    policies = "#chart-policy-reward[data-by=policy]"
    assert page.get_attribute(policies, "data-series-0") == "researcher"
    assert page.get_attribute(policies, "data-series-1") == "writer"
    assert page.locator(f"{policies} path.series").count() == 2
    assert page.locator(f"{policies} circle.point").count() == 4
    assert "researcher (researcher)" in page.inner_text(f"{policies} .legend")
    titles = page.eval_on_selector_all(f"{policies} circle.point title", "ts => ts.map(t => t.textContent)")
    expected = [f"{p} · version {v}: 0.500 (4 rewarded)" for p in ("researcher", "writer") for v in (1, 2)]
    assert sorted(titles) == expected
    writer_rows = page.locator("#policies-table tbody tr[data-policy=writer]")
    assert writer_rows.count() == 2  # versions 1 and 2, training rollouts
    assert "writer" in writer_rows.first.inner_text()
    # one runner process (the test's agl.Runner) claimed every attempt: 8 succeeded, 8 failed
    runners = page.locator("#runners-table tbody tr[data-runner]")
    assert runners.count() == 1
    cells = runners.first.locator("td").all_inner_texts()
    assert cells[1] == str(os.getpid()) and cells[3:7] == ["16", "0", "8", "8"], cells
    page.screenshot(path=str(shots / "runs.png"), full_page=True)

    # rollouts: filter to the failed ones
    page.click("#nav a[data-view=rollouts]")
    _wait_drawn(page, "rollouts")
    assert page.get_attribute("#rollouts-table", "data-total") == "12"
    # the moment the filter changes, before its rows arrive, the view no longer says it is loaded (the 12 rows on
    # screen are not the filtered ones): read in the same task as the click, before any event or response
    hash_now, loaded_now = page.evaluate(
        """() => {
            document.querySelector(".status-filter input[value=failed]").click();
            return [location.hash, document.querySelector("main#view").dataset.loaded ?? null];
        }"""
    )
    assert "status=failed" in hash_now and loaded_now is None, (hash_now, loaded_now)
    _wait_drawn(page, "rollouts")
    rows = page.locator("#rollouts-table tbody tr")
    assert rows.count() == 4 and page.get_attribute("#rollouts-table", "data-total") == "4"
    assert all(
        s == "failed"
        for s in page.eval_on_selector_all("#rollouts-table tbody tr", "rs => rs.map(r => r.dataset.status)")
    )
    assert "lost its way" in page.inner_text("#rollouts-table tbody tr:first-child .err-cell")
    page.screenshot(path=str(shots / "rollouts-failed.png"), full_page=True)

    # one failed rollout: attempts, span tree with the error's traceback, the chat, its transitions
    page.click("#rollouts-table tbody tr:first-child a")
    _wait_drawn(page, "rollout")
    assert page.locator("#attempts-table tbody tr").count() == 2
    kinds = page.eval_on_selector_all("#span-tree .span-row", "rs => rs.map(r => r.dataset.kind)")
    assert {"rollout", "agent", "llm", "tool"} <= set(kinds), kinds
    assert page.locator("#span-tree .span-row.error").count() >= 1
    # the timeline draws each span's bar to scale: the root spans the whole attempt
    root_bar = page.locator("#span-tree .span-row[data-kind=rollout] .bar").bounding_box()
    track = page.locator("#span-tree .span-row[data-kind=rollout] .track").bounding_box()
    assert root_bar is not None and track is not None and root_bar["width"] > 0.9 * track["width"]
    traceback = page.inner_text("#span-detail .traceback")
    assert "Traceback" in traceback and "lost its way" in traceback
    assert page.locator("#chat .call").count() == 3  # researcher (tool call), researcher, writer
    assert page.locator("#chat .msg.response").count() == 3
    assert "model version" in page.inner_text("#chat .call:first-child .meta")
    # the policy that served every call
    assert "agent researcher · policy researcher" in page.inner_text("#chat .call:first-child .meta")
    assert "agent writer · policy writer" in page.inner_text("#chat .call:last-child .meta")
    assert page.locator("#transitions-table tbody tr").count() == 3
    assert "failed" in page.inner_text("#batch-note")
    page.screenshot(path=str(shots / "rollout-failed.png"), full_page=True)

    # a succeeded rollout: its transitions are in the batch with credit and advantage
    page.goto(url + "/ui#/rollouts?status=succeeded&search=Paris")
    _wait_drawn(page, "rollouts")
    assert page.get_attribute("#rollouts-table", "data-total") == "4"  # Paris, 2 per version
    page.click("#rollouts-table tbody tr:first-child a")
    _wait_drawn(page, "rollout")
    cells = page.eval_on_selector_all(
        "#transitions-table tbody tr", "rs => rs.map(r => [r.children[2].innerText, r.children[8].innerText])"
    )
    assert cells and all(trained == "trained" and float(adv) > 0 for trained, adv in cells), cells
    page.select_option("#explain-credit", "discounted")
    page.click("#explain-form button[type=submit]")
    page.wait_for_selector("#transitions-box[data-credit=discounted]")
    page.screenshot(path=str(shots / "rollout-succeeded.png"), full_page=True)

    # resources: both versions, the newest current
    page.click("#nav a[data-view=resources]")
    _wait_drawn(page, "resources")
    assert page.locator("#resources-table tbody tr").count() == 2
    assert "policy-v2" in page.inner_text("#resources-table tbody tr:first-child")
    assert page.locator("#resources-table .badge.current").count() == 1
    page.screenshot(path=str(shots / "resources.png"), full_page=True)

    # health: agl doctor's checks of the run (4 of the 12 finished rollouts failed: a warning with the agent's error)
    page.click("#nav a[data-view=health]")
    _wait_drawn(page, "health")
    verdict = page.inner_text("#health-verdict")
    assert verdict.startswith("trainable over the newest 12 finished rollouts"), verdict
    failed = page.inner_text("#health-findings li[data-check=rollouts-failed]")
    assert "warning" in failed and "4 of 12 rollouts failed" in failed and "lost its way" in failed, failed
    sites = page.locator("#health-sites tbody tr").all_inner_texts()
    assert any("researcher" in row for row in sites) and any("writer" in row for row in sites), sites
    page.screenshot(path=str(shots / "health.png"), full_page=True)


def _wait_until_healthy(url: str, proc: subprocess.Popen[str]) -> None:
    """Until ``url`` answers 200 (the address is printed just before the socket listens)."""
    while proc.poll() is None:
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                if resp.status == 200:
                    return
        except OSError:
            threading.Event().wait(0.05)
    raise AssertionError(f"agl store serve exited with {proc.returncode}")


@contextmanager
def _store_served_without_a_token(db: Path) -> Iterator[str]:
    """``agl store serve`` as a user starts it, no token given; yields the dashboard address it prints."""
    port = free_port()
    env = {**os.environ, "AGL_STORE_TOKEN": "", "COLUMNS": "400"}
    cmd = [sys.executable, "-m", "agentlightning.cli", "store", "serve", "--db", str(db), "--port", str(port)]
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        assert proc.stderr is not None
        address = next((line.split("dashboard:", 1)[1].split()[0] for line in proc.stderr if "dashboard:" in line), "")
        assert address, f"agl store serve exited with {proc.wait()} before printing its dashboard address"
        _wait_until_healthy(address.split("/ui", 1)[0] + "/healthz", proc)
        yield address
    finally:
        proc.terminate()
        proc.wait(30)


def _browser(chromium: str) -> Any:
    from playwright.sync_api import sync_playwright

    playwright = sync_playwright().start()
    browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS, headless=True)
    return playwright, browser


def test_dashboard_opens_with_the_token_in_its_address(tmp_path: Path) -> None:
    chromium = _chromium()
    with _store_served_without_a_token(tmp_path / "store.db") as address:
        match = re.fullmatch(r"(http://127\.0\.0\.1:\d+/ui)#token=([\w-]+)", address)
        assert match is not None, address
        playwright, browser = _browser(chromium)
        try:
            page = browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            # the browser's own /favicon.ico request is refused (401) without a token: only API refusals count
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" and "401" not in m.text else None)
            page.on("response", lambda r: errors.append(r.url) if r.status == 401 and "/v1/" in r.url else None)
            page.goto(address)
            _wait_drawn(page, "runs")
            assert page.is_hidden("#login") and page.is_visible("#nav")
            # the token moved to the tab's sessionStorage and out of the address bar (and its history entry)
            assert page.url == match.group(1) and match.group(2) not in page.url
            assert page.evaluate("Object.values(sessionStorage)") == [match.group(2)]
            page.goto(match.group(1) + "#/resources")  # the tab keeps it while it lives
            _wait_drawn(page, "resources")
            assert errors == [], errors
            # without the token (another tab's session) the page asks for it
            other = browser.new_page()
            other.goto(match.group(1))
            other.wait_for_selector("#login-form", state="visible")
        finally:
            browser.close()
            playwright.stop()


_EVIL_RESOURCES = {"resources_id": "evil", "items": {"llm": {"kind": "llm", "endpoint": "http://evil.example/v1",
                                                               "model": "m"}}}  # fmt: skip
# A text/plain form whose one field, name=value, reads as JSON: the classic form-post-as-JSON trick.
_FORM_NAME = '{"requests": [{"rollout_id": "sneaked", "input": "'
_FORM_VALUE = '"}]}'


@contextmanager
def _foreign_site() -> Iterator[str]:
    """Another origin (``http://localhost:<other port>``) serving one page with a form."""
    page = (
        '<!doctype html><html><body><form id="f" method="post" enctype="text/plain">'
        f'<input type="hidden" name="{html.escape(_FORM_NAME)}" value="{html.escape(_FORM_VALUE)}"></form>'
        "</body></html>"
    ).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://localhost:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def test_a_page_of_another_origin_changes_nothing(tmp_path: Path) -> None:
    """What a malicious site open in the user's browser did to the dashboard's store: replace the resources with
    its own LLM endpoint (``fetch`` ``no-cors``, a ``text/plain`` body) and enqueue rollouts (a form post)."""
    chromium = _chromium()
    db = tmp_path / "store.db"
    with _store_served_without_a_token(db) as address, _foreign_site() as foreign:
        base = address.split("/ui", 1)[0]
        playwright, browser = _browser(chromium)
        try:
            page = browser.new_page()
            page.goto(foreign)
            page.evaluate(
                """async ([url, body]) => {
                    await fetch(url, {method: "POST", mode: "no-cors", body, headers: {"Content-Type": "text/plain"}});
                }""",
                [base + "/v1/resources", json.dumps(_EVIL_RESOURCES)],
            )
            page.evaluate("url => { document.getElementById('f').action = url; }", base + "/v1/rollouts/enqueue")
            with page.expect_navigation():
                page.evaluate("document.getElementById('f').submit()")
            answer = json.loads(page.inner_text("body"))
        finally:
            browser.close()
            playwright.stop()

    async def stored() -> tuple[Any, Any]:
        store = agl.SqliteStore(db)
        try:
            return await store.get_resources(), await store.query_rollouts()
        finally:
            await store.close()

    resources, rollouts = asyncio.run(stored())
    assert resources is None and rollouts == [], (resources, rollouts)
    assert answer["error"] in ("unauthorized", "forbidden", "unsupported_media_type"), answer
