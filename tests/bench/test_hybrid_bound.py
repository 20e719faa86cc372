"""bench/hybrid_bound.py's counting: where EAGLE's rounds began, the hindsight choice per round, the gains, the measured speeds."""

import itertools
import json
import random

import pytest

from scripts import load_script

bound = load_script("hybrid_bound")
replay = load_script("suffix_replay")


def test_round_starts_follow_the_accepted_drafts():
    # first output token from the prefill; a round that accepts a drafts emits a + 1 tokens
    assert bound.round_starts([2, 0, 3, 1], 8) == [(1, 2), (4, 0), (5, 3)]  # the last began at 9 >= 8: none
    assert bound.round_starts([], 5) == []


def test_every_drafter_is_judged_at_eagles_round_starts():
    k = 2
    # output positions 1..6: the trees' chain accepts 2 at 1 and nothing at odd positions; lookup drafts only at
    # 4 (accepting 1), where it goes first though the trees would accept 2 there
    positions = [replay.Position({k: 1 if p == 4 else None},
                                 {k: 2 if p in (1, 4) else (0 if p % 2 else None)}, {k: None})
                 for p in range(1, 7)]
    row = {"accept_lengths": [0, 1, 2], "output_ids": list(range(7))}  # EAGLE's rounds begin at 1, 2, 4
    figures = bound.phase_figures([row], [positions], k)
    assert figures["rounds"] == 3
    assert figures["eagle_tokens_per_round"] == pytest.approx((1 + 2 + 3) / 3)
    # SUFFIX as built: the trees at 1 (3 tokens), nothing at 2 (a plain decode), lookup first at 4 (2 tokens)
    assert figures["suffix_tokens_per_round"] == pytest.approx((3 + 1 + 2) / 3)
    # the hybrid in hindsight: the trees at 1 (3), EAGLE at 2 (2), a tie at 4 (3: EAGLE's draft)
    assert figures["hybrid_tokens_per_round"] == pytest.approx((3 + 2 + 3) / 3)
    assert figures["suffix_share"] == pytest.approx(1 / 3)
    assert figures["pairs"] == [(0, 2), (1, None), (2, 2)]  # EAGLE's accepted, the longer suffix chain's


def brute_force(rounds):
    return max(sum(t for t, _ in picks) / sum(c for _, c in picks) for picks in itertools.product(*rounds))


def test_the_best_ratio_is_the_best_choice_per_round():
    rng = random.Random(7)
    for _ in range(50):
        rounds = [[(rng.randint(1, 8), rng.uniform(0.005, 0.05)) for _ in range(rng.randint(1, 3))]
                  for _ in range(rng.randint(1, 6))]
        assert bound.best_ratio(rounds) == pytest.approx(brute_force(rounds))
    # the most tokens per round is not the most per second: a tie goes to the cheaper round
    assert bound.best_ratio([[(2, 0.03), (2, 0.02)], [(3, 0.03), (2, 0.02)]]) == pytest.approx(4 / 0.04)


def test_speeds_and_the_gain_over_each_drafter_at_its_own_best_tier():
    # EAGLE's accepted drafts and the longer suffix chain's (None: none), per round
    figures = {"eagle_tokens_per_round": 2.0, "suffix_tokens_per_round": 2.0, "suffix_drafted": 2 / 3,
               "pairs": [(0, 2), (2, None), (1, 1)]}
    # EAGLE's rounds at 30 ms, a verify alone 20 ms, a plain decode 15 ms
    speeds = bound.tier_speeds(figures, 0.03, 0.02, 0.015)
    assert speeds["EAGLE"] == pytest.approx(2.0 / 0.03)
    assert speeds["SUFFIX"] == pytest.approx(2.0 / (2 / 3 * 0.02 + 1 / 3 * 0.015))  # a plain decode where none
    # against EAGLE: the suffix chain at 1 (3 tokens, 20 ms), EAGLE at 2 (3, 30 ms), the tie at 3 to the suffix
    # chain's cheaper verify (2, 20 ms); a plain decode (66 tokens a second) pays nowhere
    assert speeds["hybrid_vs_EAGLE"] == pytest.approx(8 / 0.07)
    cheap_plain = bound.tier_speeds(figures, 0.03, 0.02, 0.01)
    assert cheap_plain["hybrid_vs_EAGLE"] == pytest.approx(5 / 0.04)  # here it does: at 2 and 3
    assert cheap_plain["drafts_only_vs_EAGLE"] == pytest.approx(8 / 0.07)  # but not choosing between drafts only
    # against SUFFIX, EAGLE's draft free: every round at the verify alone
    assert speeds["hybrid_vs_SUFFIX"] == pytest.approx(8 / 0.06)
    # the hybrid at its best tier over the drafter at its own best tier, not at the hybrid's
    by_tier = {1: {"EAGLE": 100.0, "hybrid_vs_EAGLE": 104.0}, 4: {"EAGLE": 60.0, "hybrid_vs_EAGLE": 108.0}}
    assert bound.gain_over(by_tier, "EAGLE") == (pytest.approx(1.08), 4, 1)


def test_measured_speeds_read_the_mixed_benchmark(tmp_path):
    phase = lambda name, speed: {"name": name, "throughput_tok_s": speed}  # noqa: E731
    data = {"speculative_algorithm": "EAGLE", "modes": {
        "adaptive": {"overall": {"throughput_tok_s": 140.0}, "phases": [phase("resample", 120.0), phase("low", 130.0)]},
        "adaptive@SUFFIX": {"overall": {"throughput_tok_s": 150.0},
                            "phases": [phase("resample", 145.0), phase("low", 110.0)]}}}
    path = tmp_path / "mixed.json"
    path.write_text(json.dumps(data))
    phases, overall, openvino = bound.measured_speeds(str(path))
    assert openvino is None
    assert phases == [{"phase": "resample", "EAGLE": 120.0, "SUFFIX": 145.0},
                      {"phase": "low", "EAGLE": 130.0, "SUFFIX": 110.0}]
    assert overall == {"EAGLE": 140.0, "SUFFIX": 150.0}
    data["speculative_algorithm"] = "NGRAM"
    path.write_text(json.dumps(data))
    with pytest.raises(SystemExit, match="needs a model drafter's run"):
        bound.measured_speeds(str(path))


def test_measured_speeds_read_the_peer_bench_and_openvinos_best_lookup(tmp_path):
    row = lambda runtime, mode, speed, temperature=0.0: {  # noqa: E731
        "set": "code", "temperature": temperature, "runtime": runtime, "mode": mode, "tokens_per_second": speed}
    data = {"results": [row("openvino", "plain", 60.0), row("openvino", "prompt-lookup-3", 100.0),
                        row("openvino", "prompt-lookup-5", 107.0), row("specswap", "target-only", 77.0),
                        row("specswap", "eagle adaptive", 130.0), row("specswap", "suffix adaptive", 117.0),
                        row("specswap", "eagle adaptive", 90.0, temperature=1.0)]}
    path = tmp_path / "peers.json"
    path.write_text(json.dumps(data))
    phases, overall, openvino = bound.measured_speeds(str(path))
    assert phases == [{"phase": "code", "EAGLE": 130.0, "SUFFIX": 117.0}]  # the greedy rows only
    assert overall == {"EAGLE": 130.0, "SUFFIX": 117.0}
    assert openvino == 107.0  # its best lookup, never its plain decoding
    data["results"] = [r for r in data["results"] if r["mode"] != "suffix adaptive"]
    path.write_text(json.dumps(data))
    with pytest.raises(SystemExit, match="missing \\['suffix adaptive'\\]"):
        bound.measured_speeds(str(path))


def test_target_only_is_served_without_a_drafter(monkeypatch):
    built = []

    class Output:
        prompt_token_ids, token_ids, accept_lengths = [1, 2], [3, 4], [0]

    class FakeEngine:
        tokenizer = None

        def __init__(self, model, **keywords):
            built.append(keywords)

        def generate(self, prompts, max_new_tokens, **keywords):
            return [Output()]

    import specswap.engine
    monkeypatch.setattr(specswap.engine, "Engine", FakeEngine)
    monkeypatch.setattr(bound.NumberTokens, "from_tokenizer", staticmethod(lambda tokenizer: None))
    args = bound.build_parser().parse_args(["--workload", "code", "--requests-per-phase", "1"])
    phases = bound.workload_phases(args)
    assert [(p.name, len(p.prompts), p.temperature) for p in phases] == [("code", 1, 0.0)]
    rows, _, _ = bound.serve(args, None, phases)
    bound.serve(args, 3, phases)
    # the Engine's default algorithm is EAGLE: target-only must say None
    assert built[0]["speculative_algorithm"] is None
    assert (built[1]["speculative_algorithm"], built[1]["speculative_num_steps"]) == ("EAGLE", 3)
    assert rows == [{"phase": "code", "prompt_ids": [1, 2], "output_ids": [3, 4], "accept_lengths": [0]}]
