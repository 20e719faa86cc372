"""A policy written in Python ("policy": "python"): built from the config's class or AdaptiveController(policy=),
fed every round's RoundObservation through the same one call as the C++ policies, obeyed losslessly by the engine,
and, under data parallelism, fed the merged observation only, with a policy that decides otherwise caught."""

import threading

import pytest
import torch

import specswap
from specswap import AdaptiveController, RoundObservation
from specswap.distributed.agreement import AgreedController, TierDesync
from specswap.tier import Tier
from specswap.worker.drafter import Shadow

from test_controller import pool_of, verified

PYTHON = {"policy": "python", "candidate_steps": [1, 3, 7]}


class Alternate:
    """Alternates tiers 1 and 3 on every verify; records what it saw and chose."""

    def __init__(self, tiers, start):
        self.tiers, self.start = tiers, start
        self.at = start
        self.rounds: list[RoundObservation] = []
        self.chosen: list[Tier] = []

    def observe(self, round_):
        self.rounds.append(round_)
        if not round_.accept_lengths:
            return None
        self.at = Tier(3) if self.at == Tier(1) else Tier(1)
        self.chosen.append(self.at)
        return self.at


_built: list = []  # every Recorded the config's class name built, last the latest


class Recorded(Alternate):
    def __init__(self, tiers, start):
        super().__init__(tiers, start)
        _built.append(self)


def test_the_config_names_the_class_and_it_gets_the_tiers_and_every_round():
    pool = pool_of(start=3)
    controller = AdaptiveController(pool, {**PYTHON, "python_policy": f"{__name__}:Recorded"})
    policy = _built[-1]
    assert policy.tiers == [Tier(1), Tier(3), Tier(7)] and policy.start == Tier(3)
    assert controller.observe(verified([0], 3, seconds=0.5, shadow=Shadow([2, 0], 7))) == 1
    assert controller.observe(verified([1, 1], 1)) == 3 and pool.active_tier == 3
    assert controller.observe(verified([], 3, shadow=Shadow([1], 7))) is None  # no request: its shadows alone
    plain = verified([0, 0], 3, seconds=0.5, ran=0)
    plain.lookup_seconds = 0.1
    assert controller.observe(plain) is None
    first, _, idle, decode = policy.rounds
    assert first.accept_lengths == [0] and first.round_seconds == 0.5 and first.shadow_accept_lengths == [2, 0]
    assert first.shadow_steps == 7 and idle.accept_lengths == [] and idle.shadow_accept_lengths == [1]
    assert decode.plain_requests == 2 and decode.round_seconds == pytest.approx(0.4) and not decode.accept_lengths
    assert controller.params.num_batches == 2 and controller.stats()["policy"] == "python"


def test_a_class_given_to_the_controller_and_the_errors_that_name_what_is_wrong():
    controller = AdaptiveController(pool_of(start=1), PYTHON, policy=Alternate)
    assert controller.observe(verified([0], 1)) == 3
    with pytest.raises(ValueError, match='needs "python_policy"'):
        AdaptiveController(pool_of(), PYTHON)
    with pytest.raises(ValueError, match="this config's is 'sglang'"):
        AdaptiveController(pool_of(), None, policy=Alternate)
    with pytest.raises(ValueError, match="give the Python policy once"):
        AdaptiveController(pool_of(), {**PYTHON, "python_policy": f"{__name__}:Alternate"}, policy=Alternate)
    with pytest.raises(ValueError, match="python_policy 'no_such_module_here:X'"):
        AdaptiveController(pool_of(), {**PYTHON, "python_policy": "no_such_module_here:X"})
    with pytest.raises(ValueError, match="python_policy must be 'module:Class'"):
        AdaptiveController(pool_of(), {**PYTHON, "python_policy": "Alternate"})
    with pytest.raises(ValueError, match="python_policy names the class of policy 'python'"):
        AdaptiveController(pool_of(), {"python_policy": f"{__name__}:Alternate"})
    with pytest.raises(TypeError, match="needs a method observe"):
        AdaptiveController(pool_of(), PYTHON, policy=lambda tiers, start: object())

    class Chooses:
        def __init__(self, answer, on_idle=None):
            self.answer, self.on_idle = answer, on_idle

        def observe(self, round_):
            return self.answer if round_.accept_lengths else self.on_idle

    def choosing(answer, on_idle=None):
        return AdaptiveController(pool_of(start=3), PYTHON, policy=lambda tiers, start: Chooses(answer, on_idle))

    assert choosing(7).observe(verified([1], 3)) == 7  # a key does as well as a Tier
    assert choosing(Tier(3)).observe(verified([1], 3)) is None  # its own tier: it stays
    with pytest.raises(ValueError, match=r"chose tier 2, not a candidate \(\[1, 3, 7\]\)"):
        choosing(Tier(2)).observe(verified([1], 3))
    with pytest.raises(TypeError, match="returns a Tier, a tier key or None"):
        choosing("seven").observe(verified([1], 3))
    with pytest.raises(RuntimeError, match="on a round without a verify"):  # it moves on verifies only
        choosing(None, on_idle=Tier(7)).observe(verified([], 3, shadow=Shadow([1], 7)))


@pytest.mark.parametrize("algorithm", ["STANDALONE", "NGRAM"])
def test_an_alternating_python_policy_is_obeyed_losslessly(algorithm):
    """Greedy decoding under a policy that alternates tiers 1 and 3 on every verify: each step runs the tier the
    policy chose after the step before it verified, and the tokens are target-only decoding's."""
    prompts = ["def fibonacci(n):\n", "1, 2, 3, 4, 5, 6,"]

    def run(**options):
        engine = specswap.Engine("tiny", max_batch_size=2, disable_graphs=True, **options)
        ids = [engine.add_request(prompt, max_new_tokens=24, temperature=0.0) for prompt in prompts]
        tiers, tokens = [], {}
        while engine.has_unfinished():
            step = engine.step()
            tiers.append(step.tier)
            tokens.update({output.request_id: output.token_ids for output in step.finished})
        return engine, tiers, [tokens[i] for i in ids]

    _built.clear()
    engine, tiers, tokens = run(speculative_algorithm=algorithm, speculative_num_steps=1, speculative_adaptive=True,
                                speculative_adaptive_config={"policy": "python", "candidate_steps": [1, 3],
                                                             "python_policy": f"{__name__}:Recorded"})
    _, _, target_only = run(speculative_algorithm=None)
    assert tokens == target_only
    policy = _built[-1]
    assert len(policy.chosen) >= 4 and set(tiers) == {1, 3}
    # the tier each step ran: the start-up tier, then after each verify the policy's choice, held until the next
    expected, at = [], Tier(1)
    verified_rounds = iter(bool(r.accept_lengths) for r in policy.rounds)
    for _ in tiers:
        expected.append(at.steps)
        if next(verified_rounds, False):
            at = Tier(3) if at == Tier(1) else Tier(1)
    assert tiers == expected
    assert engine.stats()["num_switches"] == len(policy.chosen)


# ---- data parallelism: the merged observation, the same on every rank -----------------------------------------

class _Ranks:
    """Ranks as threads: all_gather_into hands every rank every rank's vector, in rank order."""

    def __init__(self, world):
        self.world = world
        self.rows = [None] * world
        self.barrier = threading.Barrier(world, timeout=30)

    def member(self, rank):
        ranks = self

        class Member:
            tp_size, world_size = 1, ranks.world

            def __init__(self):
                self.rank = rank

            def all_gather_into(self, out, tensor, group="dp"):
                ranks.rows[rank] = tensor.clone()
                ranks.barrier.wait()
                out.copy_(torch.cat(ranks.rows))
                ranks.barrier.wait()
                return out

        return Member()


def _agree(policies, steps=12):
    """Two data-parallel ranks, each its own pool, controller and Python policy (policies[rank]), rank 1's requests
    accepting less; every step each rank ends its own round. Returns per rank the tiers it ran and its error."""
    ranks = _Ranks(2)
    traces, errors = [[], []], [None, None]

    def rank_main(rank):
        pool = pool_of(start=1)
        agreed = AgreedController(AdaptiveController(pool, PYTHON, policy=policies[rank]), ranks.member(rank),
                                  max_steps=7, min_dwell_rounds=0)
        try:
            for _ in range(steps):
                tier = pool.active_tier
                traces[rank].append(tier)
                agreed.end_step(verified([tier, 0] if rank == 0 else [0], tier), busy=True)
        except TierDesync as exc:
            errors[rank] = exc

    threads = [threading.Thread(target=rank_main, args=(rank,)) for rank in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return traces, errors


def test_under_data_parallelism_a_python_policy_sees_the_merged_round_and_every_rank_moves_alike():
    built = []

    def recorded(tiers, start):
        built.append(Alternate(tiers, start))
        return built[-1]

    traces, errors = _agree([recorded, recorded])
    assert errors == [None, None] and traces[0] == traces[1] == [1, 3] * 6
    for policy in built:  # both ranks' requests as one batch, on both ranks
        assert [sorted(r.accept_lengths) for r in policy.rounds] == [[0, 0, tier] for tier in traces[0]]


def test_under_data_parallelism_a_policy_that_decides_by_rank_is_caught_at_the_next_step():
    class ByRank(Alternate):
        def observe(self, round_):
            super().observe(round_)
            return Tier(self.moves)

    def rank_policy(moves):
        def build(tiers, start):
            policy = ByRank(tiers, start)
            policy.moves = moves
            return policy
        return build

    traces, errors = _agree([rank_policy(3), rank_policy(7)])
    assert traces[0] == [1, 3] and traces[1] == [1, 7]  # the step after they diverged, every rank stops
    assert all(isinstance(error, TierDesync) for error in errors)
    assert "ranks [0] at tier 3; ranks [1] at tier 7" in str(errors[0])
