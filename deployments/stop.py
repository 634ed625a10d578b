"""Stopping Serve so that in-flight requests finish: `make stop` runs `python -m deployments.stop`.

`serve shutdown` only asks the controller to delete the applications and returns at once, so the
`ray stop` after it used to kill replicas mid-drain: open streams were cut, and each killed vLLM
engine left its shared-memory files in /dev/shm (measured: 9 for the default config's three engines).
Here the `ray stop` waits until every application is gone, each deployment having drained within its
`graceful_shutdown_timeout_s` (docs/reliability.md has what is measured after the change).
"""

from __future__ import annotations

import logging
import time

logger = logging.getLogger(__name__)


def stop_serve(timeout_s: float = 600.0) -> None:
    """Deletes every application of the connected cluster, waits for their drains, then shuts Serve down.

    Serve's own blocking delete gives up after 60 s, below the grace periods the configs give a stream.
    """
    from ray import serve
    from ray.serve.context import _get_global_client

    client = _get_global_client()
    assert client is not None  # raises RayServeException instead where Serve is not running
    # All at once: each drain lasts at least Serve's direct-ingress period (35 s); one by one, 115 s.
    client.delete_apps(list(serve.status().applications), blocking=False)
    deadline = time.monotonic() + timeout_s
    while (left := list(serve.status().applications)) and time.monotonic() < deadline:
        time.sleep(1.0)
    if left:
        logger.warning("still draining after %.0f s, shutting Serve down anyway: %s", timeout_s, left)
    serve.shutdown()  # type: ignore[no-untyped-call]


def main() -> None:
    import ray
    from ray.serve.exceptions import RayServeException

    try:
        ray.init(address="auto", logging_level=logging.WARNING)
    except ConnectionError as exc:
        print(f"no Ray cluster to stop Serve on: {exc}")
        return
    try:
        stop_serve()
    except RayServeException as exc:
        print(f"Serve is not running: {exc}")
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
