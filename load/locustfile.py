"""Locust scenarios for the OpenAI API: text chat, long-prompt chat and image chat (TTS comes with its
endpoint). Each user sends streamed requests back to back, like one slot of fixed concurrency.

    locust -f load/locustfile.py --host http://127.0.0.1:8000                      # web UI, :8089
    locust -f load/locustfile.py --host http://127.0.0.1:8000 --headless -u 8 -r 2 -t 60s TextChatUser
    locust -f load/locustfile.py --host http://127.0.0.1:8000 --headless -u 4 -t 30s LongPromptChatUser \\
        --long-fractions 0.9,1.5
    locust -f load/locustfile.py --host http://127.0.0.1:8000/vision --headless -u 4 -t 30s ImageChatUser \\
        --images-per-request 2 --image-repeat 0.5

Rows in locust's statistics (and --csv files):
- `chat`, `long chat near limit`, `image chat`: the whole streamed request, sent -> [DONE];
  `long chat over limit`: time to the expected 400 (the prompt is tokenized, then refused).
- `TTFT <row>`, `TPOT <row>`: as `python -m load.bench` measures them (see load/bench/metrics.py).
- `STAGE <row>: tokenizer`, `STAGE <row>: llm_first_chunk`, `STAGE image chat: multimodal`: the
  server's X-Tokenizer-Time, X-LLM-First-Chunk-Time and X-Multimodal-Time headers.
Prompts are built at test start like the bench's: --input-len, --output-len, --long-fractions, and
for image chat --images-per-request, --image-size, --image-format, --image-repeat (load/bench/images.py;
its images are encoded then too, not while requests are timed).
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass
from typing import Any

import httpx
from locust import HttpUser, constant, events, task
from locust.env import Environment

from load.bench import images
from load.bench.client import request_body
from load.bench.datasets import (
    IMAGE_TEXT_LEN,
    TEXT_INPUT_LEN,
    Prompt,
    WordDataset,
    fetch_model,
    long_input_lens,
    single_token_words,
)
from load.bench.sse import StreamState, stage_times_ms


@dataclass(frozen=True)
class Prompts:
    model: str
    max_model_len: int
    text: WordDataset
    long: WordDataset
    image: images.ImageDataset | None  # only when ImageChatUser runs: its pictures take seconds to encode


# Built when a test starts: the host (and in the web UI the options) are only known then.
_prompts: list[Prompts] = []
# Locust logs at INFO: httpx would log each of the start-up /tokenize calls.
logging.getLogger("httpx").setLevel(logging.WARNING)


@events.init_command_line_parser.add_listener
def _add_options(parser: Any) -> None:
    parser.add_argument(
        "--input-len", type=int, help=f"prompt tokens (default {TEXT_INPUT_LEN}; image chat: {IMAGE_TEXT_LEN} of text)"
    )
    parser.add_argument("--output-len", type=int, default=32, help="tokens generated per request (ignore_eos)")
    parser.add_argument(
        "--long-fractions", default="0.9,1.5",
        help="long chat: prompt lengths as fractions of max_model_len, comma-separated; from 1 on they must be refused",
    )  # fmt: skip
    images.add_options(parser)


@events.test_start.add_listener
def _build_prompts(environment: Environment, **_: Any) -> None:
    if not environment.host or environment.parsed_options is None:
        raise ValueError("give the server with --host (or in the web UI)")
    opts = environment.parsed_options
    host = environment.host.rstrip("/")
    with httpx.Client(timeout=60) as client:
        model = fetch_model(client, host)
        words = tuple(single_token_words(client, host, model.name))
    if model.max_model_len is None:
        raise ValueError(f"{host}/v1/models gives no max_model_len: long prompts cannot be sized")
    fractions = [float(f) for f in str(opts.long_fractions).split(",")]
    long_lens = long_input_lens(model.max_model_len, opts.output_len, fractions)
    # The web UI leaves an option without default ("" when left empty) a string.
    input_len = int(opts.input_len) if opts.input_len else None
    image = None
    if ImageChatUser in environment.user_classes:
        image = images.from_options(opts, WordDataset(words, (input_len or IMAGE_TEXT_LEN,), opts.output_len))
    _prompts[:] = [
        Prompts(
            model.name,
            model.max_model_len,
            WordDataset(words, (input_len or TEXT_INPUT_LEN,), opts.output_len),
            WordDataset(words, long_lens, opts.output_len),
            image,
        )
    ]


class _ChatUser(HttpUser):
    abstract = True
    wait_time = constant(0)

    def record(self, kind: str, name: str, ms: float) -> None:
        """A custom row in locust's statistics: what the stats and charts show for TTFT, TPOT, stages."""
        self.environment.events.request.fire(
            request_type=kind, name=name, response_time=ms, response_length=0, exception=None, context={}
        )

    def chat(self, name: str, prompt: Prompt, expect_status: int = 200) -> None:
        start = time.perf_counter()
        body = request_body("chat", _prompts[0].model, prompt)
        with self.client.post(
            "/v1/chat/completions", json=body, stream=True, catch_response=True, name=name
        ) as response:
            for stage, ms in stage_times_ms(response.headers).items():
                self.record("STAGE", f"{name}: {stage}", ms)
            if response.status_code != expect_status:
                response.failure(f"HTTP {response.status_code}, expected {expect_status}: {response.text[:200]}")
                return
            if expect_status != 200:
                response.success()
                return
            state = StreamState()
            for line in response.iter_lines():
                state.feed(line.decode(), time.perf_counter() - start)
            e2el_s = time.perf_counter() - start
            # Locust stops the clock at the headers of a streamed response; the row should show E2EL.
            response.request_meta["response_time"] = e2el_s * 1000
            failure = state.failure()
            if failure is not None:
                response.failure(failure)
                return
            response.success()
        self.record("TTFT", name, state.content_times[0] * 1000)
        if state.output_tokens is not None and state.output_tokens > 1:
            tpot_s = (e2el_s - state.content_times[0]) / (state.output_tokens - 1)
            self.record("TPOT", name, tpot_s * 1000)


class TextChatUser(_ChatUser):
    """Streamed chat with --input-len random prompt tokens and --output-len output tokens."""

    # Shared by this class's users: no prompt is sent twice (a prefix-cache hit would flatter TTFT).
    next_prompt = itertools.count()

    @task
    def text_chat(self) -> None:
        self.chat("chat", _prompts[0].text.prompt(next(self.next_prompt)))


class LongPromptChatUser(_ChatUser):
    """Streamed chat with prompts near the context limit (served) and beyond it (refused with 400)."""

    next_prompt = itertools.count()

    @task
    def long_chat(self) -> None:
        prompts = _prompts[0]
        prompt = prompts.long.prompt(next(self.next_prompt))
        if prompt.input_len < prompts.max_model_len:
            self.chat("long chat near limit", prompt)
        else:
            self.chat("long chat over limit", prompt, expect_status=400)


class ImageChatUser(_ChatUser):
    """Streamed chat with a short text and generated images (--images-per-request and the other image
    options); the host is a vision model's server, e.g. the graph's vision app at /vision."""

    next_prompt = itertools.count()

    @task
    def image_chat(self) -> None:
        image = _prompts[0].image
        assert image is not None  # built at test start whenever this class runs
        self.chat("image chat", image.prompt(next(self.next_prompt)))
