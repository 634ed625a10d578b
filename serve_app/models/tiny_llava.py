"""Build the default vision-language model locally: a tiny random LLaVA (CLIP tower + Llama).

Like `tiny_chat`, nothing is downloaded: the tokenizer is trained on local text, the weights are
seeded random, and the architecture is the real `LlavaForConditionalGeneration` with a CLIP vision
tower and a Hugging Face `LlavaProcessor`, so vLLM, the multimodal stage and the tests run the same
code paths as with `llava-hf/llava-1.5-7b-hf`. Images are 56x56 pixels, 14-pixel patches: 16 image
tokens each. Run `python -m serve_app.models.tiny_llava models/tiny-llava`.
"""

from __future__ import annotations

from pathlib import Path

from serve_app.models.tiny_chat import SEED, SPECIAL_TOKENS, build_tokenizer, cli, ensure_built, text_config

IMAGE_TOKEN = "<image>"
IMAGE_SIZE = 56
PATCH_SIZE = 14
# Content is a string or OpenAI-style parts; an image part becomes the placeholder the processor expands.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] in ('image', 'image_url') %}<image>\n"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build(out_dir: Path) -> None:
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import (
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    tokenizer = build_tokenizer(out_dir, [*SPECIAL_TOKENS, IMAGE_TOKEN], CHAT_TEMPLATE)
    image_processor = CLIPImageProcessor(
        size={"shortest_edge": IMAGE_SIZE}, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}
    )
    processor = LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=PATCH_SIZE,
        vision_feature_select_strategy="default",
        # The CLS token that the "default" strategy drops: 16 patches -> 16 image tokens, as in LLaVA-1.5.
        num_additional_image_tokens=1,
        chat_template=CHAT_TEMPLATE,
    )
    processor.save_pretrained(str(out_dir))
    vision = CLIPVisionConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=IMAGE_SIZE,
        patch_size=PATCH_SIZE,
        projection_dim=64,
    )
    config = LlavaConfig(
        vision_config=vision,
        text_config=text_config(tokenizer),
        image_token_index=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        vision_feature_select_strategy="default",
        vision_feature_layer=-1,
    )
    torch.manual_seed(SEED)
    model = LlavaForConditionalGeneration(config)
    model.to(torch.bfloat16)  # type: ignore[arg-type]  # transformers mis-types its wrapped `to`
    model.save_pretrained(str(out_dir), safe_serialization=True)
    # transformers 5 saves the CLIP tower without its `vision_model.` level; vLLM's loader wants it.
    for shard in out_dir.glob("*.safetensors"):
        tensors = load_file(str(shard))
        renamed = {_vllm_name(k): v for k, v in tensors.items()}
        save_file(renamed, str(shard), metadata={"format": "pt"})


def _vllm_name(key: str) -> str:
    prefix = "vision_tower."
    head, sep, tail = key.partition(prefix)
    if not sep or tail.startswith("vision_model."):
        return key
    return f"{head}{prefix}vision_model.{tail}"


def ensure_tiny_llava_model(out_dir: str | Path) -> Path:
    return ensure_built(out_dir, build)


def main() -> None:
    cli(__doc__, "models/tiny-llava", ensure_tiny_llava_model)


if __name__ == "__main__":
    main()
