"""NGRAM drafting (specswap.prompt_lookup): prompt lookup, the wildcard for a changed token, counters extrapolated."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specswap.prompt_lookup import NgramIndex, NumberTokens, lookup_ngram, propose_ngram, propose_ngram_tree

NUMBERS = NumberTokens(range(100, 110))  # token 100 + d is the digit d; text tokens are below 100
ID, EQ, SEMI, NL = 1, 2, 3, 4


def digits(text: str) -> list[int]:
    return [100 + int(char) for char in text]


def lines(*values: str) -> list[int]:
    """``id = <value> ;\\n`` per value."""
    out = []
    for value in values:
        out += [ID, EQ, *digits(value), SEMI, NL]
    return out


def test_ngram_proposals_continue_the_latest_longest_match():
    assert propose_ngram([1, 2, 3, 4, 1, 2], 3) == [3, 4, 1]
    assert propose_ngram([7, 1, 2, 9, 5, 2, 1, 2], 2) == [9, 5]        # longest suffix [1, 2] wins over [2]
    assert propose_ngram([1, 2, 9, 1, 2], 4) == [9, 1, 2, 9]          # the copy runs on over its own drafts
    assert propose_ngram([5, 6, 5, 6], 5) == [5, 6, 5, 6, 5]          # periodic text: as many steps as asked
    assert propose_ngram([1, 2, 3], 2) == []                           # no match: nothing worth verifying
    assert propose_ngram([4, 8, 4, 6, 4], 1) == [6]                    # the latest occurrence
    # lookup_ngram: the same drafts and the length of the match they continue (what the hybrid keys its means on)
    assert lookup_ngram([7, 1, 2, 9, 5, 2, 1, 2], 2) == ([9, 5], 2)
    assert lookup_ngram([1, 2, 3, 1], 2) == ([2, 3], 1) and lookup_ngram([1, 2, 3], 2) == ([], 0)
    assert lookup_ngram([8, 1, 2, 3, 4, 5, 1, 2, 3, 4], 3) == ([5, 1, 2], 4)  # at most NGRAM_MAX_MATCH


def test_ngram_proposals_skip_a_changed_token_inside_a_repeated_template():
    # "id = 3 ; SELECT ... id = 4": no suffix [=, 4] occurred, but [id, =] before a changed token did
    template = [10, 11, 3, 12, 13, 10, 11, 4]
    assert propose_ngram(template, 4) == [12, 13, 10, 11]
    # an exact match of the same length wins over a skip: [2, 9] -> 6 rather than [1, 2, *] -> 8
    assert propose_ngram([1, 2, 5, 8, 2, 9, 6, 0, 1, 2, 9], 1) == [6]
    # three tokens of context before a skip beat an exact two-token match: [5, 6, 7, *] over [7, 8]
    assert propose_ngram([5, 6, 7, 1, 2, 7, 8, 3, 5, 6, 7, 8], 2) == [2, 7]
    # a one-token context is too common to skip on: the last token alone is looked up
    assert propose_ngram([1, 2, 3, 1, 4], 2) == []


def test_numbers_in_a_repeated_template_continue_their_difference():
    text = lines("1", "2") + [ID, EQ]
    assert propose_ngram(text, 8, numbers=NUMBERS) == [*digits("3"), SEMI, NL, ID, EQ, *digits("4"), SEMI, NL]
    assert propose_ngram(text, 8) == [*digits("2"), SEMI, NL, ID, EQ, *digits("2"), SEMI, NL]  # plain lookup copies
    # a carry changes the number of digits (and of tokens); steps of 5; a countdown
    assert propose_ngram(lines("8", "9") + [ID, EQ], 8, numbers=NUMBERS) == [*digits("10"), SEMI, NL, ID, EQ,
                                                                          *digits("11")]
    assert propose_ngram(lines("25", "30") + [ID, EQ], 2, numbers=NUMBERS) == digits("35")
    assert propose_ngram(lines("12", "11") + [ID, EQ], 2, numbers=NUMBERS) == digits("10")
    # zero-padded numbers keep their width; a difference that would go below zero copies instead
    assert propose_ngram(lines("008", "009") + [ID, EQ], 3, numbers=NUMBERS) == digits("010")
    assert propose_ngram(lines("5", "2") + [ID, EQ], 1, numbers=NUMBERS) == digits("2")
    # equal numbers stay equal: constants in a template are copied as before
    assert propose_ngram(lines("64", "64") + [ID, EQ], 2, numbers=NUMBERS) == digits("64")


def test_numbers_are_copied_where_there_is_no_earlier_occurrence_to_compare():
    # one earlier line only: nothing to take a difference from
    assert propose_ngram(lines("7") + [ID, EQ], 4, numbers=NUMBERS) == [*digits("7"), SEMI, NL, ID]
    # the occurrence before has text where the latest has a number: the two do not line up
    text = [ID, EQ, 50, SEMI, NL] + lines("7") + [ID, EQ]
    assert propose_ngram(text, 4, numbers=NUMBERS) == [*digits("7"), SEMI, NL, ID]


def test_a_number_the_text_ends_inside_is_finished_where_its_written_digits_agree():
    # 10, 11, then "1" written: the extrapolated 12 starts with it, so its "2" is drafted
    assert propose_ngram(lines("10", "11") + [ID, EQ, 101], 3, numbers=NUMBERS) == [*digits("2"), SEMI, NL]
    # "2" written where 12 was due: the source's remaining digits are copied, and no counter follows
    assert propose_ngram(lines("10", "11") + [ID, EQ, 102], 4, numbers=NUMBERS) == [*digits("1"), SEMI, NL, ID]


def test_number_tokens_come_only_from_a_tokenizer_that_writes_one_digit_per_token():
    class Tokenizer:
        def __init__(self, merged=()):
            self.merged = merged

        def encode(self, text, add_bos=False):
            out, i = [], 0
            while i < len(text):
                pair = text[i:i + 2]
                if pair in self.merged:
                    out.append(200 + self.merged.index(pair))
                    i += 2
                else:
                    out.append(100 + int(text[i]) if text[i].isdigit() else 1)
                    i += 1
            return out

    assert NumberTokens.from_tokenizer(Tokenizer()).ids == tuple(range(100, 110))
    assert NumberTokens.from_tokenizer(Tokenizer(merged=("12",))) is None  # a merged pair: numbers would not follow
    assert NumberTokens.from_tokenizer(Tokenizer(merged=("80",))) is None  # merged only in the second probe
    with pytest.raises(ValueError, match="ten distinct"):
        NumberTokens([1, 2, 3])


# the bigram target continues 20 with 54: prompts ending in 20 run on inside their template for a round
COUNTER_PROMPTS = [[20, 54, 1, 20, 54, 2, 20, 54, 3, 20], [20, 54, 8, 9, 20, 54, 9, 0, 20, 54, 9, 9, 20], [5, 6, 7]]


@pytest.mark.parametrize("steps", [1, 3, 7])
def test_counter_drafts_leave_the_greedy_output_target_only(steps, monkeypatch):
    import specswap.worker.ngram
    from spec_helpers import bigram_pair, run_to_completion
    from specswap.worker import SpeculativeWorker

    target = bigram_pair()[0]
    numbers = NumberTokens(range(10))  # tokens 0..9 taken for digits
    extrapolated = []

    def spy(tokens, steps, numbers=None, index=None):
        drafts, match = lookup_ngram(tokens, steps, numbers=numbers, index=index)
        extrapolated.append(drafts != propose_ngram(tokens, steps))
        return drafts, match

    monkeypatch.setattr(specswap.worker.ngram, "lookup_ngram", spy)
    worker = SpeculativeWorker(target, None, "NGRAM", steps, max_batch_size=3, max_seq_len=48, number_tokens=numbers)
    tokens, _, _ = run_to_completion(worker, COUNTER_PROMPTS, 12)
    reference, _, _ = run_to_completion(SpeculativeWorker(target, None, None, max_batch_size=3, max_seq_len=48),
                                        COUNTER_PROMPTS, 12)
    assert tokens == reference
    assert any(extrapolated)  # the drafts were the extrapolated ones at least once (the target then rejected them)


@pytest.mark.capability  # Engine("tiny") takes dtype "auto"
def test_the_engine_gives_ngram_the_digits_of_a_tokenizer_that_splits_numbers():
    from spec_helpers import bigram_pair
    from specswap import Engine

    class DigitTokenizer:  # one token per digit (4 + d), everything else token 1
        bos_token_id, eos_token_ids = None, set()

        def encode(self, text, add_bos=False):
            return [4 + int(char) if char.isdigit() else 1 for char in text]

        def decode(self, ids, skip_special_tokens=True):
            return "".join(str(i - 4) if 4 <= i < 14 else "x" for i in ids)

    target = bigram_pair()[0]
    engine = Engine(target, None, "NGRAM", tokenizer=DigitTokenizer(), max_seq_len=32)
    assert engine.worker.number_tokens.ids == tuple(range(4, 14))
    assert Engine(target, None, "NGRAM", tokenizer=DigitTokenizer(), max_seq_len=32,
                  ngram_numbers=False).worker.number_tokens is None
    assert Engine(target, None, None, tokenizer=DigitTokenizer(), max_seq_len=32).worker.number_tokens is None
    assert Engine("tiny", speculative_algorithm="NGRAM").worker.number_tokens is None  # its BPE merges "12"


# ---- tier 0's shadow observations ------------------------------------------------------------------------


def test_tier_zero_checks_lookups_against_the_tokens_emitted_since():
    """Every SHADOW_EVERY-th tier-0 round (the first included) looks up the largest tier's drafts for every request;
    once the emitted tokens settle them (a mismatch, or all matched) what that tier would have accepted is
    reported, then forgotten. A request without a lookup beside one with a lookup counts as 0 accepted (the tier
    would have verified its padded row); a round where no request has one is not observed (a plain decode)."""
    import torch

    from specswap.worker.ngram import SHADOW_EVERY, NgramDrafter
    from specswap.worker.slots import SlotTable
    from specswap.worker.drafter import Shadow
    from specswap.worker.layout import ChainLayout
    from specswap.worker.tiers import TierBuffers

    assert SHADOW_EVERY == 4
    table = SlotTable(2, 2, torch.device("cpu"))
    drafter = NgramDrafter(table, None, shadow_steps=3)
    tier0 = TierBuffers(2, 3, 16, 16, torch.device("cpu")).build(0, ChainLayout(0, torch.device("cpu")))
    table.host_tokens[0] = [1, 2, 3, 1]               # looked up: drafts [2, 3, 1]
    table.host_tokens[1] = [5, 6, 7]                  # no lookup, beside one: a padded row
    assert drafter.begin_round(tier0, [0, 1])         # round 1: checked
    assert drafter.take_shadow([0, 1], drafting=False) == Shadow([0], 3)
    table.host_tokens[0] += [2]                       # one token a round at tier 0
    assert drafter.take_shadow([0, 1], drafting=False) is None      # not settled yet
    table.host_tokens[0] += [3]
    assert drafter.take_shadow([0, 1], drafting=False) is None
    table.host_tokens[0] += [9]                       # the third draft (1) missed: two would have been accepted
    assert drafter.take_shadow([0, 1], drafting=False) == Shadow([2], 3)
    assert drafter.take_shadow([0, 1], drafting=False) is None      # reported once
    table.host_tokens[0] = [4, 4, 4, 4]               # drafts [4, 4, 4]
    for _ in range(SHADOW_EVERY - 1):                 # rounds 2-4: not checked
        drafter.begin_round(tier0, [0])
    table.host_tokens[0] += [4, 4, 4]
    assert drafter.take_shadow([0], drafting=False) is None
    table.host_tokens[0] = [4, 4, 4, 4]
    drafter.begin_round(tier0, [0])                   # round 5: checked; all three come true
    table.host_tokens[0] += [4, 4, 4]
    assert drafter.take_shadow([0], drafting=False) == Shadow([3], 3)
    table.host_tokens[0], table.host_tokens[1] = [1, 2, 3], [5, 6, 7]
    for _ in range(SHADOW_EVERY):                     # round 9 checked: no request has a lookup
        drafter.begin_round(tier0, [0, 1])
    assert drafter.take_shadow([0, 1], drafting=False) is None
    table.host_tokens[0] = [4, 4, 4, 4]
    for _ in range(SHADOW_EVERY):                     # round 13 checked
        drafter.begin_round(tier0, [0])
    assert drafter.take_shadow([0], drafting=True) is None           # a drafting round was observed itself
    table.host_tokens[0] += [4, 4, 4]
    assert drafter.take_shadow([0], drafting=False) is None
    assert NgramDrafter(table, None).take_shadow([0], drafting=False) is None  # without tier 0: no checks


def test_tier_zero_shadows_are_what_the_largest_tier_would_have_accepted():
    """A static tier-0 NGRAM worker (tiers 0 and 3) on a looping target reports, for every checked round's
    position p with a lookup (batch 1: a request alone without one is a plain decode), how many of its 3 drafts the tokens emitted from p on confirm: computed here from the
    output afterwards, in the order they settle."""
    from spec_helpers import attention_pair, run_to_completion
    from specswap.worker import SpeculativeWorker
    from specswap.worker.ngram import SHADOW_EVERY

    target = attention_pair()[0]
    prompt, new = [1, 5, 9, 2], 120
    worker = SpeculativeWorker(target, None, "NGRAM", speculative_num_steps=0, tiers=(0, 3), max_seq_len=160)
    shadows = []
    decode_round = worker.decode_round

    def recording(slots):
        result = decode_round(slots)
        if result.shadow is not None:
            assert result.shadow.steps == 3
            shadows.extend(result.shadow.accept_lengths)
        return result

    worker.decode_round = recording
    output = run_to_completion(worker, [prompt], new)[0][0]
    tokens = prompt + output
    expected = []
    for p in range(len(prompt) + 1, len(tokens)):  # positions a tier-0 round starts from, every 4th checked
        drafts = propose_ngram(tokens[:p], 3) if (p - len(prompt) - 1) % SHADOW_EVERY == 0 else []
        if not drafts:
            continue
        emitted = tokens[p:p + 3]
        accepted = next((i for i, (d, t) in enumerate(zip(drafts, emitted)) if d != t), len(emitted))
        if accepted < len(emitted) or len(emitted) == 3:
            expected.append(accepted)
    assert len(expected) >= 10 and shadows == expected


def test_the_engine_feeds_tier_zero_shadows_to_its_controller(monkeypatch):
    from spec_helpers import attention_pair
    from specswap.controller import AdaptiveController
    from specswap.engine import Engine

    fed = []
    observe = AdaptiveController.observe

    def recording(self, result):
        if result.shadow is not None:
            fed.append((result.shadow.accept_lengths, result.shadow.steps))
        return observe(self, result)

    monkeypatch.setattr(AdaptiveController, "observe", recording)
    config = {"policy": "goodput", "candidate_steps": [0, 3], "probe_rounds": 0, "probe_interval": 10_000,
              "warmup_batches": 10_000, "update_interval": 1_000}  # no decision, no return probe: tier 0 throughout
    engine = Engine(attention_pair()[0], None, "NGRAM", speculative_num_steps=0, speculative_adaptive=True,
                    speculative_adaptive_config=config, max_seq_len=160)
    engine.generate([[1, 5, 9, 2]], 60)
    assert fed and all(steps == 3 for _, steps in fed)


# ---- the n-gram index: the same drafts as the scan -------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 13), min_size=1, max_size=90), st.integers(1, 7), st.booleans(),
       st.integers(1, 6))
def test_the_index_finds_what_the_scan_finds(text, steps, with_numbers, chunk):
    """Over a text growing ``chunk`` tokens at a time (digits 0..9 as numbers or not), one NgramIndex synced
    along gives the chain's and the trie's drafts the scan gives, at every length."""
    numbers = NumberTokens(range(10)) if with_numbers else None
    index, tokens = NgramIndex(), []
    for start in range(0, len(text), chunk):
        tokens.extend(text[start:start + chunk])  # the same list object, grown in place as the slot table does
        assert propose_ngram(tokens, steps, numbers=numbers, index=index) == propose_ngram(tokens, steps,
                                                                                              numbers=numbers)
        assert (propose_ngram_tree(tokens, 3, 2, 6, numbers=numbers, index=index)
                == propose_ngram_tree(tokens, 3, 2, 6, numbers=numbers))


def test_the_index_starts_over_for_another_list_and_scans_longer_patterns():
    index = NgramIndex(max_size=2)
    first = [1, 2, 3, 1, 2]
    assert propose_ngram(first, 2, index=index) == [3, 1]
    second = [4, 5, 6, 4, 5]  # a new request in the slot: another list object
    assert propose_ngram(second, 2, index=index) == [6, 4]
    assert index.latest_end([6, 4, 5], 5) == 5  # longer than the index keeps: the scan
    shorter = second[:2]
    index.sync(shorter)
    assert index.latest_end([4], 2) == 1
