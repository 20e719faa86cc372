"""SUFFIX through the Engine on the shipped tiny model: greedy and keyed-sampled output equal to target-only's for
chains, trees and adaptive (the goodput policy over SUFFIX's tiers, tier 0 included); its keywords and flags; the
global tree in stats(), flushed, and kept free of a request that asks so."""

import argparse

import pytest

from components import require_module
from specswap import zoo
from specswap.engine import Engine
from specswap.sampling import SamplingParams
from specswap.worker.suffix import INSTALL

pytestmark = pytest.mark.skipif(not (zoo.path("tiny") / "model.safetensors").is_file(),
                                reason="tiny zoo weights are not built (python -m specswap.zoo train tiny)")
require_module("arctic_inference", "arctic-inference's suffix trees (SUFFIX)", INSTALL)

TEXTS = ["def fibonacci(n):\n    ", "for i in range(10):\n    print(", "class Stack:\n    def push(self, item):\n"]
PROMPTS = TEXTS * 2  # the second copies draft from the first copies' outputs too (the global tree)
MAX_NEW = 40


def make(algorithm="SUFFIX", **kwargs):
    return Engine("tiny", speculative_algorithm=algorithm, max_seq_len=160, max_batch_size=2, **kwargs)


@pytest.fixture(scope="module")
def reference():
    return [r.token_ids for r in make(None).generate(PROMPTS, MAX_NEW)]


@pytest.mark.parametrize("shape", [(1, 1, 2), (3, 1, 4), (7, 1, 8), (3, 2, 6), (2, 3, 7)])
def test_greedy_identity_chains_and_trees(reference, shape):
    steps, topk, nodes = shape
    engine = make(speculative_num_steps=steps, speculative_eagle_topk=topk, speculative_num_draft_tokens=nodes)
    assert [r.token_ids for r in engine.generate(PROMPTS, MAX_NEW)] == reference
    stats = engine.stats()
    assert stats["mean_accept_length"] > 0 and stats["suffix_global_tree"]["cached_requests"] == len(PROMPTS)


@pytest.mark.parametrize("config", ["configs/goodput.json", "configs/goodput-trees.json",
                                    {"ema_alpha": 1.0, "warmup_batches": 0, "update_interval": 1}])
def test_greedy_identity_adaptive(reference, config):
    """SUFFIX's tiers (tier 0 among the goodput configs') in the pool under the policy, tier-0 rounds checking the
    largest chain's drafts as NGRAM's do."""
    engine = make(speculative_adaptive=True, speculative_adaptive_config=config, row_costs="off")
    assert [r.token_ids for r in engine.generate(PROMPTS, MAX_NEW)] == reference
    stats = engine.stats()
    assert stats["adaptive"] and stats["num_verify_rounds"] > 0
    if isinstance(config, dict):  # SGLang's EMA at alpha 1: the tier moves
        assert stats["num_switches"] >= 2 and len(stats["rounds_per_tier"]) >= 2, stats
    else:
        assert engine.worker.drafter.shadow_steps == 7  # tier 0's checks of tier 7


def test_resampled_prompts_follow_target_only_s_keyed_draws():
    """A prompt sampled three times at T = 0.7 with other seeds (the resample workload): each sample is the text
    target-only decoding draws with its seed (keyed draws), whatever the earlier samples put in the global tree."""
    prompts = [TEXTS[0]] * 3 + [TEXTS[1]] * 3
    sampled = [r.token_ids for r in make(speculative_num_steps=3).generate(prompts, MAX_NEW, temperature=0.7, seed=5)]
    assert sampled == [r.token_ids for r in make(None).generate(prompts, MAX_NEW, temperature=0.7, seed=5)]
    assert len({tuple(tokens) for tokens in sampled[:3]}) > 1  # the seeds drew other texts


def test_the_global_tree_in_stats_flushed_and_private_requests_kept_out():
    engine = make()
    private = SamplingParams(max_new_tokens=MAX_NEW, suffix_cache_output=False)
    engine.add_request(TEXTS[0], private)
    while engine.has_unfinished():
        engine.step()
    assert engine.stats()["suffix_global_tree"]["cached_requests"] == 0
    engine.generate(TEXTS, MAX_NEW)
    tree = engine.stats()["suffix_global_tree"]
    assert tree["cached_requests"] == len(TEXTS) and tree["cached_tokens"] >= len(TEXTS) * MAX_NEW
    assert tree["bytes"] > 0 and tree["bytes_per_cached_token"] > 0 and tree["max_cached_requests"] == 10000
    engine.flush_cache()
    assert engine.stats()["suffix_global_tree"]["cached_tokens"] == 0
    with pytest.raises(ValueError, match="suffix_cache_output must be a bool"):
        SamplingParams(suffix_cache_output="no")


def test_keywords_reach_the_trees_and_are_refused_elsewhere():
    engine = make(suffix_decoding_max_tree_depth=8, suffix_decoding_max_cached_requests=3,
                  suffix_decoding_max_spec_factor=3.0, suffix_decoding_min_token_prob=0.2)
    config = engine.worker.drafter.config
    assert (config.max_tree_depth, config.max_cached_requests, config.max_spec_factor, config.min_token_prob) == \
        (8, 3, 3.0, 0.2)
    engine.generate(TEXTS * 2, 8)
    assert engine.stats()["suffix_global_tree"]["cached_requests"] == 3  # the oldest evicted
    with pytest.raises(ValueError, match="suffix_decoding_max_tree_depth apply to speculative_algorithm SUFFIX; "
                                         "got NGRAM"):
        make("NGRAM", suffix_decoding_max_tree_depth=8)
    with pytest.raises(ValueError, match="suffix_decoding_min_token_prob must be"):
        make(suffix_decoding_min_token_prob=2.0)


def test_the_flags_are_vllm_s_names_and_reach_build_engine():
    from specswap.cli_flags import add_model_arguments, suffix_options
    parser = argparse.ArgumentParser()
    add_model_arguments(parser, "bench")
    args = parser.parse_args(["--speculative-algorithm", "suffix", "--suffix-decoding-max-spec-factor", "2",
                              "--suffix-decoding-max-cached-requests", "5"])
    assert args.speculative_algorithm == "SUFFIX"
    assert suffix_options(args) == {"suffix_decoding_max_cached_requests": 5, "suffix_decoding_max_spec_factor": 2.0}
    assert suffix_options(parser.parse_args([])) == {}
