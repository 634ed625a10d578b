"""load.graph_launcher's shutdown: what outlives ray.shutdown() is killed; a second SIGTERM cannot cut it short."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from load.graph_launcher import RAY_ENV, _exit, ray_env, ray_setting, stop_cluster

# Like Ray's agents whose raylet was SIGKILLed: deaf to SIGTERM.
DEAF = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(flush=True); time.sleep(60)"


@pytest.fixture()
def deaf_child() -> Iterator[subprocess.Popen[str]]:
    child = subprocess.Popen([sys.executable, "-c", DEAF], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    child.stdout.readline()  # its SIGTERM handler is in place
    yield child
    if child.poll() is None:
        child.kill()
    child.wait()


def test_stop_cluster_kills_what_outlives_the_shutdown(deaf_child: subprocess.Popen[str]) -> None:
    terminated: list[int] = []

    def shutdown() -> None:  # as ray.shutdown() does to the processes it knows
        deaf_child.terminate()
        terminated.append(deaf_child.pid)

    # Only the processes it is given: all of pytest's children would include the integration tests' cluster.
    stop_cluster(shutdown, [psutil.Process(deaf_child.pid)], grace_s=0.5)
    assert terminated == [deaf_child.pid]
    assert deaf_child.wait(timeout=5) == -signal.SIGKILL


def test_sigterm_exits_once_and_ignores_a_second() -> None:
    previous = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(SystemExit):
            _exit(signal.SIGTERM, None)
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
        os.kill(os.getpid(), signal.SIGTERM)  # ignored, or this test run would end here
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_ray_env_is_what_a_shell_and_make_read_from_the_file(tmp_path: Path) -> None:
    """configs/ray.env is read three ways: `ray_env` here, `set -a; . configs/ray.env` on a node of one's
    own (README), and `include` in the Makefile; all three must agree, comments and blank lines aside."""
    env = ray_env()
    assert env["RAY_SERVE_THROUGHPUT_OPTIMIZED"] == "1" and env["RAY_event_stats"] == "0"
    shell = subprocess.run(["sh", "-c", f"set -a; . {RAY_ENV}; env"], env={}, capture_output=True, text=True,
                           check=True)  # fmt: skip
    from_shell = dict(ln.split("=", 1) for ln in shell.stdout.splitlines())
    assert {k: v for k, v in from_shell.items() if k not in ("PWD", "SHLVL", "_")} == env  # every name, too
    show = tmp_path / "show.mk"
    show.write_text("show:\n\t@env\n")
    made = subprocess.run(["make", "-s", "-C", str(RAY_ENV.parents[1]), "-f", "Makefile", "-f", str(show), "show"],
                          env={"PATH": os.environ["PATH"]}, capture_output=True, text=True, check=True)  # fmt: skip
    assert {k: v for k, v in (ln.split("=", 1) for ln in made.stdout.splitlines() if "=" in ln) if k in env} == env


def test_a_setting_already_in_the_environment_wins_over_the_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_SERVE_HAPROXY_NBTHREAD", raising=False)
    assert ray_setting("RAY_SERVE_HAPROXY_NBTHREAD") == ray_env()["RAY_SERVE_HAPROXY_NBTHREAD"] == "1"
    monkeypatch.setenv("RAY_SERVE_HAPROXY_NBTHREAD", "3")
    assert ray_setting("RAY_SERVE_HAPROXY_NBTHREAD") == "3"
