"""The adaptive controller: prebuilds one runtime state per tier into the C++
state pool and, fed each round's measurements, returns the state of the tier
the policy switches to. Whoever runs the rounds (the engine) applies it
between rounds; the controller never calls into a worker mid-round."""

from __future__ import annotations

from typing import Any, Protocol, Sequence, runtime_checkable

from specswap._core import AdaptiveSpeculativeParams, SpecRuntimeState, StatePool
from specswap.config import ConfigSource, load_adaptive_config


@runtime_checkable
class AdaptiveSpecWorker(Protocol):
    """What a worker offers the controller (building states) and its owner (applying them)."""

    speculative_num_steps: int  # the initial tier

    def build_adaptive_runtime_state(
        self, speculative_num_steps: int, speculative_num_draft_tokens: int
    ) -> SpecRuntimeState: ...

    def apply_runtime_state(self, state: SpecRuntimeState) -> None: ...


class AdaptiveController:
    """Owns the policy (C++) and the state pool (C++) for one worker.

    The worker's owner calls on_verify_complete() once a decode round has
    returned and applies the state it returns (``worker.apply_runtime_state``);
    a switch therefore takes effect from the next round.
    """

    def __init__(self, worker: AdaptiveSpecWorker, config: ConfigSource = None):
        if not callable(getattr(worker, "build_adaptive_runtime_state", None)):
            raise TypeError(f"{type(worker).__name__} does not implement "
                            f"AdaptiveSpecWorker.build_adaptive_runtime_state")
        self.worker = worker
        self.config = load_adaptive_config(config)
        self.params = AdaptiveSpeculativeParams(int(worker.speculative_num_steps), self.config)
        if getattr(getattr(worker, "drafter", None), "shadow_steps", 0):  # NGRAM: it sees at tier 0
            self.params.expect_shadows()
        self.pool = StatePool()

    @property
    def candidate_steps(self) -> list[int]:
        return list(self.params.candidate_steps)

    @property
    def current_steps(self) -> int:
        return self.params.current_steps

    @property
    def ema(self) -> float:
        return self.params.ema

    def register(self, state: SpecRuntimeState) -> None:
        """Add a state built elsewhere (for example the worker's start-up tier)."""
        self._check_state(state, state.speculative_num_steps)
        self.pool.register(state)

    def init_states(self) -> SpecRuntimeState:
        """Build one state per candidate tier (skipping registered ones), activate the current tier and return
        its state, for the owner to apply."""
        for steps in self.params.candidate_steps:
            if steps in self.pool:
                continue
            state = self.worker.build_adaptive_runtime_state(steps, steps + 1)
            self._check_state(state, steps)
            self.pool.register(state)
        return self._activate(self.params.current_steps)

    @property
    def alpha(self) -> float:
        return self.params.alpha

    def on_verify_complete(self, accept_lengths: Sequence[int], round_seconds: float | None = None,
                           sampled: bool = False) -> SpecRuntimeState | None:
        """Feed one verify's accepted draft counts (bonus excluded), the round's wall time in seconds (None:
        untimed; the goodput policy then falls back to its cost prior) and whether the round sampled (not
        all-greedy: goodput keeps separate cost tables). Returns the state of the tier the policy switched to,
        for the owner to apply before the next round, or None when it stays."""
        if not self.params.update(accept_lengths, round_seconds, sampled):
            return None
        return self._activate(self.params.current_steps)

    def on_plain_round(self, batch_size: int, round_seconds: float, sampled: bool = False) -> None:
        """Feed a plain decode of ``batch_size`` requests run in place of the current drafting tier (NGRAM with
        nothing to look up), timed: the goodput policy learns it as tier 0's cost beside the running tier's;
        never a switch by itself."""
        self.params.plain_round(batch_size, round_seconds, sampled)

    def on_shadow(self, accept_lengths: Sequence[int], steps: int) -> None:
        """Feed what deterministic drafts of ``steps`` tokens would have accepted per request, measured against
        the tokens emitted since (NGRAM at tier 0, where nothing is verified); never a switch by itself."""
        self.params.shadow(accept_lengths, steps)

    def stats(self) -> dict[str, Any]:
        return {
            "policy": self.config.policy,
            "current_steps": self.params.current_steps,
            "ema": self.params.ema,
            "alpha": self.params.alpha,
            "cost_estimates": self.params.cost_estimates(),  # tier -> seconds per round, last batch size
            "measured_costs": self.params.measured_costs(),  # greedy/sampled -> batch bucket -> tier -> seconds
            "num_batches": self.params.num_batches,
            "num_switches": self.pool.num_switches,
            "candidate_steps": self.candidate_steps,
            "tiers": self.pool.stats(),
        }

    def _activate(self, steps: int) -> SpecRuntimeState:
        self.pool.activate(steps)
        return self.pool.acquire()

    @staticmethod
    def _check_state(state: Any, steps: int) -> None:
        if not isinstance(state, SpecRuntimeState):
            raise TypeError(f"build_adaptive_runtime_state must return a SpecRuntimeState, got {type(state).__name__}")
        if state.speculative_num_steps != steps:
            raise ValueError(
                f"build_adaptive_runtime_state({steps}, ...) returned a state for {state.speculative_num_steps} steps"
            )
