"""How fast the engine really clears admitted work, against the rates admission was configured with
(`admission.learn_speed`; used by `work_admission.WorkGate`).

The configured rates come from one machine; on a CPU twice as slow, or beside other engines that take
its cores, admitted requests wait twice the `max_wait_s` they were promised. The meter counts the
configured engine-seconds that admitted requests pay off as their tokens come out, over windows of
`WINDOW_S`, and moves the speed half way to each window's rate:

- a window counts as busy when at least a quarter of `engine.max_num_seqs` requests (rounded up: one
  for an engine of 4 or fewer) were live for
  `BUSY_SHARE` of it: the batch is then large enough for the batch rates the config gives, and the
  window may lower the speed as well as raise it;
- a quieter window may only raise the speed, and not past the configured rates: a lone request decodes
  far below the batch rate, and learning that would refuse the next burst; but a speed learned during a
  slow spell must be able to recover when what it admits is too little to make the engine busy again;
- a window whose rate is outside `BOUNDS` is dropped (a stall, a clock jump: not a machine).

Limits: requests whose budget is large (no `max_tokens`, thousands of tokens each) fit too few at once
to make the engine busy, so such traffic never lowers the speed. A prompt is paid at the configured
prefill rate even when the engine's prefix cache skips most of it, so cached traffic reads fast. A
request's tokens count when the ingress takes them, so slow readers read slow. Requests shorter than a
window with the engine idle between them never complete one, so they teach nothing. A burst's first
window includes its requests' way to the engine (the tokenizer, the hop): time its work really takes.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

logger = logging.getLogger(__name__)


class EngineSpeed:
    WINDOW_S = 1.0
    # Share of a window the engine must have been busy for it to lower the speed: a load hovering at the
    # busy mark is not the full batch the rates describe.
    BUSY_SHARE = 0.9
    BOUNDS = (0.1, 10.0)
    # Busy from a quarter of `max_num_seqs` live: large enough a batch that the rate is near the saturated
    # one (the default config's 64 -> 16), small enough that a burst admitted at half the configured speed
    # still reaches it (8 s of 256-token generations: ~30).
    SEQS_PER_BUSY = 4

    def __init__(self, max_num_seqs: int, clock: Callable[[], float]) -> None:
        self.speed = 1.0
        self.busy_live = -(-max_num_seqs // self.SEQS_PER_BUSY)
        self._clock = clock
        self._start = 0.0
        self._paid_s = 0.0
        self._busy_s = 0.0  # busy seconds of this window before `_busy_since`
        self._busy_since: float | None = None
        self._logged = 1.0

    def live_changed(self, live: int, from_idle: bool) -> None:
        """The gate's live tickets became `live` (`from_idle`: the first after none): busy time is counted."""
        now = self._clock()
        if from_idle:  # a fresh window: the idle time before it is no measure of the engine
            self._open(now)
        busy = live >= self.busy_live
        if busy and self._busy_since is None:
            self._busy_since = now
        elif not busy and self._busy_since is not None:
            self._busy_s += now - self._busy_since
            self._busy_since = None

    def paid(self, seconds: float) -> None:
        """Admitted requests' progress worth `seconds` of configured engine time came out of the engine,
        while some are live (else the window may span idle time)."""
        self._paid_s += seconds
        now = self._clock()
        elapsed = now - self._start
        if elapsed < self.WINDOW_S:
            return
        busy_s = self._busy_s + (0.0 if self._busy_since is None else now - self._busy_since)
        seen = self._paid_s / elapsed
        low, high = self.BOUNDS
        if low <= seen <= high:
            if busy_s >= self.BUSY_SHARE * elapsed:
                self.speed += 0.5 * (seen - self.speed)
            elif seen > self.speed and self.speed < 1.0:
                self.speed += 0.5 * (min(seen, 1.0) - self.speed)
        self._open(now)
        if abs(math.log(self.speed / self._logged)) > math.log(1.25):
            logger.info("admission: the engine clears work at %.2fx the configured rates", self.speed)
            self._logged = self.speed

    def _open(self, now: float) -> None:
        """A new window from `now`; a busy spell going on counts in it from `now`."""
        self._start, self._paid_s, self._busy_s = now, 0.0, 0.0
        if self._busy_since is not None:
            self._busy_since = now
