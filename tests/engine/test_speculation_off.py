"""Per-request speculation control: a request with ``disable_speculative_decoding`` decodes inside a speculating
batch exactly as it decodes alone at tier 0 (greedy, and sampled with a seed), verifies no draft, and the other
requests keep their tier and their tokens."""

from __future__ import annotations

import pytest

from specswap.engine import Engine
from specswap.sampling import SamplingParams

PROMPTS = ["def fibonacci(n):\n", "1, 2, 3, 4, 5, 6,", "for i in range(10):\n    print(i)\n"]
NEW_TOKENS = 32
OFF = 1  # the request with speculation off


def run(engine: Engine, prompts, params) -> dict[int, object]:
    ids = [engine.add_request(prompt, params=p) for prompt, p in zip(prompts, params)]
    finished, tiers = {}, []
    while engine.has_unfinished():
        step = engine.step()
        tiers.append(step.tier)
        finished.update((output.request_id, output) for output in step.finished)
    return [finished[i] for i in ids], tiers


def engine_for(algorithm: str, steps: int, tiers=(0, 3)) -> Engine:
    config = {"candidate_steps": list(tiers), "warmup_batches": 10_000}  # adaptive only to build tier 0 too
    return Engine("tiny", speculative_algorithm=algorithm, speculative_num_steps=steps, speculative_adaptive=True,
                  speculative_adaptive_config=config, max_batch_size=4, max_seq_len=128)


@pytest.mark.parametrize("algorithm", ["EAGLE", "STANDALONE", "NGRAM"])
@pytest.mark.parametrize("sampling", [dict(temperature=0.0), dict(temperature=0.8, top_k=20)])
def test_a_request_with_speculation_off_gets_its_tier_zero_tokens_and_the_others_keep_theirs(algorithm, sampling):
    params = [SamplingParams(max_new_tokens=NEW_TOKENS, seed=11 + i, **sampling) for i in range(len(PROMPTS))]
    off = SamplingParams(max_new_tokens=NEW_TOKENS, seed=11 + OFF, disable_speculative_decoding=True, **sampling)
    mixed, tiers = run(engine_for(algorithm, 3), PROMPTS, [*params[:OFF], off, *params[OFF + 1:]])
    assert set(tiers) == {3}  # the batch kept speculating
    alone, alone_tiers = run(engine_for(algorithm, 0), [PROMPTS[OFF]], [params[OFF]])
    assert set(alone_tiers) == {0}
    assert mixed[OFF].token_ids == alone[0].token_ids
    assert mixed[OFF].num_draft_tokens == 0 and set(mixed[OFF].accept_lengths) == {0}
    others = [i for i in range(len(PROMPTS)) if i != OFF]
    without, _ = run(engine_for(algorithm, 3), [PROMPTS[i] for i in others], [params[i] for i in others])
    assert [mixed[i].token_ids for i in others] == [r.token_ids for r in without]
    for i in others:  # every round verified 3 drafts for them (NGRAM: those with something to look up)
        drafted, rounds = mixed[i].num_draft_tokens, mixed[i].num_verify_rounds
        assert drafted == 3 * rounds if algorithm != "NGRAM" else 0 < drafted <= 3 * rounds


def test_requests_with_speculation_off_are_not_acceptance_observations():
    engine = engine_for("NGRAM", 3)
    off = SamplingParams(max_new_tokens=NEW_TOKENS, disable_speculative_decoding=True)
    run(engine, ["1, 2, 3, 1, 2, 3, 1, 2, 3,"], [off])
    stats = engine.stats()
    assert stats["num_verify_rounds"] > 0 and stats["mean_accept_length"] == 0.0
    assert engine.controller.params.num_batches == 0


def test_round_graphs_are_left_for_a_batch_with_speculation_off():
    """A greedy batch replays its whole-round graph only when every request speculates."""
    engine = Engine("tiny", speculative_algorithm="EAGLE", speculative_num_steps=3, max_batch_size=4,
                    max_seq_len=128)
    round_ = engine.worker.rounds[3]
    replays = []
    (graph,) = round_.graphs  # EAGLE alone: one whole-round graph a tier

    def counted(slots, key_length):
        replays.append(len(slots))
        return graph(slots, key_length)

    round_.graphs = (counted,)
    off = SamplingParams(max_new_tokens=8, disable_speculative_decoding=True)
    run(engine, PROMPTS[:2], [SamplingParams(max_new_tokens=8), off])
    assert replays == []
    run(engine, PROMPTS[:2], [SamplingParams(max_new_tokens=8)] * 2)
    assert replays
