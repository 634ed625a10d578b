"""Hostile requests: each must get a 4xx OpenAI error, and the server must serve the next good request.

Data only; tests/unit/test_hostile_input.py sends every case to the in-process apps, and
tests/integration/test_hostile_input.py sends those marked `integration` to the real graph. The cases
hold for both configs: prompts and inputs are too long for either, sizes come from the defaults.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from typing import Any, Literal

from PIL import Image

from serve_app.config import LimitsConfig
from tests.unit.media_support import blank_bilevel_png, data_url

App = Literal["text", "vision", "speech"]
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
SPEECH = "/v1/audio/speech"
HI = [{"role": "user", "content": "hi"}]
LONG_TEXT = "word " * 6000  # ~6k tokens: over the unit (128) and the shipped (4096) context
INT64_OVER = 2**64


@dataclass(frozen=True)
class HostileCase:
    name: str
    app: App
    path: str
    body: Any  # a JSON value, or bytes sent as they are
    status: int = 400
    code: str | int | None = None  # the error's `code`, checked when given
    method: str = "POST"
    integration: bool = False  # also sent to the real graph

    def content(self) -> bytes:
        return self.body if isinstance(self.body, bytes) else json.dumps(self.body).encode()


def png(size: tuple[int, int] = (8, 8)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, (200, 30, 30)).save(buffer, "PNG")
    return buffer.getvalue()


def _image_chat(*urls: str) -> dict[str, Any]:
    parts: list[dict[str, Any]] = [{"type": "text", "text": "What is this?"}]
    parts += [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    return {"messages": [{"role": "user", "content": parts}], "max_tokens": 2}


def _chat(**fields: Any) -> dict[str, Any]:
    return {"messages": HI, "max_tokens": 2} | fields


def _speech(**fields: Any) -> dict[str, Any]:
    return {"input": "Hello there.", "voice": "tara"} | fields


def _raw_chat(fields: str) -> bytes:
    return b'{"messages": [{"role": "user", "content": "hi"}], ' + fields.encode() + b"}"


def _cases() -> list[HostileCase]:
    text: list[tuple[str, str, Any, int, str | int | None, bool]] = [
        # malformed JSON
        ("json-truncated", CHAT, b'{"messages": [', 400, None, True),
        ("json-trailing-garbage", CHAT, b'{"messages": []} x', 400, None, False),
        ("json-empty-body", CHAT, b"", 400, None, True),
        ("json-null", CHAT, b"null", 400, None, False),
        ("json-array", CHAT, [HI], 400, None, False),
        ("json-deep-nesting", CHAT, b"[" * 100_000, 400, None, True),
        ("json-huge-int-literal", CHAT, _raw_chat('"max_tokens": ' + "9" * 5000), 400, None, False),
        ("invalid-utf8", CHAT, b'{"messages": [{"role": "user", "content": "\xff\xfe\x80"}]}', 400, None, True),
        ("lone-surrogate", CHAT, _chat(messages=[{"role": "user", "content": "\ud800"}]), 400, None, True),
        ("lone-surrogate-prompt", COMPLETIONS, {"prompt": "a\udfffb"}, 400, None, False),
        ("lone-surrogate-tokenize", "/tokenize", {"prompt": "\ud83d"}, 400, None, False),
        # wrong types
        ("type-max-tokens-string", CHAT, _chat(max_tokens="5"), 400, None, True),
        ("type-messages-string", CHAT, {"messages": "hi"}, 400, None, False),
        ("type-temperature-string", CHAT, _chat(temperature="hot"), 400, None, False),
        ("type-stream-string", CHAT, _chat(stream="yes"), 400, None, False),
        ("type-n-float", CHAT, _chat(n=1.5), 400, None, False),
        ("type-n-bool", CHAT, _chat(n=True), 400, None, False),
        ("type-content-int", CHAT, {"messages": [{"role": "user", "content": 5}]}, 400, None, True),
        ("type-stop-int", CHAT, _chat(stop=5), 400, None, False),
        ("type-model-int", CHAT, _chat(model=5), 400, None, False),
        ("type-prompt-dict", COMPLETIONS, {"prompt": {"text": "hi"}}, 400, None, False),
        ("type-tokens-string", "/detokenize", {"tokens": "1 2"}, 400, None, False),
        # unknown fields (rejected as OpenAI does; see serve_app/ingress/protocol.py)
        ("unknown-top-level", CHAT, _chat(max_token=5), 400, None, True),
        ("unknown-in-message", CHAT, {"messages": [{"role": "user", "content": "hi", "mood": "x"}]}, 400, None, False),
        ("unknown-stream-option", CHAT, _chat(stream=True, stream_options={"x": 1}), 400, None, False),
        ("unknown-tokenize", "/tokenize", {"prompt": "hi", "extra": 1}, 400, None, False),
        # huge numbers
        ("huge-max-tokens", CHAT, _chat(max_tokens=10**6), 400, None, True),
        ("huge-max-tokens-int64", CHAT, _chat(max_tokens=INT64_OVER), 400, None, True),
        ("huge-max-completion-tokens", CHAT, _chat(max_completion_tokens=INT64_OVER), 400, None, False),
        ("huge-n", CHAT, _chat(n=10**6), 400, None, True),
        ("huge-n-int64", CHAT, _chat(n=INT64_OVER), 400, None, False),
        ("huge-seed", CHAT, _chat(seed=INT64_OVER), 400, None, True),
        ("huge-top-k", CHAT, _chat(top_k=INT64_OVER), 400, None, False),
        ("huge-min-tokens", CHAT, _chat(min_tokens=INT64_OVER), 400, None, False),
        ("huge-stop-token-id", CHAT, _chat(stop_token_ids=[INT64_OVER]), 400, None, True),
        ("huge-prompt-token", COMPLETIONS, {"prompt": [INT64_OVER]}, 400, None, True),
        ("huge-detokenize-token", "/detokenize", {"tokens": [INT64_OVER]}, 400, None, False),
        ("huge-logprobs", COMPLETIONS, {"prompt": "hi", "logprobs": 10**9}, 400, None, False),
        ("huge-truncate", CHAT, _chat(truncate_prompt_tokens=INT64_OVER), 400, None, False),
        ("huge-best-of", COMPLETIONS, {"prompt": "hi", "best_of": INT64_OVER}, 400, None, False),
        # negative values
        ("negative-max-tokens", CHAT, _chat(max_tokens=-1), 400, None, True),
        ("negative-n", CHAT, _chat(n=-1), 400, None, False),
        ("negative-temperature", CHAT, _chat(temperature=-0.5), 400, None, False),
        ("negative-min-tokens", CHAT, _chat(min_tokens=-5), 400, None, False),
        ("negative-stop-token-id", CHAT, _chat(stop_token_ids=[-1]), 400, None, True),
        ("negative-prompt-token", COMPLETIONS, {"prompt": [-1]}, 400, None, True),
        ("negative-top-logprobs", CHAT, _chat(logprobs=True, top_logprobs=-1), 400, None, False),
        ("negative-truncate", CHAT, _chat(truncate_prompt_tokens=-2), 400, None, False),
        # NaN and infinity (Python's JSON parser accepts these literals)
        ("nan-temperature", CHAT, _raw_chat('"temperature": NaN'), 400, None, True),
        ("inf-top-p", CHAT, _raw_chat('"top_p": Infinity'), 400, None, True),
        ("neg-inf-presence", CHAT, _raw_chat('"presence_penalty": -Infinity'), 400, None, False),
        ("overflow-float", CHAT, _raw_chat('"frequency_penalty": 1e400'), 400, None, False),
        ("nan-max-tokens", CHAT, _raw_chat('"max_tokens": NaN'), 400, None, False),
        ("nan-repetition", COMPLETIONS, b'{"prompt": "hi", "repetition_penalty": NaN}', 400, None, False),
        # empty messages and content
        ("empty-messages", CHAT, {"messages": []}, 400, None, True),
        ("missing-messages", CHAT, {}, 400, None, False),
        ("empty-content-list", CHAT, {"messages": [{"role": "user", "content": []}]}, 400, None, True),
        ("missing-content", CHAT, {"messages": [{"role": "user"}]}, 400, None, False),
        ("empty-prompt", COMPLETIONS, {"prompt": ""}, 400, None, True),
        ("empty-prompt-list", COMPLETIONS, {"prompt": []}, 400, None, False),
        ("empty-tokenize", "/tokenize", {}, 400, None, False),
        # wrong roles
        ("role-unknown", CHAT, {"messages": [{"role": "wizard", "content": "x"}]}, 400, None, True),
        ("role-tool", CHAT, {"messages": [{"role": "tool", "content": "x"}]}, 400, None, False),
        ("role-int", CHAT, {"messages": [{"role": 1, "content": "x"}]}, 400, None, False),
        ("role-missing", CHAT, {"messages": [{"content": "x"}]}, 400, None, False),
        # prompt beyond the context
        ("prompt-over-context", CHAT, _chat(messages=[{"role": "user", "content": LONG_TEXT}]), 400,
         "context_length_exceeded", True),
        ("prompt-over-context-stream", CHAT, _chat(messages=[{"role": "user", "content": LONG_TEXT}], stream=True),
         400, "context_length_exceeded", True),
        ("prompt-over-context-completion", COMPLETIONS, {"prompt": LONG_TEXT}, 400, None, True),
        ("too-many-prompts", COMPLETIONS, {"prompt": ["hi"] * 10_000}, 400, None, False),
        # template injection: a client's own Jinja template or apply_chat_template options
        ("template-override", CHAT, _chat(chat_template_kwargs={"chat_template": "{{ 7 * 7 }}"}), 400, None, True),
        ("template-tokenize", "/tokenize", {"messages": HI, "chat_template_kwargs": {"tokenize": True}}, 400, None,
         False),
        # oversized body, unknown model, unknown route, wrong method
        ("oversized-body", CHAT, b" " * (LimitsConfig().max_request_bytes + 1), 413, "request_too_large", True),
        ("unknown-model", CHAT, _chat(model="gpt-4"), 404, "model_not_found", True),
        ("image-on-text-model", CHAT, _image_chat(data_url(png())), 400, "model_not_multimodal", True),
    ]  # fmt: skip
    cases = [HostileCase(n, "text", p, b, s, c, integration=i) for n, p, b, s, c, i in text]
    cases += [
        HostileCase("unknown-route", "text", "/v1/nope", {}, 404, integration=True),
        HostileCase("wrong-method", "text", CHAT, b"", 405, method="GET", integration=True),
    ]
    bomb = blank_bilevel_png(30_000, 30_000)  # 900 M pixels in ~100 kB
    vision: list[tuple[str, Any, str | None, bool]] = [
        ("bad-base64", _image_chat("data:image/png;base64,@@not base64@@"), "invalid_base64", True),
        ("not-an-image", _image_chat(data_url(b"just some text, not pixels")), "invalid_image", True),
        ("truncated-png", _image_chat(data_url(png()[:40])), "invalid_image", True),
        ("image-bomb", _image_chat(data_url(bomb)), "image_too_large", True),
        ("too-many-images", _image_chat(*[data_url(png())] * 5), "too_many_images", True),
        ("url-loopback", _image_chat("http://127.0.0.1:1/x.png"), "url_not_allowed", True),
        ("url-metadata", _image_chat("http://169.254.169.254/latest/meta-data"), "url_not_allowed", False),
        ("url-file", _image_chat("file:///etc/passwd"), "url_not_allowed", True),
        ("url-scheme", _image_chat("ftp://example.com/x.png"), "url_not_allowed", False),
        ("image-url-unknown-field", {"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": data_url(png()), "x": 1}}]}]}, None, False),
        ("image-part-unknown-type", {"messages": [{"role": "user", "content": [{"type": "video", "url": "x"}]}]},
         None, False),
    ]  # fmt: skip
    cases += [HostileCase(n, "vision", CHAT, b, 400, c, integration=i) for n, b, c, i in vision]
    speech: list[tuple[str, Any, bool]] = [
        ("speech-unknown-voice", _speech(voice="nobody"), True),
        ("speech-voice-int", _speech(voice=5), False),
        ("speech-empty-input", _speech(input=""), True),
        ("speech-blank-input", _speech(input="   "), False),
        ("speech-input-too-long", _speech(input="a" * 20_000), True),
        ("speech-speed-zero", _speech(speed=0), False),
        ("speech-speed-unsupported", _speech(speed=2.0), True),
        ("speech-speed-nan", b'{"input": "hi", "voice": "tara", "speed": NaN}', True),
        ("speech-format-ogg", _speech(response_format="ogg"), True),  # a container, not a response_format
        ("speech-stream-format", _speech(stream=True, stream_format="xml"), False),
        ("speech-instructions", _speech(instructions="whisper"), False),
        ("speech-unknown-field", _speech(pitch=3), True),
        ("speech-missing-input", {"voice": "tara"}, False),
        ("speech-lone-surrogate", _speech(input="\udc80"), True),
    ]
    cases += [HostileCase(n, "speech", SPEECH, b, 400, integration=i) for n, b, i in speech]
    cases.append(HostileCase("speech-on-text-model", "text", SPEECH, _speech(), 400, "model_not_tts", integration=True))
    return cases


CASES = _cases()
ERROR_KEYS = {"message", "type", "param", "code"}


def check_error(case: HostileCase, status: int, body: bytes) -> None:
    """Asserts the answer to `case`: its 4xx status and the OpenAI error shape."""
    assert status == case.status, (case.name, status, body[:300])
    payload = json.loads(body)
    assert set(payload) == {"error"}, payload
    error = payload["error"]
    assert set(error) == ERROR_KEYS, error
    assert isinstance(error["message"], str) and error["message"], error
    assert isinstance(error["type"], str) and error["type"], error
    assert error["param"] is None or isinstance(error["param"], str), error
    if case.code is not None:
        assert error["code"] == case.code, error
