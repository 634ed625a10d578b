"""serve_app/ingress/pipeline/prompts.py: chat messages to the tokenizer's prompt, images kept apart."""

from __future__ import annotations

from serve_app.ingress.pipeline.prompts import chat_prompt
from serve_app.ingress.protocol import ChatMessage


def test_images_become_placeholders_and_urls_in_prompt_order() -> None:
    chat = [
        ChatMessage.model_validate({"role": "system", "content": "Be brief."}),
        ChatMessage.model_validate({"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"}},
            {"type": "text", "text": "and"},
            {"type": "image_url", "image_url": {"url": "https://example.com/b.png"}},
        ]}),
    ]  # fmt: skip
    prompt, urls = chat_prompt(
        chat, add_generation_prompt=False, continue_final_message=True, chat_template_kwargs={"x": 1}
    )
    assert urls == ["data:image/png;base64,AAAA", "https://example.com/b.png"]
    assert prompt.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "and"}, {"type": "image"}]},
    ]
    assert (prompt.add_generation_prompt, prompt.continue_final_message) == (False, True)
    assert prompt.chat_template_kwargs == {"x": 1}
    assert chat_prompt(chat[:1], add_generation_prompt=True, continue_final_message=False,
                       chat_template_kwargs=None)[0].chat_template_kwargs == {}  # fmt: skip
