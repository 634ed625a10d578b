"""Image chat through the real graph (tiny-llava: ingress -> multimodal -> tokenizer -> llm) with the
`openai` client, and image URLs fetched, or refused, from local HTTP servers."""

from __future__ import annotations

import base64
import io
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, cast

import httpx
import openai
import pytest
from PIL import Image

from tests.integration.support import ALLOWED_LOOPBACK, error_fields

TOKENS_PER_IMAGE = 16  # 56x56 pixels in 14-pixel patches


def jpeg(colour: tuple[int, int, int], size: tuple[int, int] = (640, 480)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, "JPEG")
    return buffer.getvalue()


def data_url(data: bytes, mime: str = "image/jpeg") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def image_messages(*urls: str, text: str = "What is in this image?") -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = [{"type": "text", "text": text}]
    parts += [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    return [{"role": "user", "content": parts}]


@pytest.fixture(scope="module")
def vision_tokenizer(tiny_vision_model: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_vision_model))


def expected_prompt_tokens(tokenizer: Any, messages: list[dict[str, Any]], images: int) -> int:
    placeholders = [
        {**m, "content": [p if p["type"] == "text" else {"type": "image"} for p in m["content"]]} for m in messages
    ]
    text = tokenizer.apply_chat_template(placeholders, tokenize=False, add_generation_prompt=True)
    return len(tokenizer.encode(text, add_special_tokens=False)) + images * (TOKENS_PER_IMAGE - 1)


def test_image_chat_non_streaming(vision_client: Any, vision_tokenizer: Any) -> None:
    messages = image_messages(data_url(jpeg((200, 30, 30))))
    raw = vision_client.chat.completions.with_raw_response.create(
        model="tiny-llava", messages=messages, max_tokens=5, temperature=0
    )
    completion = raw.parse()
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage.completion_tokens == 5
    assert completion.usage.prompt_tokens == expected_prompt_tokens(vision_tokenizer, messages, 1)
    assert float(raw.headers["x-multimodal-time"]) > 0


def test_image_chat_streaming_with_two_images(vision_client: Any, vision_tokenizer: Any) -> None:
    messages = image_messages(data_url(jpeg((0, 90, 0))), data_url(jpeg((9, 9, 200), (300, 900))))
    stream = vision_client.chat.completions.create(
        model="tiny-llava", messages=messages, max_tokens=6, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert chunks[-1].usage.completion_tokens == 6
    assert chunks[-1].usage.prompt_tokens == expected_prompt_tokens(vision_tokenizer, messages, 2)


def test_text_chat_on_the_vision_model(vision_client: Any) -> None:
    completion = vision_client.chat.completions.create(
        model="tiny-llava", messages=[{"role": "user", "content": "Hi"}], max_tokens=3
    )
    assert completion.usage.completion_tokens == 3


def test_priority_on_the_vision_model_and_not_on_the_text_model(vision_client: Any, client: Any) -> None:
    # The default config runs tiny-llava's engine with `scheduling_policy: priority`, tiny-chat's in
    # arrival order: vLLM's engine takes the priority on one and the ingress refuses it for the other.
    messages = [{"role": "user", "content": "Hi"}]
    urgent = vision_client.chat.completions.create(
        model="tiny-llava", messages=messages, max_tokens=2, extra_body={"priority": -1}
    )
    assert urgent.usage.completion_tokens == 2
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny-chat", messages=messages, max_tokens=2, extra_body={"priority": -1})
    assert error_fields(info.value)["param"] == "priority"


def test_repeated_images_hit_the_cache(vision_client: Any, graph: str) -> None:
    url = data_url(jpeg((1, 2, 3)))
    for _ in range(2):
        vision_client.chat.completions.create(model="tiny-llava", messages=image_messages(url), max_tokens=1)
    metrics = httpx.get(f"{graph}/metrics", timeout=10).text
    hits = [
        line
        for line in metrics.splitlines()
        if line.startswith('serve_graph_image_cache_total{model="tiny-llava",result="hit"}')
    ]
    assert hits and float(hits[0].split()[-1]) >= 1


BAD_IMAGES = [
    ("data:image/png;base64,@@@not-base64@@@", "invalid_base64"),
    (data_url(b"<svg xmlns='http://www.w3.org/2000/svg'/>", "image/png"), "invalid_image"),
    (data_url(jpeg((5, 5, 5))[:400]), "invalid_image"),
    ("ftp://example.com/cat.png", "url_not_allowed"),
    ("http://169.254.169.254/latest/meta-data/", "url_not_allowed"),
]


@pytest.mark.parametrize(("url", "code"), BAD_IMAGES, ids=[code for _, code in BAD_IMAGES])
def test_bad_images_are_400_and_the_graph_stays_healthy(vision_client: Any, graph: str, url: str, code: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        vision_client.chat.completions.create(model="tiny-llava", messages=image_messages(url), max_tokens=1)
    assert error_fields(info.value)["code"] == code
    assert httpx.get(f"{graph}/health", timeout=5).status_code == 200


def test_too_many_images(vision_client: Any) -> None:
    url = data_url(jpeg((7, 7, 7), (64, 64)))
    with pytest.raises(openai.BadRequestError) as info:
        vision_client.chat.completions.create(model="tiny-llava", messages=image_messages(*[url] * 5), max_tokens=1)
    assert error_fields(info.value)["code"] == "too_many_images"


def test_the_text_model_refuses_images(client: Any) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model="tiny-chat", messages=image_messages(data_url(jpeg((1, 1, 1)))), max_tokens=1
        )
    assert error_fields(info.value)["code"] == "model_not_multimodal"


class _ImageServer(BaseHTTPRequestHandler):
    body = jpeg((250, 250, 0))
    hits = 0

    def do_GET(self) -> None:
        type(self).hits += 1
        self.send_response(200)
        self.send_header("Content-Type", "image/jpeg")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: Any) -> None:
        return None


@pytest.fixture(scope="module")
def image_servers() -> Iterator[dict[str, str]]:
    """The same image served on 127.0.0.1 (refused by default) and on the allow-listed 127.0.0.2."""
    servers = [ThreadingHTTPServer((host, 0), _ImageServer) for host in ("127.0.0.1", ALLOWED_LOOPBACK)]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    addresses = [cast(tuple[str, int], server.server_address) for server in servers]  # AF_INET: (host, port)
    yield {host: f"http://{host}:{port}/photo.jpg" for host, port in addresses}
    for server in servers:
        server.shutdown()
        server.server_close()


def test_loopback_urls_are_refused_by_default(vision_client: Any, image_servers: dict[str, str]) -> None:
    before = _ImageServer.hits
    with pytest.raises(openai.BadRequestError) as info:
        vision_client.chat.completions.create(
            model="tiny-llava", messages=image_messages(image_servers["127.0.0.1"]), max_tokens=1
        )
    assert error_fields(info.value)["code"] == "url_not_allowed"
    assert _ImageServer.hits == before  # refused before connecting


def test_allow_listed_hosts_are_fetched(vision_client: Any, image_servers: dict[str, str]) -> None:
    before = _ImageServer.hits
    completion = vision_client.chat.completions.create(
        model="tiny-llava", messages=image_messages(image_servers[ALLOWED_LOOPBACK]), max_tokens=2
    )
    assert completion.usage.completion_tokens == 2
    assert _ImageServer.hits == before + 1
