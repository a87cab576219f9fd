"""One network rule for every server: off loopback a bearer token of 16+ characters, refused the same way.

Every way to serve something (``agl store serve``, ``agl proxy serve``, `LLMProxy`, `StoreServerProcess`,
`StoreServing`, `ProxySettings`, `DashboardServer`) gets the same bad input and must answer with the refusal of the
shared rule (`agentlightning._netauth.check_bind_token`), differing only in what is served and how to pass a token.
"""

from __future__ import annotations

import ast
import asyncio
import re
from collections.abc import Callable
from pathlib import Path

import pytest

import agentlightning
from agentlightning import ProxySettings, StoreServing
from agentlightning._netauth import check_bind_token
from agentlightning.cli import main as agl_main
from agentlightning.proxy import LLMProxy
from agentlightning.store import MemoryStore, StoreServerProcess
from agentlightning.ui import DashboardServer

HOST = "10.213.0.1"  # off loopback; nothing binds it: every server refuses before listening
PORT = 4799


def _refusal(attempt: Callable[[], object]) -> str | None:
    """The message ``attempt`` refuses with (a `ValueError`, pydantic's included), or ``None`` if it accepted."""
    try:
        attempt()
    except ValueError as exc:
        return str(exc)
    return None


def _cli(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str | None:
    code = agl_main(argv)
    err = " ".join(capsys.readouterr().err.split())
    return err if code == 2 else None


def _store_cli(token: str | None, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> str | None:
    tokens = [] if token is None else ["--token", token]
    return _cli(capsys, ["store", "serve", "--memory", "--host", HOST, "--port", str(PORT), *tokens])


def _proxy_cli(token: str | None, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> str | None:
    tokens = [] if token is None else ["--token", token]
    argv = ["proxy", "serve", "--db", str(tmp_path / "s.db"), "--backend", "http://127.0.0.1:9", "--host", HOST]
    return _cli(capsys, [*argv, "--port", str(PORT), *tokens])


def _proxy(token: str | None, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> str | None:
    proxy = LLMProxy(MemoryStore(), ["http://127.0.0.1:9"], token=token, host=HOST, port=PORT)
    return _refusal(lambda: asyncio.run(proxy.start()))


def _store_process(token: str | None, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> str | None:
    return _refusal(lambda: StoreServerProcess(tmp_path / "s.db", HOST, PORT, token=token))


def _store_serving(token: str | None, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> str | None:
    return _refusal(lambda: StoreServing(serve=f"{HOST}:{PORT}", token=token))


def _proxy_settings(token: str | None, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> str | None:
    return _refusal(lambda: ProxySettings(host=HOST, token=token).check_exposure())


def _dashboard(token: str | None, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> str | None:
    return _refusal(lambda: DashboardServer(tmp_path / "s.db", host=HOST, token=token))


SERVERS = {
    "agl store serve": _store_cli,
    "agl proxy serve": _proxy_cli,
    "LLMProxy": _proxy,
    "StoreServerProcess": _store_process,
    "StoreServing": _store_serving,
    "ProxySettings": _proxy_settings,
    "DashboardServer": _dashboard,
}


def _shared_refusal(token: str | None) -> re.Pattern[str]:
    """The shared rule's refusal for ``token`` on `HOST`, with what is served and how to pass a token left open."""
    try:
        check_bind_token(HOST, token, "\0what\0", "\0how\0")
    except ValueError as exc:
        pattern = re.escape(str(exc)).replace(re.escape("\0what\0"), ".+").replace(re.escape("\0how\0"), ".+")
        return re.compile(pattern)
    raise AssertionError("the shared rule accepted a missing or short token off loopback")


@pytest.mark.parametrize("token", [None, "x" * 15], ids=["no token", "15-character token"])
@pytest.mark.parametrize("server", sorted(SERVERS))
def test_every_server_refuses_an_unsafe_token_off_loopback_the_same_way(
    server: str,
    token: str | None,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    for name in ("AGL_STORE_TOKEN", "AGL_PROXY_TOKEN", "AGL_PROXY_ADMIN_TOKEN", "AGL_PROXY_RUNNER_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    refusal = SERVERS[server](token, capsys, tmp_path)
    assert refusal is not None, f"{server} accepted {token!r} on {HOST}"
    assert _shared_refusal(token).search(refusal), f"{server} refused by a rule of its own: {refusal}"


def test_only_the_shared_module_decides_what_loopback_is() -> None:
    """No second copy of the rule: only ``_netauth`` asks an address whether it is loopback or sets a token length."""
    src = Path(agentlightning.__path__[0])
    offenders: list[str] = []
    for path in sorted(src.rglob("*.py")):
        if path.name == "_netauth.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            where = f"{path.relative_to(src.parent)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Attribute) and node.attr == "is_loopback":
                offenders.append(f"{where} reads .is_loopback")
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and "loopback" in node.name:
                offenders.append(f"{where} defines {node.name}")
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = [t.id for t in targets if isinstance(t, ast.Name)]
                offenders += [f"{where} defines {name}" for name in names if name == "MIN_TOKEN_LENGTH"]
    assert offenders == [], "a network rule outside agentlightning._netauth:\n" + "\n".join(offenders)


def test_a_new_token_never_reads_as_an_option(monkeypatch: pytest.MonkeyPatch) -> None:
    """A token pasted after ``--store-token`` must not start with ``-`` (argparse: "expected one argument")."""
    import secrets

    from agentlightning.netauth import new_token

    drawn = iter(["-starts-like-an-option-0123456789", "--another-0123456789abcdefgh", "Ab3-fine-0123456789"])
    monkeypatch.setattr(secrets, "token_urlsafe", lambda _nbytes: next(drawn))
    assert new_token() == "Ab3-fine-0123456789"
