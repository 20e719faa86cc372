"""The adaptive controller: the policy (C++, or a Python class behind it) over a worker's state pool (C++).

The worker builds one runtime state per tier at start-up and registers it in
its pool; the controller is handed that pool. After each round its owner (the
engine) hands it the round's result, ``observe(result)``, which reaches the
policy as one ``RoundObservation``; when the policy moves, the controller
activates the new tier in the pool (one atomic store), and the worker's next
round acquires it. A switch is visible here and only here; nothing is built or
called back after start-up.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Mapping

from specswap._core import AdaptiveSpeculativeParams, RoundObservation, StatePool
from specswap.adaptive_config import ConfigSource, load_adaptive_config
from specswap.tier import Tier


# the most of a verify's own seconds that the lookups of the plain rounds before it may add to it
CARRY_LIMIT = 0.25


class AdaptiveController:
    """Owns the policy for one worker's state pool, whose active tier is the start-up tier.

    ``shadows``: the drafter reports what its drafts would have accepted at tier 0 (``RoundResult.shadow``), so
    the policy expects such observations (NGRAM). ``row_costs``: the verify's relative cost per row count
    ({rows: cost}, ``worker.row_cost``), which the goodput policy prices untimed tiers from (``set_row_costs``).
    ``policy``: under ``"policy": "python"``, the policy's class (instead of the config's ``python_policy``):
    ``policy(tiers, start)`` with the candidate ``Tier``s in the policy's order and the start-up one, whose
    ``observe(round)`` gets every round's ``RoundObservation`` and returns the tier to run next or None
    (docs/policy.md).
    """

    def __init__(self, pool: StatePool, config: ConfigSource = None, shadows: bool = False,
                 row_costs: Mapping[int, float] | None = None, policy: Callable[..., Any] | None = None):
        self.pool = pool
        self.config = load_adaptive_config(config)
        start = pool.active_tier
        if start is None:
            raise ValueError("the state pool has no active tier; activate the start-up tier before adapting")
        self.params = AdaptiveSpeculativeParams(int(start), self.config, python_policy(self.config, policy))
        if shadows:
            self.params.expect_shadows()
        missing = [key for key in self.params.candidate_tiers if key not in pool]
        if missing:
            raise ValueError(f"candidate tiers {missing} have no state in the pool (it holds {pool.tiers()}); build "
                             f"the worker with every candidate in tiers=")
        # the lookups of plain decodes run in the active tier's place since its last verify: charged to its next
        # verify, so a tier's cost is what being at it costs (see observe)
        self._carried_seconds, self._carried_tier = 0.0, None
        self._shapes = [Tier.from_key(key) for key in self.params.candidate_tiers]  # for RoundResult.tier_surcharge
        pool.activate(self.params.current_tier)
        if row_costs:
            self.set_row_costs(row_costs)

    def set_row_costs(self, row_costs: Mapping[int, float] | None) -> None:
        """The verify's relative cost per row count ({rows: cost}, 1 among the rows; None: none). The goodput
        policy then prices a tier never timed as ``cost_prior_slope`` per draft step plus the verify at its row
        count (a chain's steps + 1, a tree's nodes), interpolated between the counts given (docs/policy.md).
        ValueError on a bad table. Start-up only: it allocates."""
        self.params.set_row_costs(None if row_costs is None else {int(r): float(c) for r, c in row_costs.items()})

    @property
    def row_costs(self) -> dict[int, float]:
        """The table set_row_costs() gave, divided by the 1-row cost ({} if none)."""
        return dict(self.params.row_costs)

    @property
    def candidate_tiers(self) -> list[int]:
        """The tiers the policy chooses among, by key: a chain's step count, a tree's encoded shape (_core.tier_key),
        ordered by verified drafts."""
        return list(self.params.candidate_tiers)

    @property
    def current_tier(self) -> int:
        """The active tier's key."""
        return self.params.current_tier

    @property
    def ema(self) -> float:
        return self.params.ema

    @property
    def checks_pay(self) -> bool:
        """Whether a drafting tier could pay at the last round's costs were every draft accepted (the drafter's
        tier-0 checks pause while not: ``Drafter.pause_checks``)."""
        return self.params.drafting_can_pay()

    @property
    def alpha(self) -> float:
        return self.params.alpha

    def observe(self, result) -> int | None:
        """Feed one round's result (``worker.RoundResult``) to the policy as one ``RoundObservation``: the
        drafter's tier-0 checks (shadow observations) and either the verify of the active tier (its accepted draft
        counts, bonus excluded, of the requests that speculated; the round's wall time; whether it sampled; at a
        tree tier, what its chain would have accepted, ``RoundResult.chain_accept_lengths``; at a chain tier, its
        checks one draft past the chain, ``RoundResult.deep_checks``), or, for a plain decode run in the drafting
        tier's place, that decode's cost less the drafter's lookup as tier 0's. The lookups of such plain decodes
        are a cost of the drafting tier (tier 0 does not pay them), so they are added to its next verify's
        seconds: its predicted goodput is then the one being at it yields, plain rounds included. A result with
        no request (``accept_lengths`` empty) gives its shadows alone. Returns the tier the pool switched to, or
        None when it stays; the switch applies from the next round."""
        if self._carried_tier != result.tier:
            self._carried_seconds, self._carried_tier = 0.0, result.tier
        shadow = {} if result.shadow is None else {"shadow_accept_lengths": result.shadow.accept_lengths,
                                                   "shadow_steps": result.shadow.steps}
        if not result.accept_lengths:
            round_ = RoundObservation(**shadow)
        elif not result.measured_tier:
            round_ = RoundObservation(plain_requests=len(result.accept_lengths), sampled=result.sampled,
                                      round_seconds=result.round_seconds - result.lookup_seconds, **shadow)
            self._carried_seconds += result.lookup_seconds
        else:
            round_ = self._verify(result, shadow)
        if result.tier_surcharge is not None:  # a cost kept out of the rounds' timings, at its current rate
            self.params.set_tier_surcharges([result.tier_surcharge(shape) for shape in self._shapes])
        if not self.params.observe(round_):
            return None
        self.pool.activate(self.params.current_tier)
        return self.params.current_tier

    def _verify(self, result, shadow: dict[str, Any]) -> RoundObservation:
        """A round that verified the active tier, as the policy reads it: the requests that speculated only."""
        # at most a quarter of the verify's own time: well below the cost model's outlier bar (1.6x), which
        # would drop the round (a long run of plain rounds then charges the tier less than it cost)
        seconds = result.round_seconds + min(self._carried_seconds, CARRY_LIMIT * result.round_seconds)
        if result.tier_surcharge is not None:  # priced at decision time instead (set_tier_surcharges in observe)
            seconds -= result.surcharge_seconds
        self._carried_seconds = 0.0
        on = [i for i, speculated in enumerate(result.speculating) if speculated]
        parts = {}
        if result.chain_accept_lengths is not None:  # a tree round: what its chain would have accepted
            parts["chain_accept_lengths"] = [result.chain_accept_lengths[i] for i in on]
            parts["chain_depths"] = [result.chain_depths[i] for i in on]
        if result.deep_checks is not None:  # a chain round's checks one draft past it
            parts["deep_checks"] = [c for c, speculated in zip(result.deep_checks, result.speculating) if speculated]
        accepted = [a for a, speculated in zip(result.accept_lengths, result.speculating) if speculated]
        return RoundObservation(accept_lengths=accepted, round_seconds=seconds, sampled=result.sampled, **parts,
                                **shadow)

    def stats(self) -> dict[str, Any]:
        return {
            "policy": self.config.policy,
            "current_steps": self.params.current_tier,
            "ema": self.params.ema,
            "alpha": self.params.alpha,
            "cost_estimates": self.params.cost_estimates(),  # tier -> seconds per round, last batch size
            "measured_costs": self.params.measured_costs(),  # greedy/sampled -> batch bucket -> tier -> seconds
            "num_batches": self.params.num_batches,
            "num_switches": self.pool.num_switches,
            "candidate_steps": self.candidate_tiers,  # every candidate's key (a tree's: _core.tier_key)
            "candidate_trees": [list(tree) for tree in self.config.candidate_trees],
            "row_costs": self.row_costs,  # rows -> the verify's relative cost (the untimed tiers' prior), {} if none
            "tiers": [row for row in self.pool.stats() if row["speculative_num_steps"] in self.candidate_tiers],
        }


def python_policy(config, policy: Callable[..., Any] | None) -> Callable[[list[int], int], Any] | None:
    """The factory ``AdaptiveSpeculativeParams`` builds a ``"policy": "python"`` policy with: ``policy``, or the class
    the config's ``python_policy`` names ("module:Class"), called with ``Tier``s. None for the C++ policies."""
    if config.policy != "python":
        if policy is not None:
            raise ValueError(f"policy= is for the adaptive config's \"policy\": \"python\"; this config's is "
                             f"{config.policy!r}")
        return None
    if policy is not None and config.python_policy:
        raise ValueError(f"give the Python policy once: policy={policy!r} and python_policy "
                         f"{config.python_policy!r} both name one")
    if policy is None:
        if not config.python_policy:
            raise ValueError('"policy": "python" needs "python_policy": "module:Class" (or AdaptiveController(policy=))')
        module, _, name = config.python_policy.partition(":")
        try:
            policy = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"python_policy {config.python_policy!r}: {exc}") from exc
    return lambda tiers, start: policy([Tier.from_key(key) for key in tiers], Tier.from_key(start))
