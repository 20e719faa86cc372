"""Tier switches agreed by every rank: one small all-gather per engine step.

The rule: every rank feeds its own copy of the policy the *same* observation, the merge of every rank's round,
through the controller's one ``observe``, so every copy makes the same decision at the same step, with no rank
deciding for the others. That needs a deterministic policy: the C++ ones are; a Python policy
(``"policy": "python"``) must decide from the merged observations alone (no clock, no unseeded randomness, no
rank). Each step's ``merge`` checks that every rank is at the same tier, so a policy that is not raises
``TierDesync`` at the step after it diverged.

Each step, every rank (busy or not) contributes one fixed-size float64 vector (``Observation.pack``): its active
tier, whether it ran a round, whether that round measured the active tier or ran a plain decode in its place,
the round's seconds, whether it sampled, a histogram of its requests' accepted draft counts, at a tree tier
two of what their chains accepted (``RoundResult.chain_accept_lengths``: the chains drafted to the tree's depth,
and those cut shorter and accepted whole), its drafter's tier-0 (shadow) checks, at a chain tier its checks one
draft past the chain (how many, how many accepted), a plain round's lookup seconds, whether it has unfinished
requests and whether its leader is shutting down (``stopping``: when every leader is, every rank leaves after
that same step, ``Merged.stopped``). One ``all_gather``
over all ranks hands everyone the same matrix; ``merge`` turns it into one round: the accepted counts of every
data-parallel group (a tensor-parallel group's ranks report the same round: its first rank speaks for it) as one
batch, costed at the slowest rank's round time (the ranks' rounds end together), sampled if any sampled. A rank
whose tier differs from the others' is a desynchronization and raises.

Thrashing is bounded by a minimum dwell: for ``min_dwell_rounds`` steps after a switch no measured round reaches
the policy (its decisions wait), so there are at most (steps per hour) / ``min_dwell_rounds`` switches an hour.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from specswap.worker.drafter import Shadow
from specswap.tier import Tier
from specswap.worker.worker import RoundResult

__all__ = ["AgreedController", "DEFAULT_MIN_DWELL_ROUNDS", "Observation", "TierDesync", "merge"]

DEFAULT_MIN_DWELL_ROUNDS = 8
_HEAD = 13  # tier, ran, measured, seconds, sampled, plain requests, has shadow, shadow steps, busy, checks past
#             the chain, of them accepted, lookup seconds, stopping


class TierDesync(RuntimeError):
    """Ranks entered a step with different active tiers (a bug: the agreement should make that impossible)."""


@dataclass
class Observation:
    """One rank's step, as the agreement sends it."""

    tier: int
    ran: bool = False
    measured: bool = False
    seconds: float = 0.0
    sampled: bool = False
    plain_requests: int = 0
    accepted: tuple[int, ...] = ()          # accepted drafts of each speculating request (measured rounds)
    shadow: Shadow | None = None
    busy: bool = False
    # a tree round's, per speculating request: (chain accepted, whether its chain was cut short and accepted whole)
    chain: tuple[tuple[int, bool], ...] = ()
    deep: tuple[int, int] = (0, 0)  # a chain round's checks one draft past it: (checked requests, accepted)
    lookup_seconds: float = 0.0     # a plain decode in a drafting tier's place: the drafter's lookups in it
    stopping: bool = False          # its leader shuts down (``Lockstep.stop``)

    @staticmethod
    def width(bins: int) -> int:
        """Floats in a packed observation."""
        return _HEAD + 4 * bins

    @classmethod
    def of(cls, tier: int, result: RoundResult | None, busy: bool, stopping: bool = False) -> "Observation":
        if result is None or not result.accept_lengths:
            return cls(tier, busy=busy, shadow=None if result is None else result.shadow, stopping=stopping)
        accepted = tuple(a for a, on in zip(result.accept_lengths, result.speculating) if on)
        # a chain cut short at d that accepted fewer than d drafts ended on a failure, as one drafted to the full
        # depth would: only the accepted count and whether it was cut short and accepted whole matter
        depth = result.ran.steps
        chain = () if result.chain_accept_lengths is None else tuple(
            (a, a == d < depth) for a, d, on in zip(result.chain_accept_lengths, result.chain_depths,
                                                    result.speculating) if on)
        checks = [] if result.deep_checks is None else [c for c, on in zip(result.deep_checks, result.speculating)
                                                          if on and c >= 0]
        return cls(tier, True, result.measured_tier, result.round_seconds, result.sampled,
                   len(result.accept_lengths), accepted, result.shadow, busy, chain, (len(checks), sum(checks)),
                   result.lookup_seconds, stopping)

    def pack(self, out: torch.Tensor, bins: int) -> torch.Tensor:
        """Into ``out`` [width(bins)] float64 (preallocated, reused every step; written through numpy's view)."""
        view = out.numpy()
        view[:] = 0.0
        shadow = self.shadow
        view[:_HEAD] = (self.tier, self.ran, self.measured, self.seconds, self.sampled, self.plain_requests,
                        shadow is not None, shadow.steps if shadow else 0, self.busy, *self.deep,
                        self.lookup_seconds, self.stopping)
        for value in self.accepted:
            view[_HEAD + min(value, bins - 1)] += 1
        if shadow is not None:
            for value in shadow.accept_lengths:
                view[_HEAD + bins + min(value, bins - 1)] += 1
        for accepted, cut in self.chain:
            view[_HEAD + (3 if cut else 2) * bins + min(accepted, bins - 1)] += 1
        return out


@dataclass
class Merged:
    """Every rank's step as one: what the policy is fed (the same on every rank)."""

    tier: int
    busy: bool
    result: RoundResult | None
    stopped: bool = False  # every data-parallel group's leader is shutting down: the job's last step


def merge(rows: torch.Tensor, tp_size: int, bins: int, rank: int = 0) -> Merged:
    """``rows`` [world, Observation.width(bins)]: every rank's packed ``Observation``, in rank order (read once, as
    lists)."""
    table = rows.tolist()
    tiers = [int(row[0]) for row in table]
    if len(set(tiers)) > 1:
        by_tier: dict[int, list[int]] = {}
        for r, tier in enumerate(tiers):
            by_tier.setdefault(tier, []).append(r)
        raise TierDesync(f"rank {rank}: ranks are at different tiers before the agreement: "
                         + "; ".join(f"ranks {ranks} at tier {tier}" for tier, ranks in sorted(by_tier.items())))
    tier = tiers[0]
    active = Tier.from_key(tier)
    busy = any(row[8] for row in table)
    speakers = table[::tp_size]                      # one rank per data-parallel group
    stopped = all(row[12] for row in speakers)
    shadow = _shadow(speakers, bins, rank)
    ran = [row for row in speakers if row[1]]
    if not ran:
        return Merged(tier, busy, None if shadow is None else RoundResult([], [], active, Tier(0), shadow=shadow),
                      stopped)
    # the slowest rank's round, tensor-parallel peers included (and, for a plain decode, that round's lookups)
    slowest = max((row for row in table if row[1]), key=lambda row: row[3])
    seconds = slowest[3]
    sampled = any(row[4] for row in ran)
    measured = [row for row in ran if row[2]]
    if measured:
        accepted = _values(measured, 0, bins)
        result = RoundResult([], accepted, active, active, seconds, sampled, [True] * len(accepted), shadow)
        whole = _values(measured, 2, bins)
        cut = _values(measured, 3, bins)
        if len(whole) + len(cut) == len(accepted):  # every measured group's tree round told its chain
            result.chain_accept_lengths = whole + cut
            result.chain_depths = [active.steps] * len(whole) + cut
        checked, hits = (int(sum(row[column] for row in measured)) for column in (9, 10))
        if checked:  # chain rounds' checks one draft past the chain, as counts (which request does not matter)
            result.deep_checks = [1] * hits + [0] * (checked - hits)
    else:  # every rank that ran decoded plainly in the drafting tier's place
        n = int(sum(row[5] for row in ran))
        result = RoundResult([], [0] * n, active, Tier(0), seconds, sampled, [False] * n, shadow,
                             lookup_seconds=slowest[11])
    return Merged(tier, busy, result, stopped)


def _values(rows: list[list[float]], histogram: int, bins: int) -> list[int]:
    """The values counted by the rows' packed histogram number ``histogram`` (0: accepted drafts, 1: shadow
    checks, 2 and 3: a tree's chains drafted whole and cut short), summed over the rows."""
    start = _HEAD + histogram * bins
    counts = [sum(row[start + b] for row in rows) for b in range(bins)]
    return [value for value, count in enumerate(counts) for _ in range(int(round(count)))]


def _shadow(speakers: list[list[float]], bins: int, rank: int) -> Shadow | None:
    with_shadow = [row for row in speakers if row[6]]
    if not with_shadow:
        return None
    steps = {int(row[7]) for row in with_shadow}
    if len(steps) > 1:
        raise TierDesync(f"rank {rank}: ranks report tier-0 checks for different tiers {sorted(steps)}")
    return Shadow(_values(with_shadow, 1, bins), steps.pop())


class AgreedController:
    """An ``AdaptiveController`` whose observations are every rank's, merged (``merge``), one all-gather a step.

    ``end_step(result, busy, stopping)`` is called by every rank once per engine step, with its round's result
    (None when it ran none), whether it has unfinished requests and whether its leader is shutting down;
    ``peers_busy`` is then whether any rank has, ``stopped`` whether every leader is.
    """

    def __init__(self, controller, group, max_steps: int, min_dwell_rounds: int = DEFAULT_MIN_DWELL_ROUNDS):
        if isinstance(min_dwell_rounds, bool) or not isinstance(min_dwell_rounds, int) or min_dwell_rounds < 0:
            raise ValueError(f"min_dwell_rounds must be an int >= 0; got {min_dwell_rounds!r}")
        self.controller = controller
        self.group = group
        self.bins = max_steps + 1
        self.min_dwell_rounds = min_dwell_rounds
        width = Observation.width(self.bins)
        self._mine = torch.zeros(width, dtype=torch.float64)
        self._all = torch.zeros(group.world_size * width, dtype=torch.float64)
        self.peers_busy = True  # unknown until the first step: every rank takes part in it
        self.stopped = False    # every leader shut down: every rank leaves after this step
        self.steps = 0
        self._last_switch_step: int | None = None
        self.agreement_seconds = 0.0  # time spent in the all-gather (waiting for the slowest rank included)
        self._started = time.monotonic()

    def __getattr__(self, name):  # the wrapped controller's properties (current_tier, ema, ...)
        if name == "controller":  # not set yet (a half-built or unpickled instance): no recursion
            raise AttributeError(name)
        return getattr(self.controller, name)

    def end_step(self, result: RoundResult | None, busy: bool, stopping: bool = False) -> int | None:
        """Agree on this step's observation and feed it; returns the tier switched to (the next round's), or None."""
        self.steps += 1
        Observation.of(self.controller.current_tier, result, busy, stopping).pack(self._mine, self.bins)
        start = time.perf_counter()
        self.group.all_gather_into(self._all, self._mine, group="world")
        self.agreement_seconds += time.perf_counter() - start
        merged = merge(self._all.view(self.group.world_size, -1), self.group.tp_size, self.bins, self.group.rank)
        self.peers_busy, self.stopped = merged.busy, merged.stopped
        if merged.result is None:
            return None
        dwelling = self._last_switch_step is not None and self.steps - self._last_switch_step <= self.min_dwell_rounds
        observed = merged.result
        if dwelling and observed.accept_lengths:  # the round waits out the dwell: its tier-0 checks alone
            observed = RoundResult([], [], observed.tier, observed.tier, shadow=observed.shadow)
        switched = self.controller.observe(observed)
        if switched is not None:
            self._last_switch_step = self.steps
        return switched

    def stats(self) -> dict:
        stats = self.controller.stats()
        hours = (time.monotonic() - self._started) / 3600
        stats["switches_per_hour"] = stats["num_switches"] / hours if hours > 0 else 0.0
        stats["min_dwell_rounds"] = self.min_dwell_rounds
        stats["agreement_seconds"] = self.agreement_seconds
        stats["agreement_steps"] = self.steps
        return stats
