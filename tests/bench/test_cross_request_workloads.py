"""The workloads where other requests' outputs matter (SUFFIX's global tree): resample, template, multiturn."""

import pytest

from specswap.bench import workloads
from specswap.bench.runner import EngineRunner
from specswap.bench.workloads import build_workload


def test_resample_sends_each_prompt_three_times_in_a_row_at_0_7():
    phase, = build_workload("resample", 7)
    prompts = workloads.REPORT_RESAMPLE_PROMPTS
    assert phase.prompts == (prompts[0],) * 3 + (prompts[1],) * 3 + (prompts[2],)
    assert phase.temperature == 0.7 and phase.num_requests == 7
    assert build_workload("mixed", 2)[0].name == "resample"


def test_template_is_one_instruction_over_many_inputs():
    phase, = build_workload("template", 8)
    assert len(set(phase.prompts)) == 8 and phase.temperature == 0.0
    assert len({prompt.splitlines()[0] for prompt in phase.prompts}) == 1


def test_multiturn_second_turns_hold_the_first_turn_and_its_answer():
    phase, = build_workload("multiturn", 2)
    assert phase.num_requests == 4
    second = phase.second_turn(1, "ANSWER")
    assert second.startswith(phase.prompts[1] + "ANSWER") and second.endswith(phase.followups[1])
    assert build_workload("template", 2)[0].second_turn(0, "x") is None
    follow = {set_: {line.strip() for text in workloads.MULTITURN_FOLLOWUPS[set_] for line in text.splitlines()
                     if line.strip()} for set_ in ("tune", "report")}
    assert not follow["tune"] & follow["report"]  # tune and report apart, as the prompts


def test_the_engine_runner_sends_each_second_turn_once_its_first_finished():
    from specswap.engine import Engine
    engine = Engine("tiny", speculative_algorithm=None, max_seq_len=160, max_batch_size=2)
    sent = []
    add = engine.add_request
    engine.add_request = lambda prompt, **kw: sent.append(prompt) or add(prompt, **kw)
    phase, = build_workload("multiturn", 2)
    runner = EngineRunner(engine, concurrency=2, max_new_tokens=6)
    runner.run_phase(0, phase)
    assert len(runner.run["phases"][0]["requests"]) == 4 and sent[:2] == list(phase.prompts)
    for index in (0, 1):
        assert sum(prompt.startswith(phase.prompts[index]) and prompt.endswith(phase.followups[index])
                   for prompt in sent[2:]) == 1
