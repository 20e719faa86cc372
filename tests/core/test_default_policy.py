"""What --speculative-adaptive alone runs (adaptive_config.DEFAULT_POLICY): goodput with tier 0, its chains chosen
for the machine from the verify's row costs and the drafter's kind; a config that names no policy runs SGLang's."""

import json
from pathlib import Path

import pytest

from specswap.adaptive_config import (DEFAULT_POLICY, DEFAULT_STEPS, engine_adaptive_config, load_adaptive_config,
                                      read_adaptive_config)
from specswap.worker.row_cost import RowCosts, auto_steps

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
AVX2 = {1: 1.0, 2: 1.067, 4: 1.39, 8: 2.38}      # results/gemma-forward-t1-avx2-native.json
AVX512 = {1: 1.0, 2: 1.088, 4: 1.266, 8: 2.065}  # results/gemma-forward-t1.json
XEON = {1: 1.0, 2: 1.084, 4: 1.157, 6: 1.239, 8: 1.327}  # results/gemma-forward-t1-xeon-amx.json


@pytest.mark.parametrize("model_drafter, tuned", [(True, "goodput-eagle.json"), (False, "goodput.json")])
def test_the_default_is_the_tuned_config_of_the_drafter_s_kind(model_drafter, tuned):
    values = json.loads((CONFIGS / tuned).read_text())
    steps = values.pop("candidate_steps")
    assert {k: v for k, v in DEFAULT_POLICY[model_drafter].items() if k != "candidate_steps"} == values
    assert DEFAULT_POLICY[model_drafter]["candidate_steps"] == "auto" and DEFAULT_STEPS[model_drafter] == steps
    # on the machine the configs were tuned on (the AVX-512 EPYC), "auto" gives their own tiers back
    assert auto_steps(RowCosts(AVX512, "given"), model_drafter) == steps


def test_the_tiers_follow_the_machine_and_the_drafter():
    assert auto_steps(RowCosts(XEON, "given"), True) == [0, 1, 3, 6]   # cheap rows: deeper chains pay
    assert auto_steps(RowCosts(AVX2, "given"), True) == [0, 1, 2, 3]
    assert auto_steps(RowCosts(AVX2, "given"), False) == [0, 1, 3, 6]  # a lookup drafts for free: up to 7
    assert auto_steps(RowCosts(XEON, "given"), False) == [0, 1, 3, 7]
    assert [list(engine_adaptive_config(None, model_drafter=kind).for_machine(None).candidate_steps)
            for kind in (True, False)] == [[0, 1, 2, 3], [0, 1, 3, 7]]  # no table: the configs' own tiers


def test_a_hybrid_s_tiers_are_both_kinds():
    """EAGLE with SUFFIX beside it: the model drafter's policy over the model's tiers and the lookup's deeper ones."""
    hybrid = engine_adaptive_config(None, model_drafter=True, hybrid=True)
    assert hybrid.config.to_dict() == engine_adaptive_config(None, model_drafter=True).config.to_dict()
    assert list(hybrid.for_machine(RowCosts(XEON, "given")).candidate_steps) == [0, 1, 3, 6, 7]
    assert list(hybrid.for_machine(RowCosts(AVX2, "given")).candidate_steps) == [0, 1, 2, 3, 6]
    assert list(hybrid.for_machine(None).candidate_steps) == [0, 1, 2, 3, 7]
    assert "with SUFFIX beside it" in hybrid.describe(hybrid.for_machine(None), None)
    listed = engine_adaptive_config({"policy": "goodput", "candidate_steps": [0, 2]}, model_drafter=True, hybrid=True)
    assert list(listed.for_machine(RowCosts(XEON, "given")).candidate_steps) == [0, 2]  # a list is what it says


def test_no_config_is_the_default_and_a_config_is_what_it_says():
    default = engine_adaptive_config(None, model_drafter=True)
    assert default.default and default.steps_auto and default.config.policy == "goodput"
    assert list(default.for_machine(RowCosts(XEON, "given")).candidate_steps) == [0, 1, 3, 6]
    assert list(default.for_machine(None).candidate_steps) == [0, 1, 2, 3]
    plain = engine_adaptive_config({"ema_alpha": 0.5}, model_drafter=True)  # names no policy: SGLang's file
    assert not plain.default and plain.config.policy == "sglang" and list(plain.config.candidate_steps) == [1, 3, 7]
    assert plain.for_machine(RowCosts(XEON, "given")) is plain.config
    auto = engine_adaptive_config({"policy": "goodput", "candidate_steps": "auto", "min_gain": 0.05},
                                  model_drafter=False)
    assert list(auto.for_machine(RowCosts(AVX2, "given")).candidate_steps) == [0, 1, 3, 6]
    assert auto.for_machine(None).min_gain == 0.05


def test_keys_only_goodput_reads_need_a_policy_that_reads_them():
    with pytest.raises(ValueError, match="min_gain: only the goodput policy reads it.*names no policy"):
        load_adaptive_config({"min_gain": 0.05})
    assert load_adaptive_config({"policy": "goodput", "min_gain": 0.05}).min_gain == 0.05
    with pytest.raises(ValueError, match="candidate_steps 'auto' is chosen by the Engine"):
        load_adaptive_config({"policy": "goodput", "candidate_steps": "auto"})
    with pytest.raises(ValueError, match="candidate_steps 'auto' is chosen by the Engine"):
        read_adaptive_config({"policy": "goodput", "candidate_steps": "auto"})
    with pytest.raises(ValueError, match="needs policy 'goodput'"):
        engine_adaptive_config({"candidate_steps": "auto"}, model_drafter=True)


def test_the_engine_s_default(monkeypatch):
    from specswap.engine import Engine
    eagle = Engine("tiny", speculative_algorithm="EAGLE", speculative_adaptive=True, row_costs=XEON)
    stats = eagle.controller.stats()
    assert stats["policy"] == "goodput" and stats["candidate_steps"] == [0, 1, 3, 6]
    assert stats["row_costs"] == pytest.approx(XEON)
    ngram = Engine("tiny", speculative_algorithm="NGRAM", speculative_adaptive=True, row_costs="off")
    assert ngram.controller.stats()["candidate_steps"] == [0, 1, 3, 7]  # no table: the tuned tiers
    sglang = Engine("tiny", speculative_algorithm="NGRAM", speculative_adaptive=True,
                    speculative_adaptive_config={"ema_alpha": 0.5})
    assert sglang.controller.stats()["policy"] == "sglang" and sglang.controller.candidate_tiers == [1, 3, 7]
