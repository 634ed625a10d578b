"""Build the default chat model locally: a BPE tokenizer with a chat template and a random Llama.

Nothing can be downloaded from a model hub on the machines this project is developed on, so the
default model is made here, deterministically, from text that ships with Python. It has the real
architecture (LlamaForCausalLM, safetensors, a Hugging Face tokenizer directory) so that vLLM, the
tokenizer stage and every test exercise the same code paths as with a real model; only the weights
are random. Run `python -m serve_app.models.tiny_chat models/tiny-chat`.
"""

from __future__ import annotations

import argparse
import sysconfig
from collections.abc import Callable
from pathlib import Path
from typing import Any

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]
VOCAB_SIZE = 8000
MAX_POSITIONS = 32768
SEED = 1234


def _training_files(limit: int = 400) -> list[str]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(str(p) for p in stdlib.glob("*.py"))
    licenses = Path("/usr/share/common-licenses")
    if licenses.is_dir():
        files += sorted(str(p) for p in licenses.iterdir() if p.is_file())
    return files[:limit]


def build_tokenizer(out_dir: Path, special_tokens: list[str] | None = None, chat_template: str = CHAT_TEMPLATE) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=special_tokens or SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train(_training_files(), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|pad|>",
        unk_token=None,
        model_max_length=MAX_POSITIONS,
    )
    fast.chat_template = chat_template
    fast.save_pretrained(str(out_dir))
    return fast


def text_config(tokenizer: Any) -> Any:
    """The language model's shape, shared with the tiny vision-language model."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=MAX_POSITIONS,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.vocab["<|endoftext|>"],
        tie_word_embeddings=False,
    )


def build_model(out_dir: Path) -> None:
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(str(out_dir))
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(text_config(tokenizer))
    model.to(torch.bfloat16)  # type: ignore[arg-type]  # transformers mis-types its wrapped `to`
    model.save_pretrained(str(out_dir), safe_serialization=True)


def ensure_built(out_dir: str | Path, build: Callable[[Path], None]) -> Path:
    """Run `build` into `out_dir` unless a finished build is already there (an interrupted one is redone)."""
    path = Path(out_dir).resolve()
    marker = path / ".complete"
    if marker.exists():
        return path
    path.mkdir(parents=True, exist_ok=True)
    build(path)
    marker.write_text("ok\n")
    return path


def build(out_dir: Path) -> None:
    build_tokenizer(out_dir)
    build_model(out_dir)


def ensure_tiny_chat_model(out_dir: str | Path) -> Path:
    return ensure_built(out_dir, build)


def cli(description: str | None, default_dir: str, ensure: Callable[[str], Path]) -> None:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("out_dir", nargs="?", default=default_dir)
    print(ensure(parser.parse_args().out_dir))


def main() -> None:
    cli(__doc__, "models/tiny-chat", ensure_tiny_chat_model)


if __name__ == "__main__":
    main()
