"""The adaptive controller driving a worker through the AdaptiveSpecWorker protocol."""

import pytest

from specswap import AdaptiveController, AdaptiveSpecWorker, SpecRuntimeState


class RecordingWorker:
    def __init__(self, speculative_num_steps=3):
        self.speculative_num_steps = speculative_num_steps
        self.speculative_num_draft_tokens = speculative_num_steps + 1
        self.built = []
        self.applied = []

    def build_adaptive_runtime_state(self, speculative_num_steps, speculative_num_draft_tokens):
        self.built.append((speculative_num_steps, speculative_num_draft_tokens))
        return SpecRuntimeState(
            speculative_num_steps,
            speculative_num_draft_tokens,
            draft=f"draft{speculative_num_steps}",
            verify=f"verify{speculative_num_steps}",
            draft_extend=f"extend{speculative_num_steps}",
        )

    def apply_runtime_state(self, state):
        if state is None:
            return
        self.speculative_num_steps = state.speculative_num_steps
        self.speculative_num_draft_tokens = state.speculative_num_draft_tokens
        self.applied.append(state.speculative_num_steps)


FAST = {"ema_alpha": 1.0, "warmup_batches": 0, "update_interval": 1}


def test_protocol_is_checkable():
    assert isinstance(RecordingWorker(), AdaptiveSpecWorker)


def test_init_states_builds_every_candidate_once():
    worker = RecordingWorker(3)
    controller = AdaptiveController(worker, None)
    worker.apply_runtime_state(controller.init_states())
    assert worker.built == [(1, 2), (3, 4), (7, 8)]
    assert worker.applied == [3]
    assert controller.init_states().speculative_num_steps == 3  # idempotent: nothing rebuilt
    assert len(worker.built) == 3


def test_initial_tier_added_not_leaked():
    worker = RecordingWorker(2)
    controller = AdaptiveController(worker, None)
    controller.init_states()
    assert [k for k, _ in worker.built] == [1, 2, 3, 7]
    assert controller.current_steps == 2


def test_switches_apply_the_prebuilt_state():
    worker = RecordingWorker(3)
    controller = AdaptiveController(worker, FAST)
    worker.apply_runtime_state(controller.init_states())
    switched = controller.on_verify_complete([3, 3])
    assert switched is not None and switched.speculative_num_steps == 7
    assert worker.speculative_num_steps == 3  # the controller never applies a state itself: its owner does
    worker.apply_runtime_state(switched)
    assert worker.speculative_num_steps == 7 and worker.speculative_num_draft_tokens == 8
    switched = controller.on_verify_complete([0])
    assert switched is not None
    worker.apply_runtime_state(switched)
    assert worker.speculative_num_steps == 1
    assert controller.on_verify_complete([]) is None
    assert worker.applied == [3, 7, 1]
    assert len(worker.built) == 3  # nothing built after start-up
    stats = controller.stats()
    assert stats["num_switches"] == 2 and stats["current_steps"] == 1


def test_thousands_of_switches_build_nothing_new():
    worker = RecordingWorker(3)
    controller = AdaptiveController(worker, FAST)
    controller.init_states()
    for i in range(3000):
        worker.apply_runtime_state(controller.on_verify_complete([6] if i % 2 else [0]))
    assert len(worker.built) == 3
    assert controller.stats()["num_switches"] == 3000


def test_registered_state_is_reused():
    worker = RecordingWorker(3)
    controller = AdaptiveController(worker, None)
    controller.register(worker.build_adaptive_runtime_state(3, 4))
    controller.init_states()
    assert worker.built == [(3, 4), (1, 2), (7, 8)]


def test_config_from_path(tmp_path):
    path = tmp_path / "adaptive.json"
    path.write_text('{"candidate_steps": [2, 4]}')
    worker = RecordingWorker(4)
    controller = AdaptiveController(worker, path)
    assert controller.candidate_steps == [2, 4]


def test_bad_config_fails_before_building():
    worker = RecordingWorker(3)
    with pytest.raises(ValueError, match="ema_alpha"):
        AdaptiveController(worker, {"ema_alpha": 3})
    assert worker.built == []


def test_worker_must_implement_protocol():
    class NotAWorker:
        speculative_num_steps = 3

    with pytest.raises(TypeError, match="build_adaptive_runtime_state"):
        AdaptiveController(NotAWorker(), None)


def test_wrong_state_from_worker():
    class LyingWorker(RecordingWorker):
        def build_adaptive_runtime_state(self, speculative_num_steps, speculative_num_draft_tokens):
            return SpecRuntimeState(5, 6)

    with pytest.raises(ValueError, match="returned a state for 5 steps"):
        AdaptiveController(LyingWorker(3), None).init_states()


def test_round_seconds_reach_the_goodput_policy_and_stats():
    worker = RecordingWorker(3)
    controller = AdaptiveController(worker, {"policy": "goodput", "probe_rounds": 0, "warmup_batches": 100})
    controller.init_states()
    controller.on_verify_complete([3, 1], 0.25)
    controller.on_verify_complete([3, 1], 0.5, sampled=True)
    controller.on_verify_complete([3, 1])  # untimed: no cost sample
    stats = controller.stats()
    assert stats["policy"] == "goodput"
    assert stats["alpha"] == controller.alpha == pytest.approx(4 / 5)
    assert stats["measured_costs"] == {"greedy": {2: {3: 0.25}}, "sampled": {2: {3: 0.5}}}
    assert stats["cost_estimates"][3] == 0.25


def test_a_drafter_with_shadows_is_not_held_back_from_tier_zero():
    # tier 1 at alpha 0 and 1.15x tier 0's cost: tier 0 predicts 15% more goodput, under the blind margin (25%)
    config = {"policy": "goodput", "candidate_steps": [0, 1], "probe_rounds": 0, "blind_zero_margin": 0.25,
              **FAST}

    class Drafter:
        shadow_steps = 4  # NGRAM's: it looks up drafts at tier 0 and reports what they would have accepted

    def tiers(with_shadows):
        worker = RecordingWorker(1)
        if with_shadows:
            worker.drafter = Drafter()
        controller = AdaptiveController(worker, config)
        worker.apply_runtime_state(controller.init_states())
        visited = []
        for _ in range(6):
            steps = controller.current_steps
            visited.append(steps)
            worker.apply_runtime_state(controller.on_verify_complete([0, 0], 1.0 if steps == 0 else 1.15))
        return visited

    assert tiers(with_shadows=False) == [1] * 6  # blind at tier 0 (EAGLE): held back
    assert tiers(with_shadows=True)[1] == 0      # the first decision goes
