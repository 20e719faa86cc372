"""How noise moves the goodput policy between close tiers (a simulation, no model).

The C++ policy is fed synthetic rounds shaped after EAGLE on Gemma 3 270M at batch 1 and 4 (bench/bench_engine.py
on the ``tune`` prompt set's code and prose, docs/gemma.md): per-position acceptance rates and seconds per round
per tier, derived from the measured tokens per second and accepted tokens per verify of each static tier. It is a
tuning tool: its scenarios come from the prompts the policy is tuned on, never from the report set. Every request draws its accepted length from the rates (that is
the acceptance noise: at batch 1 one update is one request), and every round time is multiplied by log-normal
jitter (independent or drifting) and, optionally, by slow spells. Prints, per scenario and noise, the share of
rounds at the best static tier and the throughput relative to always using it, mean over seeds, for each policy
config.

    PYTHONPATH=python python bench/sim_policy_jitter.py
    PYTHONPATH=python python bench/sim_policy_jitter.py --configs '{"ema_alpha": 0.1}' '{}'
"""

from __future__ import annotations

import argparse
import json
import math
import random
from dataclasses import dataclass

from specswap import AdaptiveSpeculativeParams, load_adaptive_config

POLICY = {"policy": "goodput", "acceptance_model": "positional"}


@dataclass(frozen=True)
class Scenario:
    rates: tuple[float, ...]   # P(accept draft position i | accepted the ones before)
    costs: dict[int, float]    # seconds per round per tier
    batch: int
    sampled: bool

    def tokens(self, steps: int) -> float:
        """Expected tokens per request and round at a static tier, bonus included."""
        total, survive = 1.0, 1.0
        for rate in self.rates[:steps]:
            survive *= rate
            total += survive
        return total

    def best(self) -> int:
        return max(self.costs, key=lambda k: self.tokens(k) / self.costs[k])


SCENARIOS = {
    # sampled prose (T = 1): tier 1 best by ~10%
    "prose b1": Scenario((0.37, 0.30, 0.15, 0.12, 0.10, 0.10, 0.10), {1: 0.085, 3: 0.103, 7: 0.140}, 1, True),
    # greedy code: tier 3 best by ~17%
    "code b1": Scenario((0.59, 0.78, 0.50, 0.40, 0.30, 0.30, 0.30), {1: 0.086, 3: 0.105, 7: 0.134}, 1, False),
    # greedy code at batch 4: tiers 1 and 3 within ~4%
    "code b4": Scenario((0.59, 0.78, 0.50, 0.40, 0.30, 0.30, 0.30), {1: 0.120, 3: 0.165, 7: 0.237}, 4, False),
    "prose b4": Scenario((0.37, 0.30, 0.15, 0.12, 0.10, 0.10, 0.10), {1: 0.134, 3: 0.180, 7: 0.269}, 4, True),
}


SPELL_SLOWDOWN = 2.5   # round times in a slow spell (a trace of Gemma EAGLE on this CPU: ~2.5x for ~80 rounds)
SPELL_START = 1 / 300  # chance per round that a slow spell starts
SPELL_END = 1 / 80     # chance per round that it ends


def simulate(scenario: Scenario, jitter: float, overrides: dict, rounds: int, seed: int,
             correlation: float = 0.0, spells: bool = False) -> tuple[float, float]:
    """(share of rounds at the best static tier, throughput / the best static tier's throughput). The log of the
    jitter factor is an AR(1) series with this round-to-round correlation (0: independent rounds; near 1: the
    load on the machine drifts, so a tier timed a while ago was timed under another load). ``spells``: on top,
    slow spells that make every round SPELL_SLOWDOWN times slower."""
    rng = random.Random(seed)
    load = rng.gauss(0.0, jitter)
    slow = False
    params = AdaptiveSpeculativeParams(3, load_adaptive_config({**POLICY, **overrides}))
    best = scenario.best()
    at_best, tokens, seconds = 0, 0, 0.0
    for _ in range(rounds):
        steps = params.current_tier
        lengths = []
        for _ in range(scenario.batch):
            accepted = 0
            while accepted < steps and rng.random() < scenario.rates[accepted]:
                accepted += 1
            lengths.append(accepted)
        load = correlation * load + math.sqrt(1.0 - correlation**2) * rng.gauss(0.0, jitter)
        slow = spells and (rng.random() > SPELL_END if slow else rng.random() < SPELL_START)
        at_best += steps == best
        tokens += sum(lengths) + scenario.batch
        seconds += scenario.costs[steps]  # the load slows every tier alike: only the policy sees it
        spell = SPELL_SLOWDOWN if slow else 1.0
        params.update(lengths, scenario.costs[steps] * spell * math.exp(load), scenario.sampled)
    best_rate = scenario.batch * scenario.tokens(best) / scenario.costs[best]
    return at_best / rounds, (tokens / seconds) / best_rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scenarios", nargs="+", choices=sorted(SCENARIOS), default=list(SCENARIOS))
    parser.add_argument("--jitter", type=float, nargs="+", default=[0.05, 0.15, 0.3])
    parser.add_argument("--correlation", type=float, nargs="+", default=[0.0, 0.95],
                        help="round-to-round correlation of the jitter (0: independent; 0.95: drifting load)")
    parser.add_argument("--spells", type=int, nargs="+", choices=[0, 1], default=[0, 1],
                        help="1: slow spells on top of the jitter (every round 2.5x slower for ~80 rounds)")
    parser.add_argument("--configs", type=json.loads, nargs="+", default=[{}],
                        help="policy config overrides (JSON objects) to compare, on top of goodput + positional")
    parser.add_argument("--rounds", type=int, default=800)
    parser.add_argument("--seeds", type=int, default=5)
    args = parser.parse_args()
    for name in args.scenarios:
        scenario = SCENARIOS[name]
        for spells in args.spells:
            for correlation in args.correlation:
                for jitter in args.jitter:
                    for overrides in args.configs:
                        runs = [simulate(scenario, jitter, overrides, args.rounds, seed, correlation, bool(spells))
                                for seed in range(args.seeds)]
                        share = sum(r[0] for r in runs) / len(runs)
                        ratio = sum(r[1] for r in runs) / len(runs)
                        print(f"{name:9s} jitter {jitter:.2f} corr {correlation:.2f} spells {spells}  "
                              f"{json.dumps(overrides):30s} rounds at best tier {scenario.best()}: {share:.2f}  "
                              f"throughput / best static {ratio:.3f}", flush=True)


if __name__ == "__main__":
    main()
