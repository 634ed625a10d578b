"""Locust scenarios for the OpenAI API: text chat, long-prompt chat, image chat and text to speech.
Each user sends streamed requests back to back, like one slot of fixed concurrency.

    locust -f load/locustfile.py --host http://127.0.0.1:8000                      # web UI, :8089
    locust -f load/locustfile.py --host http://127.0.0.1:8000 --headless -u 8 -r 2 -t 60s TextChatUser
    locust -f load/locustfile.py --host http://127.0.0.1:8000 --headless -u 4 -t 30s LongPromptChatUser \\
        --long-fractions 0.9,1.5
    locust -f load/locustfile.py --host http://127.0.0.1:8000 --headless -u 4 -t 30s ImageChatUser \\
        --images-per-request 2 --image-repeat 0.5
    locust -f load/locustfile.py --host http://127.0.0.1:8000 --headless -u 8 -t 60s SpeechUser \\
        --tts-input-chars 120 --voice tara --underrun-threshold-ms 100

Rows in locust's statistics (and --csv files):
- `chat`, `long chat near limit`, `image chat`: the whole streamed request, sent -> [DONE];
  `long chat over limit`: time to the expected 400 (the prompt is tokenized, then refused).
- `TTFT <row>`, `TPOT <row>`: as `python -m load.bench` measures them (see load/bench/metrics.py).
- `STAGE <row>: tokenizer`, `STAGE <row>: llm_first_chunk`, `STAGE image chat: multimodal`,
  `STAGE speech: vocoder_first_chunk`: the server's X-*-Time headers (load/bench/sse.py).
- `speech`: the whole audio stream; `TTFA speech`: to the first audio; `UNDERRUN speech`: each stream's
  underrun (metrics.underrun_s), a failure when above --underrun-threshold-ms, so that the row's
  failure share is the underrun rate. A 503 (server at capacity) fails `speech` as "rejected".
Prompts are built at test start like the bench's: --input-len, --output-len, --long-fractions, and
for image chat --images-per-request, --image-size, --image-format, --image-repeat (load/bench/images.py;
its images are encoded then too, not while requests are timed); speech takes --tts-input-chars and
--voice (load/bench/tts.py). Chat users need the host's /tokenize, speech users do not.
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

from load.bench import images, metrics, tts
from load.bench.client import RequestRecord, request_body
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
    """The datasets of the user classes that run (the others may not suit the host, or take seconds)."""

    model: str
    max_model_len: int | None = None
    text: WordDataset | None = None
    long: WordDataset | None = None
    image: images.ImageDataset | None = None
    speech: tts.SpeechDataset | None = None


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
    tts.add_options(parser)


@events.test_start.add_listener
def _build_prompts(environment: Environment, **_: Any) -> None:
    if not environment.host or environment.parsed_options is None:
        raise ValueError("give the server with --host (or in the web UI)")
    opts = environment.parsed_options
    host = environment.host.rstrip("/")
    classes = set(environment.user_classes)
    with httpx.Client(timeout=60) as client:
        # One model for the run: the speech model for speech users, a vision model for image chat.
        needs = "speech" if SpeechUser in classes else "vision" if ImageChatUser in classes else None
        model = fetch_model(client, host, needs)
        speech = tts.from_options(opts) if SpeechUser in classes else None
        if not classes & {TextChatUser, LongPromptChatUser, ImageChatUser}:
            _prompts[:] = [Prompts(model.name, speech=speech)]
            return
        words = tuple(single_token_words(client, host, model.name))
    if model.max_model_len is None:
        raise ValueError(f"{host}/v1/models gives no max_model_len: long prompts cannot be sized")
    fractions = [float(f) for f in str(opts.long_fractions).split(",")]
    long_lens = long_input_lens(model.max_model_len, opts.output_len, fractions)
    # The web UI leaves an option without default ("" when left empty) a string.
    input_len = int(opts.input_len) if opts.input_len else None
    image = None
    if ImageChatUser in classes:
        image = images.from_options(opts, WordDataset(words, (input_len or IMAGE_TEXT_LEN,), opts.output_len))
    _prompts[:] = [
        Prompts(
            model.name,
            model.max_model_len,
            WordDataset(words, (input_len or TEXT_INPUT_LEN,), opts.output_len),
            WordDataset(words, long_lens, opts.output_len),
            image,
            speech,
        )
    ]


class _StreamUser(HttpUser):
    abstract = True
    wait_time = constant(0)

    def record(self, kind: str, name: str, ms: float, exception: Exception | None = None) -> None:
        """A custom row in locust's statistics (TTFT, TPOT, TTFA, underrun, stages); with `exception` the
        sample counts as a failure of the row."""
        self.environment.events.request.fire(
            request_type=kind, name=name, response_time=ms, response_length=0, exception=exception, context={}
        )


class _ChatUser(_StreamUser):
    abstract = True

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
        if not state.content_times:
            return  # served, but its tokens decode to no text: no TTFT to record
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
        text = _prompts[0].text
        assert text is not None  # built at test start whenever a chat class runs
        self.chat("chat", text.prompt(next(self.next_prompt)))


class LongPromptChatUser(_ChatUser):
    """Streamed chat with prompts near the context limit (served) and beyond it (refused with 400)."""

    next_prompt = itertools.count()

    @task
    def long_chat(self) -> None:
        prompts = _prompts[0]
        assert prompts.long is not None and prompts.max_model_len is not None
        prompt = prompts.long.prompt(next(self.next_prompt))
        if prompt.input_len < prompts.max_model_len:
            self.chat("long chat near limit", prompt)
        else:
            self.chat("long chat over limit", prompt, expect_status=400)


class ImageChatUser(_ChatUser):
    """Streamed chat with a short text and generated images (--images-per-request and the other image
    options); the host serves a vision model (the first `GET /v1/models` lists as such), e.g. the graph."""

    next_prompt = itertools.count()

    @task
    def image_chat(self) -> None:
        image = _prompts[0].image
        assert image is not None  # built at test start whenever this class runs
        self.chat("image chat", image.prompt(next(self.next_prompt)))


class Underrun(Exception):
    """A stream whose audio came later than a real-time player needed it, by more than the threshold."""


class SpeechUser(_StreamUser):
    """Streamed text to speech (raw PCM) of --tts-input-chars characters in --voice; the host is a speech
    model's server (the first `GET /v1/models` lists as such), e.g. the graph."""

    next_prompt = itertools.count()

    @task
    def speech(self) -> None:
        prompts = _prompts[0]
        assert prompts.speech is not None  # built at test start whenever this class runs
        prompt = prompts.speech.prompt(next(self.next_prompt))
        body = tts.speech_body(prompts.model, prompt)
        record = RequestRecord(sent_at=time.perf_counter(), input_len=prompt.input_len)
        with self.client.post(tts.SPEECH_PATH, json=body, stream=True, catch_response=True, name="speech") as response:
            for stage, ms in stage_times_ms(response.headers).items():
                self.record("STAGE", f"speech: {stage}", ms)
            if response.status_code == metrics.REJECTED:
                # Not the body: it names a changing count, and each message is a row of locust's failures.
                response.failure("rejected: HTTP 503")
                return
            if response.status_code != 200:
                response.failure(f"HTTP {response.status_code}: {response.text[:200]}")
                return
            audio = tts.AudioStream(tts.sample_rate(response.headers))
            for data in response.iter_content(chunk_size=None):
                audio.feed(len(data), time.perf_counter() - record.sent_at)
            record.latency = time.perf_counter() - record.sent_at
            response.request_meta["response_time"] = record.latency * 1000
            audio.finish(record)
            stream = metrics.speech(record)
            if stream is None:
                response.failure(record.detail)
                return
            response.success()
        self.record("TTFA", "speech", record.content_times[0] * 1000)
        threshold_ms = float(self.environment.parsed_options.underrun_threshold_ms)
        late = Underrun(f"underrun above {threshold_ms:g} ms") if stream.underrun_s * 1000 > threshold_ms else None
        self.record("UNDERRUN", "speech", stream.underrun_s * 1000, late)
