"""Admission by work: a request is admitted when the engine is expected to have cleared the work
already admitted before it, plus its own, within `admission.max_wait_s` and the request's deadline.

Counting requests treats a one-token request like a 2,000-token generation: a count low enough to
refuse a burst of long generations at once refused a burst of one-token requests the engine clears in
seconds, and a count high enough for those queued long generations for minutes. Here each request
weighs its engine time at the engine's saturated rates (`admission.prefill_tokens_per_s` for its
prompt, `admission.decode_tokens_per_s` for the tokens it may generate), and the backlog is the sum
over the requests admitted and not finished, less what they have generated so far. The prompt's
share is paid off at the first token. It is an estimate at full batch: a lone request decodes slower
than the batch rate, but then nothing waits behind it.

The rates are the configured ones at first. With `admission.learn_speed`, the gate divides every
wait by the speed at which the engine really clears admitted work (`engine_speed.py`), so that rates
measured on one machine admit about what another one's engine clears in `max_wait_s`.

A request is weighed when it arrives, before the tokenizer stage, so a refusal costs no tokenizer
work and does not wait in its queue: its prompt's characters times the tokens per character of the
prompts tokenized so far (exact for token-id prompts); once tokenized, its ticket takes its real size.

A prompt that cannot fit the context whatever the load (more characters than `max_model_len` tokens
can spell, when the tokenizer bounds the characters per token) gets the tokenizer stage's 400 at once:
an overload refusal would tell its client to retry it, and tokenizing it first is the work a burst of
such prompts would pile on.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from serve_app.config import AppArgs
from serve_app.errors import BadRequestError, OverloadedError
from serve_app.ingress.pipeline.engine_speed import EngineSpeed


class WorkTicket:
    """One admitted request's share of the backlog, paid off as it progresses; `release` ends it."""

    def __init__(self, gate: WorkGate, prompt_s: float, decode_s_per_token: float, max_tokens: int) -> None:
        self._gate = gate
        self._prompt_s = prompt_s
        self._per_token = decode_s_per_token
        self._tokens_left = max_tokens
        self.remaining_s = prompt_s + decode_s_per_token * max_tokens
        self._live = True
        gate.backlog_s += self.remaining_s
        gate.count(+1)

    def resize(self, prompt_tokens: int, max_tokens: int) -> None:
        """The request's real size, once tokenized (it was admitted on an estimate)."""
        before = self.remaining_s
        self._prompt_s = prompt_tokens * self._gate.prefill_s
        self._tokens_left = max_tokens
        self.remaining_s = self._prompt_s + self._per_token * max_tokens
        self._gate.backlog_s = max(0.0, self._gate.backlog_s + self.remaining_s - before)

    def generated(self, tokens: int) -> None:
        """`tokens` more came out of the engine (the first call also ends the prompt's prefill)."""
        paid = self._prompt_s + self._per_token * min(tokens, self._tokens_left)
        self._prompt_s = 0.0
        self._tokens_left = max(0, self._tokens_left - tokens)
        self._gate.observe(self._pay(paid))

    def release(self) -> None:
        """The request ended (finished, failed or cancelled): its unpaid work leaves the backlog. Idempotent."""
        self._pay(self.remaining_s)
        if self._live:
            self._live = False
            self._gate.count(-1)
            if self._gate.live == 0:
                self._gate.backlog_s = 0.0  # no float residue may keep an idle engine "busy"

    def _pay(self, seconds: float) -> float:
        """Takes up to `seconds` off the backlog; returns what it took."""
        seconds = min(seconds, self.remaining_s)
        self.remaining_s -= seconds
        self._gate.backlog_s = max(0.0, self._gate.backlog_s - seconds)
        return seconds


class WorkGate:
    # Prompt tokens per character before any prompt was tokenized, as in a burst on a cold server:
    # English prose is ~0.25 for Llama-3's tokenizer; the tiny local model's gives 0.22 on the bench's
    # prompts and 0.37 on this repository's README. A little heavy rather than light.
    FIRST_TOKENS_PER_CHAR = 0.3

    def __init__(
        self,
        prefill_tokens_per_s: float,
        decode_tokens_per_s: float,
        max_wait_s: float,
        *,
        max_num_seqs: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.prefill_s = 1.0 / prefill_tokens_per_s
        self._decode_s = 1.0 / decode_tokens_per_s
        self._max_wait_s = max_wait_s
        # How fast the engine clears work against the configured rates, learned from the engine's
        # `max_num_seqs` (None: not learned, the rates are taken as they are).
        self.meter = None if max_num_seqs is None else EngineSpeed(max_num_seqs, clock)
        # Engine seconds of work admitted and not yet done, at the saturated rates, and its tickets.
        self.backlog_s = 0.0
        self.live = 0
        # Learned from the prompts tokenized so far, to weigh a request before it is tokenized.
        self.tokens_per_char = self.FIRST_TOKENS_PER_CHAR
        # The tokenizer's most characters per token (`stages.tokenizer.max_chars_per_token`), when known.
        self.max_chars_per_token: int | None = None

    def estimate_tokens(self, chars: int) -> int:
        return math.ceil(chars * self.tokens_per_char)

    def learn(self, chars: int, tokens: int) -> None:
        """A prompt of `chars` characters was `tokens` tokens: a moving average, so the weight follows the traffic."""
        if chars > 0:
            self.tokens_per_char += 0.2 * (tokens / chars - self.tokens_per_char)

    def gate_rates(self) -> tuple[float, float, float]:
        """Engine seconds per prompt character and per generated token at the learned speed, and the longest
        wait: what the HAProxy gate weighs a request by before it reaches the ingress (`ingress/gate/`)."""
        return self.tokens_per_char * self.prefill_s / self.speed, self._decode_s / self.speed, self._max_wait_s

    @property
    def speed(self) -> float:
        return 1.0 if self.meter is None else self.meter.speed

    def count(self, change: int) -> None:
        """One ticket more (+1) or less (-1)."""
        self.live += change
        if self.meter is not None:
            self.meter.live_changed(self.live, from_idle=change > 0 and self.live == 1)

    def observe(self, paid_s: float) -> None:
        """Admitted work worth `paid_s` configured seconds came out of the engine (not work given back
        unfinished: a request that stops early was not done; nor a late chunk after the last release,
        which would close a window spanning idle time)."""
        if self.meter is not None and self.live:
            self.meter.paid(paid_s)

    def admit(self, prompt_tokens: int, max_tokens: int, deadline_s: float | None = None) -> WorkTicket:
        """A ticket for the request, or OverloadedError (`expected_wait`) when the backlog with it would
        take longer than `max_wait_s` or the `deadline_s` left to the request, at the engine's `speed`.
        An idle engine admits any request: one larger than the whole budget would otherwise never run."""
        own = prompt_tokens * self.prefill_s + max_tokens * self._decode_s
        limit = min(self._max_wait_s, math.inf if deadline_s is None else deadline_s)
        ahead_s, own_s = self.backlog_s / self.speed, own / self.speed
        if self.live and ahead_s + own_s > limit:
            raise expected_wait_error(ahead_s, own_s, limit)
        return WorkTicket(self, prompt_tokens * self.prefill_s, self._decode_s, max_tokens)


def expected_wait_error(ahead_s: float, own_s: float, limit_s: float) -> OverloadedError:
    """The refusal of a request whose wait, `ahead_s` of admitted work and its own `own_s`, exceeds `limit_s`."""
    return OverloadedError(
        f"The engine has about {ahead_s:.1f} s of admitted work ahead of this request, which "
        f"needs about {own_s:.1f} s more; more than the {limit_s:.1f} s it may wait. Retry later.",
        code="overloaded",
        stage="ingress",
        reason="expected_wait",
    )


def admit_prompt(
    gate: WorkGate,
    args: AppArgs,
    chars: int,
    exact_tokens: int | None,
    *,
    extra_tokens: int = 0,
    max_tokens: int | None,
    n: int = 1,
    deadline_s: float | None,
    truncating: bool = False,
    param: str = "prompt",
) -> WorkTicket:
    """One prompt's ticket, before it is tokenized: `exact_tokens` (token-id prompts) or `chars` at the
    tokens per character learned, plus `extra_tokens` (images), generating `n` times its budget.
    BadRequestError (about `param`) for a prompt that cannot fit the context unless `truncating`."""
    if not truncating:
        _check_fits(gate, args.model.max_model_len, chars, exact_tokens, extra_tokens, param)
    prompt_tokens = (gate.estimate_tokens(chars) if exact_tokens is None else exact_tokens) + extra_tokens
    return gate.admit(prompt_tokens, budget(args, prompt_tokens, max_tokens) * n, deadline_s)


def _check_fits(gate: WorkGate, max_model_len: int, chars: int, exact: int | None, extra: int, param: str) -> None:
    if exact is not None:
        fewest, counted = exact + extra, ""
    elif gate.max_chars_per_token:
        fewest = -(-chars // gate.max_chars_per_token) + extra
        counted = "at least "
    else:
        return
    if fewest >= max_model_len:  # the tokenizer stage's own check (`TokenizerStage._check_length`)
        raise BadRequestError.context_length_exceeded(max_model_len, f"{counted}{fewest}", param)


def budget(args: AppArgs, prompt_tokens: int, max_tokens: int | None) -> int:
    """Tokens a prompt may generate: `max_tokens`, or what the context leaves, capped by `limits.max_tokens`."""
    room = max(0, args.model.max_model_len - prompt_tokens)
    cap = args.limits.max_tokens
    wanted = room if max_tokens is None else min(max_tokens, room)
    return wanted if cap is None else min(wanted, cap)
