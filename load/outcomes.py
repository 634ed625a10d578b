"""What became of each request of a load run: a success, a clean rejection, or an error of one kind.

A clean rejection is the server's admission control at work: HTTP 503 or 429 with an OpenAI error
body (`{"error": {...}}`), answered at once. Anything else that is not a success is an error, grouped
by kind: another status (a 5xx, or a 503 whose body is not OpenAI's, e.g. Ray Serve's plain-text
backpressure answer), a timeout (a hang, as the client's timeout sees it), a broken connection, or a
broken stream (ended without `[DONE]`, an error event mid-stream, no audio).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from load.bench.client import RequestRecord

OK = "ok"
REJECTED = "rejected"
REJECT_STATUSES = (503, 429)
# The client keeps only the first 300 characters of a refusal's body: a long message would make the
# JSON unparsable, so the start of the document is what identifies an OpenAI error.
_OPENAI_ERROR = re.compile(r'\s*\{\s*"error"\s*:\s*\{')


def outcome(record: RequestRecord) -> str:
    """`ok`, `rejected`, or the kind of error (see the module's docstring)."""
    if record.ok:
        return OK
    if record.status in REJECT_STATUSES and _OPENAI_ERROR.match(record.detail or ""):
        return REJECTED
    error = record.error or ""
    if error == "stream":
        return "broken stream"
    if error.startswith("HTTP "):
        return f"HTTP {record.status} (not OpenAI JSON)" if record.status in REJECT_STATUSES else error
    if error.endswith("Timeout"):  # httpx's ReadTimeout, ConnectTimeout, PoolTimeout, WriteTimeout
        return f"timeout ({error})"
    return f"connection ({error})"


@dataclass(frozen=True)
class Accounting:
    """Every request sent ends in exactly one of succeeded, rejected or one of the error kinds."""

    sent: int
    succeeded: int
    rejected: int
    errors: dict[str, int] = field(default_factory=dict)
    error_details: list[str] = field(default_factory=list)

    @property
    def balanced(self) -> bool:
        return self.sent == self.succeeded + self.rejected + sum(self.errors.values())

    @property
    def clean(self) -> bool:
        """Each request got a success or a clean rejection, and none is unaccounted for."""
        return self.balanced and not self.errors


def account(records: Sequence[RequestRecord], sent: int | None = None, details: int = 5) -> Accounting:
    """Counts per outcome, and the first `details` distinct errors with what the server or client said.
    `sent` is the number of requests started, counted apart from the records (default: one per record):
    a request that never produced a record leaves the accounting unbalanced."""
    kinds = Counter(outcome(r) for r in records)
    errors = {kind: n for kind, n in sorted(kinds.items()) if kind not in (OK, REJECTED)}
    described = sorted({f"{outcome(r)}: {r.detail}" for r in records if outcome(r) in errors})
    return Accounting(len(records) if sent is None else sent, kinds[OK], kinds[REJECTED], errors, described[:details])
