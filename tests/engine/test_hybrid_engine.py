"""The hybrid (EAGLE + SUFFIX) through the Engine on the shipped tiny model and its EAGLE head: greedy output equal
to target-only's, static and adaptive (the goodput policy over EAGLE's tiers, tier 0's checks included; chains, and
trees among them), eager and in graph mode (whole-round graphs); sampled output equal to the same seeds' EAGLE-alone output law-wise is the worker's test
(tests/worker/test_hybrid.py); the choices in stats(); the flag; the misfits refused."""

import argparse

import pytest
import torch

from components import require_module
from specswap import zoo
from specswap.engine import Engine
from specswap.worker.suffix import INSTALL

pytestmark = pytest.mark.skipif(not all((zoo.path(name) / "model.safetensors").is_file() for name in ("tiny", "tiny-eagle")),
                                reason="tiny zoo weights are not built (python -m specswap.zoo train tiny)")
require_module("arctic_inference", "arctic-inference's suffix trees (SUFFIX)", INSTALL)

TEXTS = ["def fibonacci(n):\n    ", "for i in range(10):\n    print(", "class Stack:\n    def push(self, item):\n"]
PROMPTS = TEXTS * 2  # the second copies draft from the first copies' outputs (the global tree)
MAX_NEW = 40


def make(algorithm="EAGLE", **kwargs):
    # fp32: where greedy output equals target-only's by construction (in bf16 a verify and a one-token decode round
    # differently and part at a near-tie: docs/engine.md; these prompts hit one in bf16 at spec factor 2)
    return Engine("tiny", speculative_algorithm=algorithm, max_seq_len=160, max_batch_size=2, dtype=torch.float32,
                  **kwargs)


@pytest.fixture(scope="module")
def reference():
    return [r.token_ids for r in make(None).generate(PROMPTS, MAX_NEW)]


@pytest.mark.parametrize("options", [dict(speculative_num_steps=3, disable_graphs=True),
                                     dict(speculative_num_steps=1),
                                     dict(speculative_adaptive=True, speculative_adaptive_config="configs/goodput-eagle.json",
                                          row_costs="off", disable_graphs=True),
                                     dict(speculative_num_steps=3, speculative_eagle_topk=2,
                                          speculative_num_draft_tokens=6),
                                     dict(speculative_adaptive=True, row_costs="off", disable_graphs=True,
                                          speculative_adaptive_config="configs/goodput-eagle-trees.json")],
                         ids=["chain3-eager", "chain1-graphs", "adaptive", "tree-graphs", "adaptive-trees"])
def test_greedy_identity_and_the_choices_counted(reference, options):
    engine = make(hybrid_drafter="SUFFIX", **options)
    assert [r.token_ids for r in engine.generate(PROMPTS, MAX_NEW)] == reference
    stats = engine.stats()
    hybrid = stats["hybrid"]
    assert stats["speculative_algorithm"] == "EAGLE" and hybrid["drafter"] == "SUFFIX"
    assert hybrid["suffix_rounds"] > 0 and hybrid["model_rounds"] > 0, hybrid  # repeated prompts take the suffix's
    assert hybrid["suffix_accepted"] > 0 and stats["suffix_global_tree"]["cached_requests"] == len(PROMPTS)
    # graph mode on the tiny pair: whole-round graphs, the all-model and all-suffix rounds' (eager: none)
    assert engine.worker.round_graphs_enabled is not options.get("disable_graphs", False)


@pytest.mark.parametrize("kwargs,match", [
    (dict(algorithm="NGRAM", hybrid_drafter="SUFFIX"), "drafts beside a draft model or head"),
    (dict(hybrid_drafter="NGRAM"), "hybrid_drafter 'NGRAM' is not supported; valid: SUFFIX"),
    (dict(suffix_decoding_max_tree_depth=8), "apply to speculative_algorithm SUFFIX; got EAGLE"),
])
def test_misfits_are_refused_naming_them(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make(**kwargs)


def test_suffix_keywords_reach_a_hybrid_s_trees():
    engine = make(hybrid_drafter="SUFFIX", suffix_decoding_max_tree_depth=8, suffix_decoding_max_cached_requests=2,
                  disable_graphs=True)
    assert engine.worker.drafter.suffix.config.max_tree_depth == 8
    engine.generate(TEXTS, 4)
    assert engine.stats()["suffix_global_tree"]["cached_requests"] == 2
    engine.flush_cache()
    assert engine.stats()["suffix_global_tree"]["cached_requests"] == 0


def test_the_flag_reaches_build_engine_and_is_checked():
    from specswap.cli_flags import add_model_arguments, check_speculative_flags, suffix_options
    parser = argparse.ArgumentParser()
    add_model_arguments(parser, "bench")
    parser.add_argument("--speculative-adaptive-config-dummy", default=None)
    args = parser.parse_args(["--speculative-algorithm", "eagle", "--speculative-hybrid-drafter", "suffix"])
    assert suffix_options(args) == {"hybrid_drafter": "SUFFIX"}
    check_speculative_flags(args, adaptive_flag=False)
    bad = parser.parse_args(["--speculative-algorithm", "NGRAM", "--speculative-hybrid-drafter", "SUFFIX"])
    with pytest.raises(ValueError, match="--speculative-hybrid-drafter SUFFIX: hybrid_drafter SUFFIX drafts beside"):
        check_speculative_flags(bad, adaptive_flag=False)
    tree = parser.parse_args(["--speculative-algorithm", "EAGLE", "--speculative-hybrid-drafter", "SUFFIX",
                              "--speculative-eagle-topk", "2"])
    check_speculative_flags(tree, adaptive_flag=False)  # a hybrid drafts trees too
