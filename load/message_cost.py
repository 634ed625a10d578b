"""What a stage message costs to cross a Ray Serve hop: serialize, then read back, per message.

Over Serve's gRPC transport between replicas (RAY_SERVE_THROUGHPUT_OPTIMIZED), its handles pickle each
call's arguments and each streamed item (cloudpickle unless the handle asks for `pickle`); a 32-token
stream at `stream_interval: 4` sends ~9 chunks, each paid on both sides. This times, in this process,
the messages of a 256-token completion (`GenerateRequest`) and one streamed `GenerationChunk`, with
cloudpickle and with the standard pickle the ingress's handles use.
`python -m load.message_cost [--repeat 20000]`
"""

from __future__ import annotations

import argparse
import pickle
import timeit
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from ray import cloudpickle

from serve_app.messages import ChoiceDelta, GenerateRequest, GenerationChunk, SamplingSpec

MESSAGES: dict[str, Any] = {
    "GenerateRequest (256 prompt ids)": GenerateRequest("cmpl-0-0", list(range(256)), SamplingSpec(max_tokens=32)),
    "GenerationChunk (4 tokens)": GenerationChunk([ChoiceDelta(0, " four tokens", [11, 12, 13, 14], None)], False),
}
DUMPS: dict[str, Callable[[Any], bytes]] = {
    "cloudpickle": cloudpickle.dumps,
    "pickle": lambda obj: pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL),  # as Serve's "pickle"
}


def _best_us(call: Callable[[], object], repeat: int) -> float:
    return min(timeit.repeat(call, number=repeat, repeat=3)) / repeat * 1e6


def measure(repeat: int) -> list[dict[str, Any]]:
    """Microseconds to dump and to load each message with each method, best of three runs of `repeat`."""
    rows = []
    for name, message in MESSAGES.items():
        for method, dumps in DUMPS.items():
            data = dumps(message)
            assert pickle.loads(data) == message
            dump_us = _best_us(partial(dumps, message), repeat)
            load_us = _best_us(partial(pickle.loads, data), repeat)
            rows.append({"message": name, "method": method, "bytes": len(data), "dumps_us": dump_us,
                         "loads_us": load_us})  # fmt: skip
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| message | method | bytes | dumps us | loads us | both us |", "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        us = [r["dumps_us"], r["loads_us"], r["dumps_us"] + r["loads_us"]]
        lines.append(f"| {r['message']} | {r['method']} | {r['bytes']} | " + " | ".join(f"{u:.1f}" for u in us) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=20000, help="calls per timing run")
    print(table(measure(p.parse_args(argv).repeat)))


if __name__ == "__main__":
    main()
