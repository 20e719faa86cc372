"""bench/sim_policy_jitter.py: the simulation behind docs/policy.md's note on noise at batch 1."""

from scripts import load_script


def load():
    return load_script("sim_policy_jitter")


def mean_run(sim, name, jitter, seeds=8, correlation=0.0):
    runs = [sim.simulate(sim.SCENARIOS[name], jitter, {}, 600, seed, correlation) for seed in range(seeds)]
    return sum(r[0] for r in runs) / seeds, sum(r[1] for r in runs) / seeds


def test_scenarios_have_the_measured_best_tiers():
    sim = load()
    assert {name: s.best() for name, s in sim.SCENARIOS.items()} == {
        "prose b1": 1, "code b1": 3, "code b4": 3, "prose b4": 1}


def test_policy_holds_the_best_tier_at_batch_one_and_jitter_costs_throughput():
    sim = load()
    for name in ("prose b1", "code b1"):
        steady_share, steady_ratio = mean_run(sim, name, 0.0)
        noisy_share, noisy_ratio = mean_run(sim, name, 0.3)
        assert steady_share > 0.85 and steady_ratio > 0.97, name
        assert noisy_ratio < steady_ratio, name


def test_drifting_load_is_simulated():
    sim = load()
    # the same seed with and without correlated load: the policy sees different round times
    assert sim.simulate(sim.SCENARIOS["code b4"], 0.3, {}, 300, 0, 0.0) != \
        sim.simulate(sim.SCENARIOS["code b4"], 0.3, {}, 300, 0, 0.95)
