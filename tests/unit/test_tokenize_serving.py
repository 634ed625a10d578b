"""serve_app/ingress/tokenize/serving.py through the app: `/tokenize` and `/detokenize`."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

MESSAGES = [{"role": "user", "content": "Hello there!"}]


def test_tokenize_prompt(client: TestClient, hf_tokenizer: Any, fake_llm: Any) -> None:
    response = client.post("/tokenize", json={"model": "tiny-chat", "prompt": "Hello world, again"})
    assert response.status_code == 200
    ids = hf_tokenizer.encode("Hello world, again")
    assert response.json() == {"count": len(ids), "max_model_len": 128, "tokens": ids, "token_strs": None}
    assert fake_llm.requests == []


def test_tokenize_returns_token_strs_when_asked(client: TestClient, hf_tokenizer: Any) -> None:
    body = client.post("/tokenize", json={"prompt": "Hello world", "return_token_strs": True}).json()
    assert body["token_strs"] == hf_tokenizer.convert_ids_to_tokens(body["tokens"])
    assert len(body["token_strs"]) == body["count"] > 1


def test_tokenize_messages(client: TestClient, chat_ids: Any) -> None:
    body = client.post("/tokenize", json={"messages": MESSAGES}).json()
    assert body["tokens"] == chat_ids(MESSAGES)
    assert body["count"] == len(chat_ids(MESSAGES))
    body = client.post("/tokenize", json={"messages": MESSAGES, "add_generation_prompt": False}).json()
    assert body["tokens"] == chat_ids(MESSAGES, add_generation_prompt=False)


def test_tokenize_has_no_context_limit(client: TestClient, hf_tokenizer: Any) -> None:
    text = "word " * 200
    body = client.post("/tokenize", json={"prompt": text}).json()
    assert body["count"] == len(hf_tokenizer.encode(text)) > 128
    assert client.post("/tokenize", json={"prompt": ""}).json()["count"] == 0


def test_tokenize_rejects_images(client: TestClient) -> None:
    image = [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]
    response = client.post("/tokenize", json={"messages": [{"role": "user", "content": image}]})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "messages"


def test_detokenize(client: TestClient, hf_tokenizer: Any) -> None:
    ids = hf_tokenizer.encode("Round trip: naïve café!")
    response = client.post("/detokenize", json={"model": "tiny-chat", "tokens": ids})
    assert (response.status_code, response.json()) == (200, {"prompt": "Round trip: naïve café!"})
    assert client.post("/detokenize", json={"tokens": []}).json() == {"prompt": ""}


def test_tokenize_detokenize_round_trip(client: TestClient) -> None:
    tokens = client.post("/tokenize", json={"messages": MESSAGES}).json()["tokens"]
    prompt = client.post("/detokenize", json={"tokens": tokens}).json()["prompt"]
    assert prompt == "<|im_start|>user\nHello there!<|im_end|>\n<|im_start|>assistant\n"
