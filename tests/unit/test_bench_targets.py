"""Starting and stopping targets (`--start`), with stand-in servers instead of an engine."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import httpx
import psutil
import pytest
import yaml

from load.bench import targets
from load.ports import free_port
from tests.processes import running

# Answers 200 to GET /health, like a ready model server.
STAND_IN = """
import http.server, sys
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
"""
# The same, with an "engine" child that ignores SIGTERM (it would outlive the server); prints its pid.
ENGINE = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); time.sleep(120)"
STUBBORN = f"""
import subprocess, sys
engine = subprocess.Popen([sys.executable, "-c", {ENGINE!r}], stdout=subprocess.PIPE)
engine.stdout.readline()  # SIGTERM is ignored from here on
print(engine.pid, flush=True)
{STAND_IN}
"""


def stand_in(arg: str | None, script: str = STAND_IN, stop_timeout_s: float = 5) -> targets.LaunchSpec:
    port = free_port()
    return targets.LaunchSpec([sys.executable, "-c", script, str(port)], f"http://127.0.0.1:{port}", 30, stop_timeout_s)


def stubborn(arg: str | None) -> targets.LaunchSpec:
    return stand_in(arg, STUBBORN, stop_timeout_s=1)


def crashing(arg: str | None) -> targets.LaunchSpec:
    return targets.LaunchSpec([sys.executable, "-c", f"raise SystemExit({arg})"], "http://127.0.0.1:9", 30, 5)


@pytest.fixture(autouse=True)
def launchers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(targets.LAUNCHERS, "stand-in", stand_in)
    monkeypatch.setitem(targets.LAUNCHERS, "stubborn", stubborn)
    monkeypatch.setitem(targets.LAUNCHERS, "crashing", crashing)


def test_started_targets_answer_and_are_stopped(tmp_path: Path) -> None:
    pids: dict[str, int] = {}
    with targets.started(["stand-in"], tmp_path, pids) as urls:
        assert list(urls) == ["stand-in"]
        assert httpx.get(f"{urls['stand-in']}/health").status_code == 200
        assert os.getpgid(pids["stand-in"]) == pids["stand-in"]  # the group whose CPU the bench reads
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{urls['stand-in']}/health")
    assert (tmp_path / "stand-in.log").exists()


def test_stopping_reaches_the_whole_process_group(tmp_path: Path) -> None:
    with targets.started(["stubborn"], tmp_path):
        engine = int((tmp_path / "stubborn.log").read_text().split()[0])
        assert running(engine)
    assert not running(engine)


def test_a_target_that_exits_fails_the_start(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="exited with 3 before /health answered"):
        targets.started(["crashing:3"], tmp_path).__enter__()


def test_bad_specs(tmp_path: Path) -> None:
    with pytest.raises(
        ValueError,
        match="unknown kind 'nope'; known: baseline, crashing, graph, haproxy-refuser, ingress-refuser, "
        "python-refuser, stand-in, stubborn, vllm",
    ):
        targets.started(["nope"], tmp_path).__enter__()
    with pytest.raises(ValueError, match="already started"), targets.started(["stand-in", "stand-in"], tmp_path):
        pass


def test_baseline_command() -> None:
    spec = targets.baseline("configs/other.yaml")
    port = spec.url.rsplit(":", 1)[1]
    assert spec.command == [
        *targets.NICE,
        sys.executable,
        "-m",
        "load.baseline",
        "--port",
        port,
        "--config",
        "configs/other.yaml",
    ]
    assert targets.baseline(None).command[-1] == "configs/cpu-tiny.yaml"


def test_baseline_command_selects_the_app() -> None:
    cmd = targets.baseline("configs/cpu-tiny.yaml@tiny-llava").command
    assert cmd[cmd.index("--config") + 1] == "configs/cpu-tiny.yaml"
    assert cmd[cmd.index("--app") + 1] == "tiny-llava"


@pytest.fixture
def config_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The env vars that `vllm` sets from the config, restored after the test."""
    for name in ("VLLM_CPU_KVCACHE_SPACE", "OMP_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.usefixtures("config_env")
def test_vllm_command_mirrors_the_graph_config() -> None:
    spec = targets.vllm("configs/cpu-tiny.yaml")
    port = spec.url.rsplit(":", 1)[1]
    cmd = spec.command
    assert cmd[: len(targets.NICE) + 4] == [*targets.NICE, sys.executable, "-m", "load.vllm_cli", "serve"]
    assert cmd[cmd.index("--port") + 1] == port
    assert cmd[cmd.index("--served-model-name") + 1] == "tiny-chat"
    assert cmd[cmd.index("--max-model-len") + 1] == "4096"
    assert cmd[cmd.index("--max-num-seqs") + 1] == "64"
    assert "--enforce-eager" in cmd
    assert "--model-impl" not in cmd and "--limit-mm-per-prompt" not in cmd  # auto, and a text model
    assert os.environ["VLLM_CPU_KVCACHE_SPACE"] == "1"  # the config's env vars reach the child


@pytest.mark.usefixtures("config_env")
def test_vllm_command_for_the_vision_model() -> None:
    cmd = targets.vllm("configs/cpu-tiny.yaml@tiny-llava").command
    assert cmd[cmd.index("--served-model-name") + 1] == "tiny-llava"
    assert cmd[cmd.index("--model-impl") + 1] == "transformers"
    assert json.loads(cmd[cmd.index("--limit-mm-per-prompt") + 1]) == {"image": 4}


def test_vllm_command_for_an_unknown_model() -> None:
    with pytest.raises(SystemExit, match="has no model or application 'nope'"):
        targets.vllm("configs/cpu-tiny.yaml@nope")


def test_graph_command_and_url_follow_the_model() -> None:
    spec = targets.graph("configs/cpu-tiny.yaml@tiny-llava")
    assert spec.command[1:3] == ["-m", "load.graph_launcher"]
    assert spec.command[spec.command.index("--app") + 1] == "tiny-llava"
    port = spec.command[spec.command.index("--port") + 1]
    assert spec.url == f"http://127.0.0.1:{port}"  # every model at the one base URL
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+", targets.graph(None).url)
    # An application's prefix, in a config with one model per application.
    vision = targets.graph("configs/bench-vision-replicas.yaml@vision-app-2mm")
    assert vision.url.endswith(vision_prefix())


def vision_prefix() -> str:
    config = yaml.safe_load(Path("configs/bench-vision-replicas.yaml").read_text())
    (app,) = [a for a in config["applications"] if a["name"] == "vision-app-2mm"]
    return str(app["route_prefix"]).rstrip("/")


def test_graph_launcher_keeps_one_app_with_pinned_paths() -> None:
    from load.graph_launcher import one_app_config, route_prefix

    config = one_app_config("configs/cpu-tiny.yaml", "tiny-orpheus", 8123)
    app, health = config["applications"]
    assert health["name"] == "health-app" and health["args"]["applications"] == ["openai"]
    assert app["name"] == "openai" and route_prefix(config) == ""
    assert config["http_options"] == {"host": "127.0.0.1", "port": 8123}
    (model,) = app["args"]["models"]  # only the chosen model, and only its deployments
    assert model["model"]["served_model_name"] == "tiny-orpheus"
    assert Path(model["model"]["path"]).is_absolute()
    assert Path(model["tts"]["codec"]).is_absolute()
    assert [d["name"] for d in app["deployments"]] == [
        "ingress", "tiny-orpheus-tokenizer", "tiny-orpheus-llm", "tiny-orpheus-vocoder",
    ]  # fmt: skip
    (first,) = one_app_config("configs/cpu-tiny.yaml", None, 8123)["applications"][0]["args"]["models"]
    assert first["model"]["served_model_name"] == "tiny-chat"
    whole = one_app_config("configs/cpu-tiny.yaml", "openai", 8123)["applications"][0]  # an application: all of it
    assert len(whole["args"]["models"]) == 3 and len(whole["deployments"]) == 9
    with pytest.raises(SystemExit, match="no model or application"):
        one_app_config("configs/cpu-tiny.yaml", "nope", 8123)


IGNORES_SIGTERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); "
IGNORES_SIGTERM += "time.sleep(60)"
# A server whose main process tears its child down on SIGTERM, as the graph launcher stops Ray. The child
# notes any SIGTERM it gets: a group-wide one would reach it under its parent's feet.
CHILD = "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *_: open(sys.argv[1], 'w').write('x')); "
CHILD += "print('ready', flush=True); time.sleep(60)"
ORDERLY_SERVER = f"""
import signal, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", {CHILD!r}, sys.argv[2]], stdout=subprocess.PIPE)
child.stdout.readline()
def stop(*_):
    child.kill(); child.wait(); open(sys.argv[1], "w").write("orderly"); sys.exit(0)
signal.signal(signal.SIGTERM, stop)
print("ready", flush=True)
time.sleep(60)
"""


def test_stop_lets_the_main_process_tear_down_its_children(tmp_path: Path) -> None:
    import subprocess

    stopped, child_signalled = tmp_path / "stopped", tmp_path / "child-got-sigterm"
    process = subprocess.Popen([sys.executable, "-c", ORDERLY_SERVER, str(stopped), str(child_signalled)],
                               stdout=subprocess.PIPE, start_new_session=True)  # fmt: skip
    assert process.stdout is not None and process.stdout.readline() == b"ready\n"
    targets.stop(process, timeout_s=10)
    assert stopped.read_text() == "orderly"
    assert not child_signalled.exists()
    with pytest.raises(ProcessLookupError):
        os.killpg(process.pid, 0)


def test_stop_kills_a_group_that_ignores_sigterm(tmp_path: Path) -> None:
    import subprocess

    code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"
    )
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True)
    assert process.stdout is not None and process.stdout.readline() == b"ready\n"
    targets.stop(process, timeout_s=0.5)
    assert process.returncode == -9


def test_a_launched_server_shares_the_session_but_not_the_process_group(tmp_path: Path) -> None:
    port = free_port()
    spec = targets.LaunchSpec([sys.executable, "-c", STAND_IN, str(port)], f"http://127.0.0.1:{port}", 30, 5)
    with targets.launched(spec, tmp_path / "server.log"):
        [pid] = [p.pid for p in psutil.Process().children() if p.cmdline()[-1] == str(port)]
        assert os.getsid(pid) == os.getsid(0)  # one autogroup with the client
        assert os.getpgid(pid) == pid != os.getpgid(0)
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
