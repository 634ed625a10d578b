"""load/refusers.py: the refusers, started as load tools start them, refuse as the graph's admission does."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from load.bench import targets
from load.burst import Answer, burst
from load.refusers import REFUSAL
from tests.processes import running


@pytest.mark.parametrize("kind", ["haproxy-refuser", "python-refuser"])
async def test_a_refuser_answers_a_burst_with_the_graphs_refusal(kind: str, tmp_path: Path) -> None:
    pids: dict[str, int] = {}
    with targets.started([kind], tmp_path, pids) as urls:
        url = urls[kind]
        async with httpx.AsyncClient() as client:
            models = (await client.get(f"{url}/v1/models")).json()
            one = await client.post(f"{url}/v1/completions", json={"model": "tiny-chat", "prompt": "hi"})
        answers = await burst(url, models["data"][0]["id"], 50, 256, 8, seed=0)
    assert models["data"][0]["id"] == "tiny-chat"
    assert (one.status_code, one.content) == (REFUSAL.status_code, bytes(REFUSAL.body))
    assert one.headers["retry-after"] == REFUSAL.headers["retry-after"]
    # `refused`: a 503 whose body is OpenAI JSON, with Retry-After (load.burst.classify).
    assert [a.kind if isinstance(a, Answer) else a for a in answers] == ["refused"] * 50
    assert not running(pids[kind])


async def test_the_ingress_refuser_refuses_by_its_own_work_admission(tmp_path: Path, tiny_model_path: Path) -> None:
    # tiny_model_path: the refuser loads models/tiny-chat, which that fixture builds.
    pids: dict[str, int] = {}
    with targets.started(["ingress-refuser"], tmp_path, pids) as urls:
        url = urls["ingress-refuser"]
        async with httpx.AsyncClient() as client:
            models = (await client.get(f"{url}/v1/models")).json()
            one = await client.post(f"{url}/v1/completions", json={"model": "tiny-chat", "prompt": "hi"})
        answers = await burst(url, "tiny-chat", 50, 256, 8, seed=0)
    assert [m["id"] for m in models["data"]] == ["tiny-chat"]
    assert one.status_code == 503 and one.headers["retry-after"] == "1"
    assert one.json()["error"]["code"] == "overloaded" and "admitted work ahead" in one.json()["error"]["message"]
    assert [a.kind if isinstance(a, Answer) else a for a in answers] == ["refused"] * 50
    assert not running(pids["ingress-refuser"])
