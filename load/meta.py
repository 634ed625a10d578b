"""Where and how a result was produced, stored with every result file; and the file's writing."""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import sys
from pathlib import Path
from typing import Any


def run_meta(module: str | None = None, argv: list[str] | None = None) -> dict[str, Any]:
    """Command, date and machine; `module`/`argv` name the command when it was not run from the shell."""
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    if module is None:
        module = "load." + sys.argv[0].removesuffix(".py").replace("/", ".").split("load.", 1)[-1]
    args = sys.argv[1:] if argv is None else argv
    return {
        "command": f"python -m {module} {shlex.join(args)}",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": f"{os.cpu_count()} cores ({cpu}), {mem_gib:.0f} GiB RAM, no GPU",
    }


def save_result(out: Path | str | None, result: dict[str, Any]) -> None:
    """Writes `result` as JSON to `out` (its directory made if missing); nothing when `out` is None."""
    if out is None:
        return
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
