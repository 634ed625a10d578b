"""The graph as a benchmark target: one model of a config, on its own local Ray cluster.

`load.bench --start graph:CONFIG[@MODEL]` runs this in a child process; SIGTERM shuts Serve and the
cluster down again. `ray.init(address="local")` starts a cluster owned by this process, so stopping
it never touches another Ray on the machine (e.g. one that `make serve` started), and its workers
inherit this process's environment, to which it adds configs/ray.env (what that environment sets
already wins: with the Makefile, the file does).
`python -m load.graph_launcher --config configs/cpu-tiny.yaml --app tiny-llava --port 8100`
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Callable, MutableMapping
from pathlib import Path
from typing import Any

import psutil
import yaml

from deployments.stop import remove_haproxy_node_dirs, remove_orphaned_engine_files, shm_files, stop_serve
from load.ports import free_port
from load.serve_config import DEFAULT_CONFIG, pin_local_paths, select

logger = logging.getLogger(__name__)


def one_app_config(config_path: str, name: str | None, port: int) -> dict[str, Any]:
    """The config serving one model (`load.serve_config.select`: a model or an application of it; default
    the first model) and its `/health` application, on 127.0.0.1:`port`."""
    config = select(yaml.safe_load(Path(config_path).read_text()), name, config_path)
    config["http_options"] = {**config.get("http_options", {}), "host": "127.0.0.1", "port": port}
    return pin_local_paths(config, Path.cwd())


# Ports that Serve's HAProxy mode opens at fixed numbers on every node: a second cluster on the machine
# (this launcher's, the tests') would collide with the first one's and leave its HAProxy down.
FIXED_SERVE_PORTS = ("RAY_SERVE_HAPROXY_STATS_PORT", "RAY_SERVE_HAPROXY_METRICS_PORT",
                     "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT", "RAY_SERVE_FALLBACK_PROXY_GRPC_PORT")  # fmt: skip


def use_free_serve_ports(environ: MutableMapping[str, str]) -> None:
    """Gives each of FIXED_SERVE_PORTS not already set a free port, in `environ` (of `ray start`/`ray.init`)."""
    for name in FIXED_SERVE_PORTS:
        if name not in environ:
            environ[name] = str(free_port())


RAY_ENV = Path(__file__).resolve().parents[1] / "configs" / "ray.env"


def ray_env(path: Path = RAY_ENV) -> dict[str, str]:
    """The `NAME=value` lines of configs/ray.env: the environment every cluster of the graph starts with."""
    lines = (line.strip() for line in path.read_text().splitlines())
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


def ray_setting(name: str) -> str:
    """`name` as a cluster started here gets it: the environment's value, else configs/ray.env's (the
    Makefile's command line and `serve_until_terminated` below both let a value already set win over the file)."""
    return os.environ.get(name) or ray_env()[name]


def route_prefix(config: dict[str, Any]) -> str:
    prefix = str(config["applications"][0].get("route_prefix") or "/")
    return "" if prefix == "/" else prefix.rstrip("/")


def _exit(signum: int, frame: Any) -> None:
    # A second SIGTERM (a process manager repeating itself) must not cut the drain below short.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise SystemExit(0)  # so that the `finally` below shuts Serve and Ray down


def serve_until_terminated(config: dict[str, Any]) -> None:
    import ray
    from ray import serve
    from ray.serve.context import _get_global_client
    from ray.serve.schema import ServeDeploySchema

    for name, value in ray_env().items():  # as the Makefile sets them for `ray start`, unless set already
        os.environ.setdefault(name, value)
    # HAProxy with the ingress's admission gate, as the Makefile has it.
    os.environ.setdefault("RAY_SERVE_HAPROXY_BINARY_PATH", str(Path(sys.executable).with_name("serve-graph-haproxy")))
    for name in FIXED_SERVE_PORTS:  # the ports of the cluster that started us (the tests' session) are taken
        os.environ.pop(name, None)
    use_free_serve_ports(os.environ)
    shm_before = shm_files()
    ray.init(address="local", include_dashboard=False, logging_level=logging.WARNING)
    node_id = ray.get_runtime_context().get_node_id()
    # After ray.init, which installs its node's own SIGTERM handler: that one tears the cluster down at
    # once (measured: streams cut with error events, the raylet SIGKILLed after its 1 s of grace, and its
    # agents, left blocked reporting that to the dead GCS, orphaned) and skipped the `finally` below.
    signal.signal(signal.SIGTERM, _exit)
    try:
        serve.start(http_options=config["http_options"])
        client = _get_global_client()
        assert client is not None  # serve.start() just made it
        client.deploy_apps(ServeDeploySchema.model_validate(config))
        while True:
            signal.pause()
    finally:
        try:
            stop_serve()  # in-flight streams finish before Serve and Ray go
        finally:
            stop_cluster(ray.shutdown, psutil.Process().children(recursive=True))
            # As `make stop` does: an engine worker that missed vLLM's exit grace was SIGKILLed with its
            # shared-memory queue still in /dev/shm (seen on a CI machine: one psm_ file).
            remove_orphaned_engine_files(shm_before)
            remove_haproxy_node_dirs([node_id])


def stop_cluster(shutdown: Callable[[], None], cluster: list[psutil.Process], grace_s: float = 10.0) -> None:
    """Runs `shutdown` (ray.shutdown), then kills what of `cluster` (its processes) outlives it by `grace_s`.

    ray.shutdown() gives the raylet 1 s to exit after SIGTERM before it SIGKILLs it; a raylet killed
    that way cannot stop its dashboard and runtime-env agents, which then notice it gone only to block
    on the dead GCS while reporting it, deaf to SIGTERM (measured on 2 loaded cores).
    """
    shutdown()
    _, alive = psutil.wait_procs(cluster, timeout=grace_s)
    for proc in alive:
        with contextlib.suppress(psutil.NoSuchProcess):  # it exited after all
            logger.warning(
                "killing %s (pid %d): still running %.0f s after ray.shutdown()", proc.name(), proc.pid, grace_s
            )
            proc.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=DEFAULT_CONFIG)
    parser.add_argument("--app", default=None, help="model (or application) of the config (default: the first model)")
    parser.add_argument("--port", type=int, required=True)
    opts = parser.parse_args()
    serve_until_terminated(one_app_config(opts.config, opts.app, opts.port))


if __name__ == "__main__":
    main()
