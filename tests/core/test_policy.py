"""The adaptive policy, behaviour by behaviour (REFERENCE.md section 1)."""

import pytest

from specswap import AdaptiveConfig, AdaptiveSpeculativeParams


def make(initial=3, **overrides):
    return AdaptiveSpeculativeParams(initial, AdaptiveConfig(**overrides))


def fast(**overrides):
    # switch decisions on every batch
    return dict(warmup_batches=0, update_interval=1, **overrides)


def test_defaults_match_upstream():
    config = AdaptiveConfig()
    assert config.candidate_steps == [1, 3, 7]
    assert config.ema_alpha == 0.2
    assert config.update_interval == 5
    assert config.warmup_batches == 10
    assert config.down_hysteresis == -0.25
    assert config.up_hysteresis == 0.0
    assert config.snap_initial_steps is False


def test_snap_initial_steps_prefers_larger_on_tie():
    params = make(2, snap_initial_steps=True)
    assert params.current_tier == 3
    assert params.ema == 2.0
    assert params.candidate_tiers == [1, 3, 7]


def test_snap_to_nearest():
    assert make(6, snap_initial_steps=True).current_tier == 7
    assert make(4, snap_initial_steps=True).current_tier == 3
    assert make(0, snap_initial_steps=True).current_tier == 1


def test_initial_step_joins_candidates_by_default():
    params = make(2)
    assert params.current_tier == 2
    assert params.candidate_tiers == [1, 2, 3, 7]
    assert params.ema == 1.0


def test_candidates_sorted_and_deduplicated():
    params = make(3, candidate_steps=[7, 1, 3, 3, 1])
    assert params.candidate_tiers == [1, 3, 7]


def test_ema_starts_at_initial_minus_one():
    assert make(7).ema == 6.0
    assert make(1).ema == 0.0


def test_warmup_then_interval():
    params = make(3, warmup_batches=1, update_interval=2, ema_alpha=1.0)
    # EMA falls to 0 after the first zero batch, low enough to go down to 1,
    # but batch 1 is warmup and batch 2 is off-interval.
    assert params.update([0]) is False
    assert params.current_tier == 3
    assert params.update([0]) is False
    assert params.current_tier == 3
    assert params.update([0]) is True
    assert params.current_tier == 1
    assert params.num_batches == 3


def test_ema_updates_during_warmup():
    params = make(3, warmup_batches=5, ema_alpha=0.5)
    params.update([0])
    assert params.ema == pytest.approx(1.0)
    assert params.current_tier == 3


def test_empty_batch_changes_nothing():
    params = make(3, **fast())
    before = params.ema
    assert params.update([]) is False
    assert params.ema == before
    assert params.num_batches == 0
    assert params.current_tier == 3


def test_empty_batches_do_not_use_up_warmup():
    params = make(3, warmup_batches=2, update_interval=1, ema_alpha=1.0)
    for _ in range(10):
        params.update([])
    assert params.update([0]) is False  # still the first warmup batch
    assert params.update([0]) is False
    assert params.update([0]) is True


def test_batch_reduced_to_plain_mean():
    params = make(3, ema_alpha=1.0, warmup_batches=100)
    params.update([0, 1, 2, 5])
    assert params.ema == pytest.approx(2.0)


def test_ramp_up_one_three_seven():
    params = make(1, **fast(ema_alpha=1.0))
    assert params.update([1]) is True  # ema 1.0 > 0.5: up to 3; 1.0 > 2.5? no
    assert params.current_tier == 3
    assert params.update([3]) is True  # 3.0 > 2.5: up to 7
    assert params.current_tier == 7


def test_several_tiers_in_one_recompute():
    params = make(1, **fast(ema_alpha=1.0))
    assert params.update([6]) is True
    assert params.current_tier == 7
    assert params.update([0]) is True
    assert params.current_tier == 1


def test_seven_to_one_in_one_recompute():
    params = make(7, **fast(ema_alpha=1.0))
    assert params.update([0]) is True
    assert params.current_tier == 1


def test_thresholds_with_defaults():
    # from 3: down to 1 when ema <= 0.25, up to 7 when ema > 2.5
    for value, expected in [(0.25, 1), (0.26, 3), (2.5, 3), (2.51, 7)]:
        params = make(3, **fast(ema_alpha=1.0))
        params.update(_lengths_with_mean(value))
        assert params.current_tier == expected, (value, params.ema)
    # from 7: down to 3 when ema <= 2.25
    for value, expected in [(2.25, 3), (2.3, 7)]:
        params = make(7, **fast(ema_alpha=1.0))
        params.update(_lengths_with_mean(value))
        assert params.current_tier == expected, (value, params.ema)


def _lengths_with_mean(value):
    # 100 requests whose accepted counts average exactly `value` (two decimals)
    total = round(value * 100)
    base, extra = divmod(total, 100)
    return [base + 1] * extra + [base] * (100 - extra)


def test_exactly_two_and_a_half_does_not_go_up():
    params = make(3, **fast(ema_alpha=1.0))
    assert params.update([2, 3]) is False
    assert params.ema == 2.5
    assert params.current_tier == 3


def test_exactly_half_goes_down():
    params = make(3, **fast(ema_alpha=1.0, down_hysteresis=0.0))
    assert params.update([0, 1]) is True
    assert params.ema == 0.5
    assert params.current_tier == 1


def test_up_hysteresis_blocks_rise():
    params = make(3, **fast(ema_alpha=1.0, up_hysteresis=0.75))
    assert params.update([3]) is False  # 3.0 > 2.5 but not > 3.25
    assert params.current_tier == 3
    assert params.update([4]) is True
    assert params.current_tier == 7


def test_down_hysteresis_blocks_drop():
    params = make(3, **fast(ema_alpha=1.0, down_hysteresis=-0.75))
    params.update([0, 0, 0, 1])  # 0.25 <= 0.25 would drop with the default
    assert params.current_tier == 3
    params = make(3, **fast(ema_alpha=1.0))
    params.update([0, 0, 0, 1])
    assert params.current_tier == 1


def test_alpha_half_sequence():
    params = make(1, **fast(ema_alpha=0.5, candidate_steps=[1, 3, 7]))
    assert params.ema == 0.0
    steps = []
    emas = []
    for batch in ([6], [0], [0], [0]):
        params.update(batch)
        emas.append(params.ema)
        steps.append(params.current_tier)
    assert emas == [3.0, 1.5, 0.75, 0.375]
    # 3.0: 1 -> 3 -> 7; 1.5 <= 2.25: 7 -> 3; 0.75 stays; 0.375 > 0.25 stays
    assert steps == [7, 3, 3, 3]
    params.update([0])  # 0.1875 <= 0.25: down to 1
    assert params.current_tier == 1


def test_returns_true_only_on_change():
    params = make(3, **fast(ema_alpha=1.0))
    assert params.update([2]) is False
    assert params.update([2]) is False
    assert params.current_tier == 3


def test_zero_tier_speculation_off():
    # The up loop leaves tier 0 whenever ema > -0.5 + up_hysteresis, so holding
    # tier 0 needs up_hysteresis >= 0.5 (documented in docs/policy.md).
    params = make(1, **fast(ema_alpha=1.0, candidate_steps=[0, 1, 3], down_hysteresis=0.5))
    assert params.update([0]) is False  # down to 0, then straight back up to 1
    assert params.current_tier == 1
    params = make(
        1, **fast(ema_alpha=1.0, candidate_steps=[0, 1, 3], down_hysteresis=0.5, up_hysteresis=0.5)
    )
    assert params.update([0]) is True  # 0 <= 0 - 0.5 + 0.5, and 0 > 0 fails
    assert params.current_tier == 0
    assert params.update([1]) is True  # 1 > 0.0: back up to 1
    assert params.current_tier == 1


def test_initial_tier_out_of_range():
    with pytest.raises(ValueError, match="the initial tier must be an integer in"):
        make(-1)
    with pytest.raises(ValueError, match="the initial tier must be an integer in"):
        make(65)
