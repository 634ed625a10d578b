"""Chat prompts from OpenAI messages: what `/v1/chat/completions` generates from and `/tokenize` counts."""

from __future__ import annotations

from typing import Any

from serve_app.ingress.protocol import ChatMessage, ImagePart
from serve_app.messages import ChatPrompt


def split_images(chat: list[ChatMessage]) -> tuple[list[dict[str, Any]], list[str]]:
    """The messages with each image part replaced by an `{"type": "image"}` placeholder, and the image
    URLs in prompt order: the (possibly megabytes of) image data goes to the multimodal stage only."""
    messages: list[dict[str, Any]] = []
    urls: list[str] = []
    for message in chat:
        dumped = message.model_dump(exclude_none=True)
        if isinstance(message.content, list):
            parts: list[dict[str, Any]] = []
            for part in message.content:
                if isinstance(part, ImagePart):
                    urls.append(part.image_url.url)
                    parts.append({"type": "image"})
                else:
                    parts.append(part.model_dump(exclude_none=True))
            dumped["content"] = parts
        messages.append(dumped)
    return messages, urls


def chat_prompt(
    chat: list[ChatMessage],
    *,
    add_generation_prompt: bool,
    continue_final_message: bool,
    chat_template_kwargs: dict[str, Any] | None,
) -> tuple[ChatPrompt, list[str]]:
    """The tokenizer stage's prompt for `chat`, and its image URLs (see `split_images`)."""
    messages, urls = split_images(chat)
    prompt = ChatPrompt(
        messages=messages,
        add_generation_prompt=add_generation_prompt,
        continue_final_message=continue_final_message,
        chat_template_kwargs=dict(chat_template_kwargs or {}),
    )
    return prompt, urls
