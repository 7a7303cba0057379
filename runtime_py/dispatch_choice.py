"""``early_dispatch="auto"``: which of the batcher's two dispatch rules serves more rows per
second here, found by trying each in turn while serving.

The rules (``runtime_py.batcher``): *wait*, the collecting batch waits for the clients of
the last batch to come back (up to ``max_wait_ms``), so closed-loop clients stay in whole
batches; *early*, it goes when the batch in flight is due to finish, with the rows it has,
so the engine does not idle while they travel. Which wins depends on two things the
batcher cannot know in advance and that change with the load: whether the clients' round
trip outlasts an engine batch, and how much a smaller batch costs the engine per row. On
the H200 (timm_xception torch-aoti, 64 network clients, docs/measurements/h200-2026-12-02-c)
early gave +7% HTTP and +18% gRPC with the fp8 engine (3.9 ms per batch against a 4.5-4.9 ms
round trip) and -2% to -16% with the fp16 one (6.0 ms): neither rule is right for both.

So the rule in use is measured against the other one, on the traffic being served:

- The incumbent (first: *wait*, today's default) serves; every ``hold`` batches the other
  rule is tried: ``SETTLE`` batches for the clients to regroup (cohorts merge or split
  within a few batches), then ``MEASURE`` batches timed. The incumbent's rate is that of its
  own last ``MEASURE`` batches just before the trial (rows delivered per second, between
  the batches' outputs).
- The trial rule takes over when it served more than ``MARGIN`` more rows per second, and
  the next trial comes after ``HOLD_MIN`` batches; otherwise the incumbent resumes and the
  next trial comes twice as late, up to ``HOLD_MAX``: a settled choice spends at most
  40 of every ~4,100 batches (1%) on the other rule.
- A pause in the traffic (``GAP_S`` between two batches) voids the measurement in
  progress: an idle service says nothing about either rule. A trial then ends in favour
  of the incumbent.

Pure bookkeeping, fed one ``(time, rows)`` per finished batch: no threads, no clock of its
own, so that tests drive it with made-up times.
"""

from __future__ import annotations

import collections

SETTLE = 8          # batches after a switch before its rate counts
MEASURE = 32        # batches timed per rule
MARGIN = 0.03       # how much faster the trial rule must be to take over
HOLD_FIRST = 64     # batches before the first trial
HOLD_MIN = 256
HOLD_MAX = 4096
GAP_S = 0.1         # a longer pause between batches voids the measurement in progress


class DispatchChooser:
    """Which rule the batcher uses now (``early``), from the batches it finished."""

    def __init__(self) -> None:
        self.early = False              # the rule in use now
        self.trials = 0                 # trials finished
        self.switches = 0               # trials the other rule won
        self.last_rates: tuple[float, float] | None = None   # (wait, early) rows/s, last trial
        self._incumbent = False         # the rule that won the last trial
        self._phase = "hold"            # hold (incumbent serves), settle, measure (trial)
        self._count = 0                 # batches in this phase
        self._hold = HOLD_FIRST
        self._incumbent_rate = 0.0
        self._window: collections.deque[tuple[float, int]] = collections.deque(
            maxlen=MEASURE + 1)
        self._last_t: float | None = None

    @property
    def chosen(self) -> str:
        """The rule that won the last trial ("wait" before any): what serves between
        trials."""
        return "early" if self._incumbent else "wait"

    def on_batch(self, t: float, rows: int) -> bool | None:
        """A batch's outputs were ready at ``t`` (seconds, any monotonic clock) with
        ``rows`` rows. Returns None, or when this batch ended a trial whether the trial's
        rule took over."""
        if self._last_t is not None and t - self._last_t > GAP_S:
            self._void()
        self._last_t = t
        self._window.append((t, rows))
        self._count += 1
        if self._phase == "hold":
            if self._count >= self._hold and len(self._window) == self._window.maxlen:
                self._incumbent_rate = self._rate()
                self.early = not self._incumbent
                self._enter("settle")
        elif self._phase == "settle":
            if self._count >= SETTLE:
                self._window.clear()
                self._window.append((t, rows))   # the first timed batch starts the clock
                self._enter("measure")
        elif len(self._window) == self._window.maxlen:    # measure: the trial is timed
            return self._decide(self._rate())
        return None

    def _decide(self, trial_rate: float) -> bool:
        self.trials += 1
        rates = (self._incumbent_rate, trial_rate)
        self.last_rates = rates[::-1] if self._incumbent else rates
        switched = trial_rate > self._incumbent_rate * (1.0 + MARGIN)
        if switched:
            self._incumbent = self.early
            self.switches += 1
            self._hold = HOLD_MIN
        else:
            self.early = self._incumbent
            self._hold = min(2 * self._hold, HOLD_MAX)
        self._window.clear()
        self._enter("hold")
        return switched

    def _void(self) -> None:
        """A pause: what was being measured is void; a trial ends for the incumbent."""
        if self._phase != "hold":
            self.early = self._incumbent
        self._window.clear()
        self._enter("hold")

    def _enter(self, phase: str) -> None:
        self._phase, self._count = phase, 0

    def _rate(self) -> float:
        """Rows per second over the window: the rows of every batch but the first, over
        the time from the first batch's outputs to the last one's."""
        (t0, _), (t1, _) = self._window[0], self._window[-1]
        rows = sum(r for _, r in self._window) - self._window[0][1]
        return rows / (t1 - t0) if t1 > t0 else 0.0
