"""Multimodal stage: fetch, decode, orient, convert and resize the images of a chat request.

This is the CPU work that vLLM's API server did on its event loop (vLLM PR #34789). Here it runs in worker
threads of its own replicas, and the LLM stage receives each image already at the model's input size
(e.g. 336x336 for LLaVA-1.5), so what the engine's input processor still does on its event loop
(rescale, normalize, placeholder expansion) costs the same small amount for any upload. vLLM takes
images, not processed tensors, for most models, so that last step cannot move here.

Identical uploads (same bytes) are decoded once: a bounded LRU keyed by the content hash, which is
also handed to the engine as the image's cache key so that it never hashes pixels itself.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from serve_app.config import AppArgs, MultimodalConfig
from serve_app.errors import BadRequestError, DeadlineExceededError
from serve_app.media.fetch import ImageFetcher
from serve_app.media.images import ImageSize, decode_image, fit_image
from serve_app.messages import ImagesRequest, ProcessedImage, ProcessedImages

# (height, width) of a fitted image -> the prompt tokens it becomes.
TokenCounter = Callable[[int, int], int]


def load_hf_processor(path: str, trust_remote_code: bool) -> Any:
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(path, trust_remote_code=trust_remote_code)  # type: ignore[no-untyped-call]


def token_counter(processor: Any) -> TokenCounter:
    """The processor's own count, which is what vLLM's placeholder expansion produces."""

    def count(height: int, width: int) -> int:
        return int(processor._get_num_multimodal_tokens(image_sizes=[(height, width)]).num_image_tokens[0])

    return count


class ImageCache:
    """Processed images by content hash, least recently used evicted first. Used from one event loop
    only (lookups before, inserts after the worker threads run), so it needs no lock."""

    def __init__(self, entries: int) -> None:
        self._entries = entries
        self._items: OrderedDict[str, tuple[Any, int]] = OrderedDict()

    def get(self, key: str) -> tuple[Any, int] | None:
        item = self._items.get(key)
        if item is not None:
            self._items.move_to_end(key)
        return item

    def put(self, key: str, item: tuple[Any, int]) -> None:
        if self._entries == 0:
            return
        self._items[key] = item
        self._items.move_to_end(key)
        while len(self._items) > self._entries:
            self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)


class MultimodalStage:
    """Turns image URLs into model-sized RGB arrays and their prompt-token counts."""

    def __init__(
        self, config: MultimodalConfig, size: ImageSize, count_tokens: TokenCounter, fetcher: ImageFetcher | None = None
    ) -> None:
        self.config = config
        self._size = size
        self._count_tokens = count_tokens
        self._fetcher = fetcher or ImageFetcher(config)
        self._cache = ImageCache(config.cache_entries)
        self._executor = ThreadPoolExecutor(config.threads, thread_name_prefix="multimodal")

    @staticmethod
    def parts(args: AppArgs) -> tuple[MultimodalConfig, ImageSize, TokenCounter]:
        """The constructor's arguments for `args`."""
        if args.multimodal is None:
            raise ValueError("the multimodal stage needs a `multimodal` block in the app args")
        processor = load_hf_processor(args.model.path, args.model.trust_remote_code)
        if getattr(processor, "image_processor", None) is None:
            raise ValueError(f"model {args.model.path} has no image processor: it is not a vision model")
        return args.multimodal, ImageSize.from_hf_image_processor(processor.image_processor), token_counter(processor)

    @classmethod
    def from_args(cls, args: AppArgs) -> MultimodalStage:
        return cls(*cls.parts(args))

    # `process` and `check_health` are the `MultimodalClient` methods: what the ingress calls, in-process
    # or through the deployment (which is this class).
    async def check_health(self) -> None:
        return None

    async def process(self, request: ImagesRequest) -> ProcessedImages:
        start = time.perf_counter()
        DeadlineExceededError.check(request.deadline, "multimodal")
        limit = self.config.max_images_per_request
        if len(request.urls) > limit:
            raise BadRequestError(
                f"At most {limit} images are allowed per request, got {len(request.urls)}.",
                param="messages",
                code="too_many_images",
            )
        fetches = [asyncio.ensure_future(self._fetch(i, url)) for i, url in enumerate(request.urls)]
        try:
            encoded = await asyncio.gather(*fetches)
        finally:  # one image refused (or the call cancelled): the others' fetches are of no use any more
            for fetch in fetches:
                fetch.cancel()
        keys = [hashlib.sha256(data).hexdigest() for data in encoded]
        hits = {key: item for key in set(keys) if (item := self._cache.get(key)) is not None}
        loop = asyncio.get_running_loop()
        misses = {key: i for i, key in enumerate(keys) if key not in hits}
        # Fetching may have taken the rest of the request's time: then decode nothing.
        DeadlineExceededError.check(request.deadline, "multimodal")
        decoded = await asyncio.gather(
            *(loop.run_in_executor(self._executor, self._decode, i, encoded[i]) for i in misses.values())
        )
        for key, item in zip(misses, decoded, strict=True):
            self._cache.put(key, item)
        done = {**hits, **dict(zip(misses, decoded, strict=True))}
        images = [ProcessedImage(done[key][0], key, done[key][1], cache_hit=key in hits) for key in keys]
        return ProcessedImages(images, time.perf_counter() - start)

    async def _fetch(self, index: int, url: str) -> bytes:
        try:
            return await self._fetcher.fetch(url)
        except BadRequestError as exc:
            raise _for_image(index, exc) from exc

    def _decode(self, index: int, data: bytes) -> tuple[Any, int]:
        try:
            image = fit_image(decode_image(data, self.config, self._size), self._size)
        except BadRequestError as exc:
            raise _for_image(index, exc) from exc
        pixels = np.asarray(image, dtype=np.uint8)
        height, width = pixels.shape[:2]
        return pixels, self._count_tokens(height, width)

    async def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        await self._fetcher.aclose()


def _for_image(index: int, exc: BadRequestError) -> BadRequestError:
    """The same error, saying which image of the request it is about."""
    return BadRequestError(f"Image {index + 1}: {exc.message}", param="messages", code=exc.code)
