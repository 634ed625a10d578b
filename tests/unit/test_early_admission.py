"""serve_app/ingress/middleware/early_admission.py: weighing a generation request from its raw JSON, before FastAPI."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from starlette.responses import JSONResponse
from starlette.types import Receive, Scope, Send

from serve_app.config import AdmissionConfig, AppArgs
from serve_app.errors import OpenAIError
from serve_app.ingress.app import create_app
from serve_app.ingress.middleware.early_admission import EarlyAdmission, Weight, weigh
from serve_app.ingress.pipeline.router import ModelRouter
from serve_app.ingress.pipeline.services import Services
from serve_app.stages.tokenizer import TokenizerStage
from tests.unit.conftest import CountingTokenizer, FakeLLM, HeldLLM


def test_weigh_reads_the_first_prompt_and_the_generation_budget() -> None:
    chat = {"messages": [{"role": "user", "content": "hello"},
                         {"role": "user", "content": [{"type": "text", "text": "abc"}, {"type": "image_url"}]}],
            "max_completion_tokens": 7, "n": 2}  # fmt: skip
    assert weigh("/v1/chat/completions", chat) == Weight(8, None, 7, 2, False, "messages")
    prompts = {"prompt": ["four", "longer"], "max_tokens": 3, "truncate_prompt_tokens": 2}
    assert weigh("/v1/completions", prompts) == Weight(4, None, 3, 1, True, "prompt")
    # A completion without max_tokens, or with null, generates 16 (its route's default); a chat, the room left.
    assert weigh("/v1/completions", {"prompt": [1, 2, 3]}) == Weight(0, 3, 16, 1, False, "prompt")
    assert weigh("/v1/completions", {"prompt": [[1, 2], [3]]}) == Weight(0, 2, 16, 1, False, "prompt")
    assert weigh("/v1/completions", {"prompt": "ab", "max_tokens": None}) == Weight(2, None, 16, 1, False, "prompt")
    assert weigh("/v1/chat/completions", {"messages": []}) == Weight(0, None, None, 1, False, "messages")
    # A null max_completion_tokens beside max_tokens: max_tokens, as the chat route reads it.
    both = {"messages": [], "max_tokens": 5, "max_completion_tokens": None}
    assert weigh("/v1/chat/completions", both) == Weight(0, None, 5, 1, False, "messages")


@pytest.mark.parametrize(
    "body",
    [
        {"prompt": 5},
        {"prompt": "a", "max_tokens": "9"},
        {"prompt": "a", "n": 0},
        {"prompt": "a", "max_tokens": True},
        {"prompt": "a", "max_tokens": 0},
        {"prompt": "a", "max_completion_tokens": -3},
    ],
)
def test_a_body_of_another_shape_is_left_to_the_route(body: dict[str, object]) -> None:
    assert weigh("/v1/completions", body) is None
    assert weigh("/v1/chat/completions", {"messages": "hi"}) is None


@pytest.fixture
def gated(app_args: AppArgs, tokenizer_stage: TokenizerStage) -> tuple[Services, CountingTokenizer, HeldLLM]:
    # 100 generated tokens per second and 1 s of wait: two requests of 40 tokens fit, a third does not.
    admission = AdmissionConfig(prefill_tokens_per_s=1e6, decode_tokens_per_s=100, max_wait_s=1.0, retry_after_s=3)
    tokenizer, llm = CountingTokenizer(tokenizer_stage), HeldLLM()
    return Services.create(app_args.model_copy(update={"admission": admission}), tokenizer, llm), tokenizer, llm


async def test_a_burst_is_refused_in_arrival_order_before_any_admitted_request_runs(
    gated: tuple[Services, CountingTokenizer, HeldLLM],
) -> None:
    services, tokenizer, llm = gated
    transport = httpx.ASGITransport(app=create_app(services))
    async with httpx.AsyncClient(transport=transport, base_url="http://graph") as client:
        body = {"model": "tiny-chat", "prompt": "hello there", "max_tokens": 40, "stream": True}

        async def post() -> httpx.Response:
            async with client.stream("POST", "/v1/completions", json=body) as response:
                await response.aread()  # a served stream ends only once the engine lets it go
                return response

        burst = [asyncio.create_task(post()) for _ in range(10)]
        refusals: list[httpx.Response] = []
        while len(refusals) < 8:  # refused while the two admitted streams are still held by the engine
            done, _ = await asyncio.wait(burst, return_when=asyncio.FIRST_COMPLETED)
            refusals = [t.result() for t in burst if t.done()]
            assert not llm.release.is_set() and done
        assert [r.status_code for r in refusals] == [503] * 8
        assert all(r.headers["Retry-After"] == "3" for r in refusals)
        assert refusals[0].json()["error"]["code"] == "overloaded"
        assert tokenizer.calls == 2  # a refusal costs no tokenizer work
        llm.release.set()
        served = await asyncio.gather(*burst)
        assert sorted(r.status_code for r in served) == [200] * 2 + [503] * 8
    assert services.work is not None and services.work.backlog_s == 0.0 and services.work.live == 0


async def test_a_request_the_route_refuses_gives_its_ticket_back(
    gated: tuple[Services, CountingTokenizer, HeldLLM],
) -> None:
    services, tokenizer, _ = gated
    transport = httpx.ASGITransport(app=create_app(services))
    async with httpx.AsyncClient(transport=transport, base_url="http://graph") as client:
        # Weighed and admitted from its raw JSON, then refused by the route's validation (unknown field value).
        response = await client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 40, "temperature": -1})
        assert response.status_code == 400
        unknown = await client.post("/v1/completions", json={"model": "nope", "prompt": "hi", "max_tokens": 40})
        assert unknown.status_code == 404
    assert services.work is not None and services.work.backlog_s == 0.0 and services.work.live == 0
    assert tokenizer.calls == 0


async def test_every_request_of_a_burst_is_weighed_before_any_goes_on(
    gated: tuple[Services, CountingTokenizer, HeldLLM],
) -> None:
    services = gated[0]
    gate = services.work
    assert gate is not None
    seen: list[int] = []  # tickets live when each admitted request reached the application

    async def application(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(gate.live)
        await JSONResponse({})(scope, receive, send)

    def render(error: OpenAIError, refused_by: Services) -> JSONResponse:
        assert refused_by is services
        return JSONResponse({"refused": error.message}, status_code=503)

    early = EarlyAdmission(application, lambda model: services, render)
    transport = httpx.ASGITransport(app=early)
    async with httpx.AsyncClient(transport=transport, base_url="http://graph") as client:
        body = {"prompt": "hi", "max_tokens": 40}
        answers = await asyncio.gather(*(client.post("/v1/completions", json=body) for _ in range(5)))
    assert sorted(a.status_code for a in answers) == [200, 200, 503, 503, 503]
    assert seen[0] == 2  # the first admitted request went on only once the whole burst was weighed
    assert gate.live == 0 and gate.backlog_s == 0.0


async def test_a_refusal_answers_as_the_model_it_names(
    app_args: AppArgs, tokenizer_stage: TokenizerStage, gated: tuple[Services, CountingTokenizer, HeldLLM]
) -> None:
    full, _, _ = gated
    assert full.work is not None
    full.work.admit(prompt_tokens=0, max_tokens=1000)  # 10 s of work admitted: the next request waits too long
    other_args = app_args.model_copy(update={"model": app_args.model.model_copy(update={"served_model_name": "b"})})
    other = Services.create(other_args, tokenizer_stage, FakeLLM())
    full.args = full.args.model_copy(update={"admission": full.args.admission.model_copy(update={"status_code": 429})})
    transport = httpx.ASGITransport(app=create_app(ModelRouter([full, other])))
    async with httpx.AsyncClient(transport=transport, base_url="http://graph") as client:
        refused = await client.post("/v1/completions", json={"model": "tiny-chat", "prompt": "hi", "max_tokens": 4})
        served = await client.post("/v1/completions", json={"model": "b", "prompt": "hi", "max_tokens": 4})
    assert refused.status_code == 429 and refused.headers["Retry-After"] == "3"  # the full model's own answer
    assert served.status_code == 200  # one model's backlog refuses nothing of another's
    rejected = {"stage": "ingress", "reason": "expected_wait"}
    assert full.metrics.registry.get_sample_value("serve_graph_rejections_total", rejected) == 1


async def test_a_prompt_that_cannot_fit_the_context_is_a_400_before_any_tokenizing(
    gated: tuple[Services, CountingTokenizer, HeldLLM],
) -> None:
    services, tokenizer, llm = gated
    llm.release.set()  # the engine answers what reaches it
    assert services.work is not None
    services.work.max_chars_per_token = 80  # the tiny model's tokenizer's
    long = "serve123 " * (80 * services.args.model.max_model_len // 9 + 1)
    transport = httpx.ASGITransport(app=create_app(services))
    async with httpx.AsyncClient(transport=transport, base_url="http://graph") as client:
        completion = await client.post("/v1/completions", json={"prompt": long, "max_tokens": 4})
        chat = await client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": long}]})
        cut = await client.post("/v1/completions", json={"prompt": long, "max_tokens": 4, "truncate_prompt_tokens": 8})
    for response, param in ((completion, "prompt"), (chat, "messages")):
        assert response.status_code == 400  # on an idle engine too: not an overload to retry later
        error = response.json()["error"]
        assert error["code"] == "context_length_exceeded" and error["param"] == param
        assert "Retry-After" not in response.headers
    assert tokenizer.calls == 1  # only the truncated prompt was tokenized
    assert cut.status_code == 200
    assert services.work.live == 0


@pytest.mark.parametrize(("param", "cap"), [("n", None), ("max_tokens", None), ("max_tokens", 80)])
async def test_an_n_or_a_budget_past_the_limit_is_the_routes_400_not_an_overload(
    gated: tuple[Services, CountingTokenizer, HeldLLM], param: str, cap: int | None
) -> None:
    services, tokenizer, llm = gated
    if cap is not None:  # `limits.max_tokens`: a budget under the context but over the cap
        args = services.args.model_copy(update={"limits": services.args.limits.model_copy(update={"max_tokens": cap})})
        services = Services.create(args, tokenizer, llm)
    # Weighed, each would not fit behind the held request: n x 40 tokens, the room a prompt leaves, the cap.
    past = services.args.limits.max_n + 1 if param == "n" else (cap or services.args.model.max_model_len) + 1
    transport = httpx.ASGITransport(app=create_app(services))
    async with httpx.AsyncClient(transport=transport, base_url="http://graph") as client:
        held = asyncio.create_task(client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 40}))
        while services.work is None or services.work.live == 0:
            await asyncio.sleep(0.01)
        response = await client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 40, param: past})
        llm.release.set()
        assert (await held).status_code == 200
    assert response.status_code == 400 and response.json()["error"]["param"] == param
