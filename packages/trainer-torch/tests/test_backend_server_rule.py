"""The local backend's HTTP server follows the one network rule of every server (`agentlightning.netauth`): off
loopback a token of 16+ characters, refused with the shared message; with a token, requests without it get a 401."""

from __future__ import annotations

import openai
import pytest
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from agentlightning_torch import BackendServer, LocalBackend, serve_backend

TOKEN = "backend-token-0123456789"


@pytest.mark.parametrize("token", [None, "short-token"])
def test_off_loopback_it_refuses_a_missing_or_short_token_as_every_server_does(
    calc_model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, token: str | None
) -> None:
    backend = LocalBackend(calc_model, tokenizer, model_name="tiny-calc")
    with pytest.raises(ValueError, match=r"refusing to serve the local backend on 0\.0\.0\.0 (without a token|with)"):
        BackendServer(backend, host="0.0.0.0", token=token)
    assert backend._worker is None  # pyright: ignore[reportPrivateUsage]  # refused before anything started


def test_with_a_token_a_request_without_it_gets_a_401(
    calc_model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast
) -> None:
    backend = LocalBackend(calc_model, tokenizer, model_name="tiny-calc")
    server = serve_backend(backend, token=TOKEN)
    try:
        with pytest.raises(openai.AuthenticationError, match="Bearer"):
            openai.OpenAI(base_url=server.base_url, api_key="wrong", max_retries=0).models.list()
        models = openai.OpenAI(base_url=server.base_url, api_key=TOKEN, max_retries=0).models.list()
        assert [m.id for m in models.data] == ["tiny-calc"]
    finally:
        server.stop()
