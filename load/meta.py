"""Where and how a result was produced: stored with every result file."""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import sys
from typing import Any


def run_meta() -> dict[str, Any]:
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    module = sys.argv[0].removesuffix(".py").replace("/", ".").split("load.", 1)[-1]
    return {
        "command": "python -m load." + module + " " + shlex.join(sys.argv[1:]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{os.cpu_count()} cores ({cpu}), {mem_gib:.0f} GiB RAM, no GPU",
    }
