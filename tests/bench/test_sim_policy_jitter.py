"""bench/sim_policy_jitter.py: the simulation behind docs/gemma.md's note on round-time jitter at batch 1."""

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "sim_policy_jitter.py"


def load():
    spec = importlib.util.spec_from_file_location("sim_policy_jitter", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_jitter_moves_the_policy_off_the_best_tier():
    sim = load()
    steady_share, steady_ratio = sim.simulate(jitter=0.0, ema_alpha=0.2, rounds=600, seed=0)
    noisy_share, noisy_ratio = sim.simulate(jitter=0.3, ema_alpha=0.2, rounds=600, seed=0)
    assert steady_share > 0.8 and steady_ratio > 0.97   # tier 1 is best and the policy mostly holds it
    assert noisy_share < steady_share and noisy_ratio < steady_ratio
