"""Tokenizer throughput's parts, on the tiny model: options, prompts, the three paths agreeing on the
work, a clear failure when the graph is not there, and the result document."""

from __future__ import annotations

import json
import socket
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from load import tokenizer_throughput as tt
from load.bench.datasets import ModelInfo
from serve_app.stages.tokenizer import TokenizerStage
from tests.unit.conftest import MODEL_NAME


def test_options() -> None:
    opts = tt.parse_args(["--url", "http://127.0.0.1:8000/"])
    assert (opts.url, opts.input_len, opts.threads, opts.concurrency) == ("http://127.0.0.1:8000", 256, None, 16)
    assert tt.parse_args([]).url is None
    with pytest.raises(SystemExit):
        tt.parse_args(["--url", "127.0.0.1:8000"])


def test_conversations_are_one_user_message_of_input_len_words(hf_tokenizer: Any) -> None:
    chats = tt.conversations(hf_tokenizer, MODEL_NAME, count=3, input_len=12, seed=2)
    assert len(chats) == 3
    for chat in chats:
        assert [m["role"] for m in chat] == ["user"]
        assert len(chat[0]["content"].split()) == 12
        assert len(hf_tokenizer.encode(chat[0]["content"], add_special_tokens=False)) == 12
    assert chats[0] != chats[1]


async def test_the_three_paths_do_the_same_work(
    hf_tokenizer: Any, tokenizer_stage: TokenizerStage, client: TestClient
) -> None:
    chats = tt.conversations(hf_tokenizer, MODEL_NAME, count=5, input_len=20)
    tokens, seconds = tt.reference(hf_tokenizer, chats)
    assert tokens > 5 * 20 and seconds > 0
    assert (await tt.staged(tokenizer_stage, chats))[0] == tokens
    transport = httpx.ASGITransport(app=client.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://graph") as http:
        assert (await tt.over_http(http, chats, concurrency=2))[0] == tokens


def test_unreachable_graph_fails_clearly() -> None:
    with socket.socket() as s:  # a port nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(SystemExit, match="no graph answers GET /v1/models"):
        tt.check_graph(f"http://127.0.0.1:{port}", MODEL_NAME)


def test_graph_serving_another_model_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tt, "fetch_model", lambda client, url: ModelInfo("other", None))
    with pytest.raises(SystemExit, match="serves 'other'"):
        tt.check_graph("http://graph", MODEL_NAME)


def test_result_document() -> None:
    opts = tt.parse_args(["--prompts", "100", "--rounds", "2", "--url", "http://g:8000", "--concurrency", "4"])
    paths = {"reference": tt.Measured(200, 20000, 0.1), "stage": tt.Measured(200, 20000, 0.2),
             "graph": tt.Measured(200, 20000, 0.4)}  # fmt: skip
    result = tt.build_result(opts, MODEL_NAME, threads=2, paths=paths)
    assert result["kind"] == "tokenizer_throughput"
    assert (result["tokens_per_prompt"], result["concurrency"]) == (100.0, 4)
    assert result["paths"]["reference"]["prompts_per_s"] == pytest.approx(2000.0)
    assert result["paths"]["stage"]["tokens_per_s"] == pytest.approx(100000.0)
    assert [p["vs_reference"] for p in result["paths"].values()] == pytest.approx([1.0, 0.5, 0.25])
    assert result["paths"]["graph"]["how"] == "POST http://g:8000/tokenize, 4 clients"
    json.dumps(result, allow_nan=False)
