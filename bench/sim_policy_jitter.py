"""How round-time jitter moves the goodput policy between two close tiers at batch 1 (a simulation, no model).

The C++ policy is fed synthetic rounds: EAGLE on sampled prose, as measured on Gemma 3 270M (docs/gemma.md):
per-position acceptance 0.37, 0.30, 0.15, then 0.10-0.12; a tier-1 round 85 ms, tier 3 103 ms, tier 7 140 ms,
each multiplied by log-normal jitter. Tier 1 is the best tier by ~10%. Prints the share of rounds at tier 1 and
the throughput relative to always using tier 1, per jitter level and ema_alpha, mean of 5 seeds.

    PYTHONPATH=python python bench/sim_policy_jitter.py
"""

from __future__ import annotations

import argparse
import math
import random

from specswap import AdaptiveSpeculativeParams, load_adaptive_config

RATES = [0.37, 0.30, 0.15, 0.12, 0.10, 0.10, 0.10]  # P(accept position i | accepted the ones before)
COSTS = {1: 0.085, 3: 0.103, 7: 0.140}              # seconds per round
POLICY = {"policy": "goodput", "acceptance_model": "positional"}


def simulate(jitter: float, ema_alpha: float, rounds: int, seed: int) -> tuple[float, float]:
    """(share of rounds at tier 1, throughput / always-tier-1 throughput)."""
    rng = random.Random(seed)
    params = AdaptiveSpeculativeParams(3, load_adaptive_config({**POLICY, "ema_alpha": ema_alpha}))
    at_one, tokens, seconds = 0, 0, 0.0
    for _ in range(rounds):
        steps = params.current_steps
        accepted = 0
        while accepted < steps and rng.random() < RATES[accepted]:
            accepted += 1
        at_one += steps == 1
        tokens += accepted + 1
        seconds += COSTS[steps]
        params.update([accepted], COSTS[steps] * math.exp(rng.gauss(0.0, jitter)), True)
    return at_one / rounds, (tokens / seconds) / ((1 + RATES[0]) / COSTS[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jitter", type=float, nargs="+", default=[0.05, 0.15, 0.3])
    parser.add_argument("--ema-alpha", type=float, nargs="+", default=[0.2, 0.1, 0.05])
    parser.add_argument("--rounds", type=int, default=800)
    parser.add_argument("--seeds", type=int, default=5)
    args = parser.parse_args()
    for jitter in args.jitter:
        for ema_alpha in args.ema_alpha:
            runs = [simulate(jitter, ema_alpha, args.rounds, seed) for seed in range(args.seeds)]
            share = sum(r[0] for r in runs) / len(runs)
            ratio = sum(r[1] for r in runs) / len(runs)
            print(f"jitter {jitter:.2f}  ema_alpha {ema_alpha:.2f}  rounds at tier 1 {share:.2f}  "
                  f"throughput / tier 1 {ratio:.3f}")


if __name__ == "__main__":
    main()
