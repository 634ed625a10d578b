"""Prompts with an exact token count, checked against the real tokenizer through the ingress app."""

from __future__ import annotations

from typing import Any, cast

import httpx
import pytest
from fastapi.testclient import TestClient

from load.bench.datasets import CAPABILITY, WORDS, WordDataset, fetch_model, long_input_lens, single_token_words
from tests.unit.conftest import MAX_MODEL_LEN, MODEL_NAME


def http(client: TestClient) -> httpx.Client:
    """The app's TestClient where the bench takes an `httpx.Client`: starlette's TestClient subclasses
    `httpx2.Client` (a separate package) when httpx2 is installed, as here."""
    return cast(httpx.Client, client)


def test_fetch_model(client: TestClient) -> None:
    model = fetch_model(http(client), "")
    assert (model.name, model.max_model_len) == (MODEL_NAME, MAX_MODEL_LEN)


def test_fetch_model_picks_the_one_with_the_capability_a_dataset_needs() -> None:
    cards = [{"id": "text", "capabilities": ["chat"]}, {"id": "eyes", "capabilities": ["chat", "vision"]},
             {"id": "voice", "capabilities": ["chat", "speech"]}]  # fmt: skip
    client = httpx.Client(transport=httpx.MockTransport(lambda _: httpx.Response(200, json={"data": cards})))
    assert fetch_model(client, "http://graph").name == "text"
    assert fetch_model(client, "http://graph", CAPABILITY["image"]).name == "eyes"
    assert fetch_model(client, "http://graph", CAPABILITY["tts"]).name == "voice"
    listed = httpx.Client(transport=httpx.MockTransport(lambda _: httpx.Response(200, json={"data": [{"id": "v"}]})))
    assert fetch_model(listed, "http://vllm", "vision").name == "v"  # a server that lists no capabilities


def test_prompts_have_exactly_input_len_tokens(client: TestClient, hf_tokenizer: Any) -> None:
    words = single_token_words(http(client), "", MODEL_NAME)
    assert set(words) <= set(WORDS) and len(words) >= 16
    dataset = WordDataset(tuple(words), (1, 57, 300), output_len=8, seed=3)
    for i in range(6):
        prompt = dataset.prompt(i)
        assert prompt.input_len == (1, 57, 300)[i % 3]
        assert len(hf_tokenizer.encode(prompt.text, add_special_tokens=False)) == prompt.input_len
        assert prompt.output_len == 8
    assert dataset.prompt(4) == dataset.prompt(4)
    assert dataset.prompt(4) != dataset.prompt(7)  # same length, different words


def test_too_few_single_token_words(client: TestClient) -> None:
    with pytest.raises(RuntimeError, match="only 0 of 2 words"):
        single_token_words(http(client), "", MODEL_NAME, words=["antidisestablishmentarianism", "zzqxj"])


def test_long_input_lens() -> None:
    # Below 1: capped so that prompt, output and a chat template still fit; from 1 on: beyond the context.
    assert long_input_lens(4096, 32, [0.5, 0.99, 1.0, 2.0]) == (2048, 4096 - 32 - 64, 4096, 8192)
    with pytest.raises(ValueError, match="no room"):
        long_input_lens(64, 8, [0.5])
