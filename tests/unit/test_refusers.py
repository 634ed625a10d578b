"""load/refusers.py: both refusers, started as load tools start them, refuse a burst as the graph does."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from load.bench import targets
from load.burst import Answer, burst
from tests.processes import running


@pytest.mark.parametrize("kind", ["haproxy-refuser", "python-refuser"])
async def test_a_refuser_refuses_every_completion_and_lists_the_model(kind: str, tmp_path: Path) -> None:
    pids: dict[str, int] = {}
    with targets.started([kind], tmp_path, pids) as urls:
        url = urls[kind]
        async with httpx.AsyncClient() as client:
            models = (await client.get(f"{url}/v1/models")).json()
        answers = await burst(url, models["data"][0]["id"], 50, 256, 8, seed=0)
    assert models["data"][0]["id"] == "tiny-chat"
    # `refused`: a 503 whose body is OpenAI JSON, with Retry-After (load.burst.classify).
    assert [a.kind if isinstance(a, Answer) else a for a in answers] == ["refused"] * 50
    assert not running(pids[kind])
