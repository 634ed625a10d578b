"""What image work is left in the LLM replica: vLLM's input processing of one image request, timed.

The multimodal stage hands the engine an RGB array already at the model's input size, with its
content hash as the cache key. This times vLLM's `InputProcessor.process_inputs` (the HF image
processor, placeholder expansion, hashing; it runs on a vLLM thread of the LLM replica, sharing that
process's GIL with its event loop) for that input, against a raw decoded upload of the same request
without a key, which is what the engine gets when nothing runs before it.
`python -m load.engine_inputs --config configs/cpu-tiny.yaml --app tiny-llava --size 1024x768`
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from typing import Any

import numpy as np
from PIL import Image

from load.serve_config import DEFAULT_CONFIG, load_in_process
from serve_app.media.images import ImageSize, fit_image
from serve_app.stages.llm import build_engine
from serve_app.stages.multimodal import load_hf_processor


def time_inputs(engine: Any, tasks: Any, prompt_ids: list[int], images: list[Any], keyed: bool) -> list[float]:
    """Each image distinct (by key or by pixels), so vLLM's processor cache never answers instead."""
    from vllm import SamplingParams

    times = []
    for image in images:
        prompt: dict[str, Any] = {"prompt_token_ids": prompt_ids, "multi_modal_data": {"image": [image]}}
        if keyed:
            prompt["multi_modal_uuids"] = {"image": [uuid.uuid4().hex]}
        start = time.perf_counter()
        engine.input_processor.process_inputs(uuid.uuid4().hex, prompt, SamplingParams(max_tokens=1), tasks)
        times.append(time.perf_counter() - start)
    return times


async def measure(opts: argparse.Namespace) -> None:
    args = load_in_process(opts.config, opts.app)
    processor = load_hf_processor(args.model.path, args.model.trust_remote_code)
    width, height = (int(v) for v in opts.size.split("x"))
    rng = np.random.default_rng(0)
    uploads = [Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)) for _ in range(opts.rounds)]
    size = ImageSize.from_hf_image_processor(processor.image_processor)
    fitted = [np.asarray(fit_image(upload, size)) for upload in uploads]
    text = processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this?"}]}],
        add_generation_prompt=True,
    )
    prompt_ids = list(processor.tokenizer.encode(text, add_special_tokens=False))
    engine: Any = build_engine(args)
    try:
        tasks = await engine.get_supported_tasks()
        for name, images, keyed in (("fitted array + key (graph)", fitted, True), ("raw upload", uploads, False)):
            times = time_inputs(engine, tasks, prompt_ids, images, keyed)
            print(f"{name:28s} p50 {statistics.median(times) * 1e3:7.2f} ms  max {max(times) * 1e3:7.2f} ms")
    finally:
        engine.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=DEFAULT_CONFIG)
    parser.add_argument("--app", default="tiny-llava", help="a vision model of --config")
    parser.add_argument("--size", default="1024x768", help="the upload's WIDTHxHEIGHT")
    parser.add_argument("--rounds", type=int, default=30)
    asyncio.run(measure(parser.parse_args()))


if __name__ == "__main__":
    main()
