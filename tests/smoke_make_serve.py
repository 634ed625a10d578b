"""A newcomer's first run, for CI: `make serve` with an empty HOME, the README's client snippet, `make stop`.

`.ci/run` runs it after `make test` (`make smoke`). It fails unless, from a machine state in which Ray has
never run for this user:
1. `make serve` serves: the graph's `/health` turns 200 within `--timeout` seconds (printed: the time to
   first answer);
2. the README's Quickstart Python snippet runs against it, unchanged;
3. `make stop` ends every process `make serve` started (the foreground `serve run` included) and leaves
   no new file in /dev/shm and no new directory of HAProxy files.
`python tests/smoke_make_serve.py [--timeout 600]`
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

from serve_app.ingress.gate.admin import admin_socket

ROOT = Path(__file__).resolve().parents[1]
HEALTH = "http://127.0.0.1:8000/health"


def haproxy_files() -> Path:
    """Where Serve's HAProxy keeps its admin socket, in a directory for each node (Serve's setting, as read
    by `serve_app/ingress/gate/admin.py`)."""
    return admin_socket("node").parent.parent


def haproxy_dirs() -> set[str]:
    files = haproxy_files()
    return {p.name for p in files.iterdir()} if files.is_dir() else set()


def readme_snippet() -> str:
    """The first Python block of the README's Quickstart."""
    text = (ROOT / "README.md").read_text()
    quickstart = text[text.index("## Quickstart") :]
    match = re.search(r"```python\n(.*?)```", quickstart, re.S)
    assert match is not None, "the README's Quickstart has no Python snippet"
    return match.group(1)


def wait_healthy(serve: subprocess.Popen[bytes], timeout_s: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if serve.poll() is not None:
            raise SystemExit(f"`make serve` exited with {serve.returncode} before the graph was healthy")
        try:
            if httpx.get(HEALTH, timeout=5).status_code == 200:
                return time.monotonic() - start
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise SystemExit(f"the graph was not healthy {timeout_s:.0f} s after `make serve`")


def ray_processes() -> set[int]:
    """Ray's processes of this user (a cluster this run started, since none ran before it)."""
    names = ("raylet", "gcs_server", "ray::", "haproxy", "VLLM::", "dashboard", "serve run")
    found = set()
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if proc.pid != os.getpid() and any(n in cmdline for n in names):
            found.add(proc.pid)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds `make serve` has to be healthy")
    opts = parser.parse_args()
    if ray_processes():
        raise SystemExit(f"Ray is already running here (pids {sorted(ray_processes())}): stop it first")
    shm_before = {p.name for p in Path("/dev/shm").iterdir()}
    haproxy_before = haproxy_dirs()
    env = {**os.environ, "HOME": tempfile.mkdtemp(prefix="smoke-home-")}
    (ROOT / ".cache").mkdir(exist_ok=True)
    log = open(ROOT / ".cache" / "smoke-serve.log", "wb")  # noqa: SIM115 (open while `make serve` runs)
    serve = subprocess.Popen(["make", "serve"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        print(f"make serve: healthy after {wait_healthy(serve, opts.timeout):.1f} s", flush=True)
        subprocess.run([sys.executable, "-c", readme_snippet()], cwd=tempfile.mkdtemp(), env=env, check=True)
        print("README snippet: ok", flush=True)
    finally:
        started = time.monotonic()
        subprocess.run(["make", "stop"], cwd=ROOT, env=env, check=True)
        print(f"make stop: {time.monotonic() - started:.1f} s", flush=True)
    try:
        serve.wait(timeout=30)
    except subprocess.TimeoutExpired:
        serve.send_signal(signal.SIGTERM)
        raise SystemExit("`make serve` was still running after `make stop`") from None
    left = ray_processes()
    leaked = {p.name for p in Path("/dev/shm").iterdir()} - shm_before
    haproxy_left = haproxy_dirs() - haproxy_before
    if left or leaked or haproxy_left:
        raise SystemExit(
            f"left behind: processes {sorted(left)}, /dev/shm files {sorted(leaked)}, "
            f"HAProxy directories in {haproxy_files()}: {sorted(haproxy_left)}"
        )
    print("nothing left behind", flush=True)


if __name__ == "__main__":
    main()
