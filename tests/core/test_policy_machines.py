"""The default policy across the CPU kinds we have seen: each trace replayed at a machine's own forward costs.

Round costs come from the native Gemma 3 270M forward per row count at one thread (bench/bench_gemma_forward.py)
on the AVX2 EPYC (results/gemma-forward-t1-avx2-native.json), the AVX-512 EPYC (results/gemma-forward-t1.json) and
the AMX Xeon (results/gemma-forward-t1-xeon-amx.json): a round of b requests at chain k costs the forward of
b (k + 1) rows (interpolated; beyond 16 rows along the last segment) plus the drafter's share
(``row_cost.DRAFT_COSTS``) over the forward of b rows, times log-normal jitter. The policy is the default one
(``adaptive_config.DEFAULT_POLICY``, its tiers ``auto_steps`` of the table it is given), fed what the drafters
feed it (tier-0 shadows included), and is given either the machine's own table or a noisy one (the Xeon's
non-monotone start-up measurement; another machine's; the true one with 15% noise).

Traces: token streams (a greedy drafter's drafts are right or wrong at a text position whatever the tier, so
one stream replays at every tier) of a lookup drafter (bursts: a match runs on) and a model drafter (each
draft right at a rate), one phase or low/high/low/high as the bench's transition workload; and per-position
rates measured for EAGLE on Gemma (bench/sim_policy_jitter.py's scenarios, the tune prompts), drawn per round.
Throughput is tokens over the machine's seconds, compared with the best fixed tier among the policy's own tiers
on the same trace and costs.
"""

import itertools
import json
import math
import random
from pathlib import Path

import pytest

from specswap import AdaptiveSpeculativeParams
from specswap.adaptive_config import engine_adaptive_config
from specswap.worker.row_cost import DRAFT_COSTS, RowCosts

RESULTS = Path(__file__).resolve().parents[2] / "results"
MACHINES = {"avx2-epyc": "gemma-forward-t1-avx2-native.json", "avx512-epyc": "gemma-forward-t1.json",
            "amx-xeon": "gemma-forward-t1-xeon-amx.json"}
XEON_START_UP = {1: 1.0, 2: 1.19, 4: 1.13, 6: 1.26, 8: 1.42}  # the Xeon's 1.7 s start-up table (not monotone)
ONE_ROW_MS = 30.0  # a plain decode's seconds only set the scale: the policy reads ratios


def forward_costs(name):
    """{rows: forward over one row} of the machine's native weights."""
    data = json.loads((RESULTS / MACHINES[name]).read_text())
    return {row["tokens"]: row["forward_ratio_to_one"] for row in data["results"] if row["weights"] == "native"}


def at(table, rows):
    counts = sorted(table)
    if rows in table:
        return table[rows]
    if rows > counts[-1]:
        a, b = counts[-2:]
        return table[b] + (table[b] - table[a]) * (rows - b) / (b - a)
    low = max(c for c in counts if c < rows)
    high = min(c for c in counts if c > rows)
    return table[low] + (table[high] - table[low]) * (rows - low) / (high - low)


def round_seconds(table, steps, batch, model_drafter):
    per_round, per_step = DRAFT_COSTS[model_drafter]
    drafting = (per_round + per_step * steps) * at(table, batch) if steps else 0.0
    return ONE_ROW_MS * 1e-3 * (at(table, batch * (steps + 1)) + drafting)


# ---- traces --------------------------------------------------------------------------------------------------


def stream(kind, level, tokens, rng):
    """Whether a draft of each text position is right. "lookup": a two-state chain (a match, once found, runs on;
    ``level`` the share of positions in one); "model": each position right at ``level``."""
    if kind == "model":
        return [rng.random() < level for _ in range(tokens)]
    out, matching = [], False
    for _ in range(tokens):
        matching = rng.random() < (0.97 if matching else level * 0.03 / max(1e-9, 1.0 - level) if level < 1 else 1)
        out.append(matching)
    return out


PHASES = {  # name -> drafter kind, [(level, tokens per request) per phase]
    "lookup low": ("lookup", [(0.1, 600)]),
    "lookup high": ("lookup", [(0.97, 600)]),
    "lookup mid": ("lookup", [(0.5, 600)]),
    "lookup mid-high": ("lookup", [(0.7, 600)]),
    "lookup transition": ("lookup", [(0.1, 300), (0.95, 300), (0.1, 300), (0.95, 300)]),
    "model low": ("model", [(0.3, 600)]),
    "model high": ("model", [(0.8, 600)]),
    "model transition": ("model", [(0.35, 300), (0.8, 300), (0.35, 300), (0.8, 300)]),
}
# per-position acceptance measured for EAGLE on Gemma 3 270M (tune prompts; bench/sim_policy_jitter.py)
POSITIONAL = {"eagle code": ((0.59, 0.78, 0.50, 0.40, 0.30, 0.30, 0.30), False),
              "eagle prose": ((0.37, 0.30, 0.15, 0.12, 0.10, 0.10, 0.10), True)}


class Requests:
    """``batch`` requests each reading its own token streams, phase after phase (a phase ends for all when every
    request has passed its tokens)."""

    def __init__(self, name, batch, seed):
        kind, phases = PHASES[name]
        rng = random.Random(seed)
        self.phases = [[stream(kind, level, tokens, rng) for _ in range(batch)] for level, tokens in phases]
        self.phase, self.at = 0, [0] * batch

    def done(self):
        return self.phase == len(self.phases)

    def round(self, steps):
        """Accepted drafts of each request at ``steps``, and the tokens emitted."""
        accepted = []
        for i, position in enumerate(self.at):
            text = self.phases[self.phase][i]
            run = 0
            while run < steps and position + run < len(text) and text[position + run]:
                run += 1
            accepted.append(run)
            self.at[i] = min(len(text), position + run + 1)
        emitted = sum(a + 1 for a in accepted)
        if all(position >= len(text) for position, text in zip(self.at, self.phases[self.phase])):
            self.phase, self.at = self.phase + 1, [0] * len(self.at)
        return accepted, emitted

    def shadow(self, steps):
        """What ``steps`` drafts would have accepted for each request at its position (nothing moves)."""
        out = []
        for i, position in enumerate(self.at):
            text = self.phases[self.phase][i]
            run = 0
            while run < steps and position + run < len(text) and text[position + run]:
                run += 1
            out.append(run)
        return out


def default_params(model_drafter, table):
    setting = engine_adaptive_config(None, model_drafter=model_drafter)
    config = setting.for_machine(None if table is None else RowCosts(table, "given"))
    params = AdaptiveSpeculativeParams(3 if 3 in config.candidate_steps else 1, config)
    params.expect_shadows()  # every built-in drafter announces tier-0 shadows
    if table is not None:
        params.set_row_costs(table)
    return params


def replay(name, machine, table, *, batch=2, seed=0, jitter=0.05, steps=None):
    """(tokens per second, tiers per round, the policy) of the default policy (``steps``: a fixed tier) over trace ``name``
    at ``machine``'s costs, the policy given ``table``."""
    kind = PHASES[name][0]
    model_drafter = kind == "model"
    requests, rng = Requests(name, batch, seed), random.Random(seed + 1)
    params = None if steps is not None else default_params(model_drafter, table)
    tokens, seconds, tiers, since_drafting = 0, 0.0, [], 0
    while not requests.done():
        tier = steps if params is None else params.current_tier
        tiers.append(tier)
        cost = round_seconds(machine, tier, batch, model_drafter)
        if params is not None and tier == 0:  # tier-0 checks: NGRAM every 4th round at its deepest tier; model
            since_drafting += 1                # drafters one draft, the first 8 rounds after drafting then every 8th
            deepest = max(params.candidate_tiers)
            if not model_drafter and since_drafting % 4 == 0:
                params.shadow(requests.shadow(deepest), deepest)
            elif model_drafter and (since_drafting <= 8 or since_drafting % 8 == 0):
                params.shadow(requests.shadow(1), 1)
        elif tier:
            since_drafting = 0
        accepted, emitted = requests.round(tier)
        tokens += emitted
        seconds += cost
        if params is not None:
            params.update(accepted, cost * math.exp(rng.gauss(0.0, jitter)))
    return tokens / seconds, tiers, params


def best_fixed(name, machine, tiers, batch=2, seed=0):
    return max(replay(name, machine, None, batch=batch, seed=seed, steps=k)[0] for k in tiers)


def candidates(model_drafter, table):
    return [int(k) for k in default_params(model_drafter, table).candidate_tiers]


# ---- the machines' own tables ---------------------------------------------------------------------------------


def test_the_three_machines_tables_are_the_measured_ones():
    costs = {name: forward_costs(name) for name in MACHINES}
    assert costs["amx-xeon"][8] == pytest.approx(1.327) and costs["amx-xeon"][6] == pytest.approx(1.239)
    assert costs["avx512-epyc"][8] == pytest.approx(2.065) and costs["avx2-epyc"][8] == pytest.approx(2.38)
    # the default's tiers follow the machine: a model drafter reaches deeper where rows are cheap
    assert candidates(True, costs["avx2-epyc"]) == [0, 1, 2, 3] == candidates(True, costs["avx512-epyc"])
    assert max(candidates(True, costs["amx-xeon"])) > 3
    assert all(0 in candidates(kind, table) and 1 in candidates(kind, table)
               for kind in (True, False) for table in costs.values())


@pytest.mark.parametrize("machine", list(MACHINES))
@pytest.mark.parametrize("name", list(PHASES))
def test_within_three_percent_of_the_best_fixed_tier_at_each_machine_s_costs(name, machine):
    table = forward_costs(machine)
    model_drafter = PHASES[name][0] == "model"
    rates = [replay(name, table, table, seed=seed)[0] / best_fixed(name, table, candidates(model_drafter, table),
                                                                    seed=seed) for seed in range(3)]
    assert sum(rates) / len(rates) >= 0.97, rates


def eagle_rates_ratios(scenario, table, batch, rounds):
    """The default policy's throughput over the best fixed tier's, three seeds, per-position rates drawn per
    round at ``batch`` for ``rounds`` rounds."""
    rates, sampled = POSITIONAL[scenario]
    tiers = candidates(True, table)

    def tokens(steps):
        total, survive = 1.0, 1.0
        for rate in rates[:steps]:
            survive *= rate
            total += survive
        return total

    best = max(batch * tokens(k) / round_seconds(table, k, batch, True) for k in tiers)
    ratios = []
    for seed in range(3):
        rng = random.Random(seed)
        params = default_params(True, table)
        emitted, seconds = 0, 0.0
        for _ in range(rounds):
            steps = params.current_tier
            if steps == 0:  # the head's tier-0 shadow: one draft, right at the first position's rate
                params.shadow([int(rng.random() < rates[0]) for _ in range(batch)], 1)
            accepted = []
            for _ in range(batch):
                a = 0
                while a < steps and rng.random() < rates[a]:
                    a += 1
                accepted.append(a)
            cost = round_seconds(table, steps, batch, True)
            emitted += sum(accepted) + batch
            seconds += cost
            params.update(accepted, cost * math.exp(rng.gauss(0.0, 0.05)), sampled)
        ratios.append(emitted / seconds / best)
    return ratios


@pytest.mark.parametrize("machine", list(MACHINES))
@pytest.mark.parametrize("scenario", list(POSITIONAL))
def test_measured_eagle_rates_within_three_percent_at_each_machine_s_costs(scenario, machine):
    ratios = eagle_rates_ratios(scenario, forward_costs(machine), batch=2, rounds=1500)
    assert sum(ratios) / len(ratios) >= 0.97, ratios


@pytest.mark.parametrize("machine", list(MACHINES))
def test_a_short_run_at_batch_8_pays_for_its_start_up(machine):
    """EAGLE on code at batch 8, where a verify of 8 (k + 1) rows is far past the batch-1 table's 8 rows and
    every drafting tier loses to a plain decode (the Xeon: tier 1 0.74x, tier 3 0.49x, results/
    eagle-code-default-xeon.json): three runs of 64 tokens (bench/bench_engine.py --batch-sizes 8) stay within 5%
    of the best fixed tier. The table alone called tier 3 1.13x a plain decode there; start-up probing times tier
    0 from batch 4 on (12 rounds at tier 3 before it did, 0.68x target-only over the first run)."""
    ratios = eagle_rates_ratios("eagle code", forward_costs(machine), batch=8, rounds=3 * 64)
    assert min(ratios) >= 0.95, ratios


# ---- noisy tables ---------------------------------------------------------------------------------------------


def noisy(table, seed, spread=0.15):
    rng = random.Random(seed)
    out = {rows: cost * math.exp(rng.gauss(0.0, spread)) for rows, cost in table.items() if rows <= 8}
    return {rows: cost / out[1] for rows, cost in out.items()}


NOISY = [  # (machine, what the policy is handed there)
    ("amx-xeon", "its start-up table", XEON_START_UP), ("amx-xeon", "the AVX2 EPYC's", forward_costs("avx2-epyc")),
    ("amx-xeon", "its own, 15% noise", noisy(forward_costs("amx-xeon"), 1)),
    ("avx2-epyc", "the Xeon's", forward_costs("amx-xeon")), ("avx2-epyc", "its own, 15% noise",
                                                             noisy(forward_costs("avx2-epyc"), 2)),
    ("avx512-epyc", "the Xeon's start-up table", XEON_START_UP),
    ("avx512-epyc", "its own, 15% noise", noisy(forward_costs("avx512-epyc"), 3)),
]
# Found by this suite, for the policy (csrc/core): with a table and tier-0 shadows only the start-up tier is probed,
# and a tier no round has timed is priced by the table's shape alone; the policy now times such a tier before it
# holds it (a neighbour's refresh probe, a decision for it run as a probe), or a table that calls 2 rows dearer
# than 4 held a model drafter at tier 3 for the whole trace (5-6% below tier 1 here).
NOISY_CASES = [pytest.param(name, machine, given, id=f"{name}-{machine}-{label}")
               for machine, label, given in NOISY
               for name in ["lookup transition", "model transition", "lookup low", "model high"]]


@pytest.mark.parametrize("name, machine, given", NOISY_CASES)
def test_a_noisy_table_costs_at_most_three_percent(name, machine, given):
    """Handed a wrong table, the default's tiers and prior are wrong; its own timings must then decide: the policy
    stays within 3% of the best fixed tier among the tiers that table gave it."""
    table = forward_costs(machine)
    model_drafter = PHASES[name][0] == "model"
    best = best_fixed(name, table, candidates(model_drafter, given))
    rate = sum(replay(name, table, given, seed=seed)[0] for seed in range(2)) / 2
    assert rate >= 0.97 * best, rate / best


@pytest.mark.parametrize("model_drafter", [True, False])
def test_a_noisy_table_cannot_hold_a_tier_its_own_timings_contradict(model_drafter):
    """A table that calls every row free (8 rows 1.01x) on the AVX2 EPYC (8 rows 2.38x): the prior wants the
    deepest chain, where it loses; once the policy has timed the tiers its cost estimates are its timings (not the
    table's), and in the second half of the trace it holds a tier where they say it loses for at most 5% of its
    rounds (three seeds pooled; a refresh probe, probe_rounds rounds there and back, is a timing, not a hold: one
    seed alone swings from 0% to 13% with acceptance noise, tables aside)."""
    machine = forward_costs("avx2-epyc")
    free = {1: 1.0, 2: 1.0, 4: 1.005, 6: 1.008, 8: 1.01}
    name = "model high" if model_drafter else "lookup mid"
    tiers_given = candidates(model_drafter, free)
    held_wrong, held_all = 0, 0
    for seed in range(3):
        rates = {k: replay(name, machine, None, steps=k, seed=seed)[0] for k in tiers_given}
        truth = max(rates, key=rates.get)
        _, tiers, params = replay(name, machine, free, seed=seed)
        held = tiers[len(tiers) // 2:]
        wrong = [k for k in tiers_given if rates[k] < 0.95 * rates[truth]]
        assert max(tiers_given) in wrong, rates  # the table's favourite really loses here
        probe = params.config.probe_rounds
        held_wrong += sum(n for k, n in ((k, len(list(run))) for k, run in itertools.groupby(held))
                          if k in wrong and n > probe)
        held_all += len(held)
    assert held_wrong <= 0.05 * held_all, (held_wrong, held_all)
    measured = params.measured_costs()["greedy"][2]  # batch 2's bucket: what its rounds cost, not the table
    for k, seconds in measured.items():
        assert seconds == pytest.approx(round_seconds(machine, k, 2, model_drafter), rel=0.1), (k, measured)
    estimates = params.cost_estimates(2)
    assert estimates[max(tiers_given)] > 1.5 * estimates[1], estimates
