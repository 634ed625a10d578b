"""Benchmark CLI, `python -m load.bench` (usage in `cli.py`): the client-side metrics of `vllm bench
serve` and `/health` latency under load, for several targets interleaved in one run.

`main(argv)` runs it from Python (call it from synchronous code) and returns the results document.
"""

from load.bench.cli import main

__all__ = ["main"]
