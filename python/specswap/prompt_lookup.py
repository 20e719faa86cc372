"""NGRAM drafting (prompt lookup): a request's drafts are looked up in its own prompt and output.

Pure Python over the request's host-side token list; no model, no torch. The worker calls ``propose_ngram``
once per request and round.

Three lookups, tried in this order for each suffix length m from NGRAM_MAX_MATCH down to NGRAM_MIN_MATCH:

1. the latest earlier occurrence of the last m tokens: its continuation is the draft (what transformers'
   prompt lookup, vLLM's ngram and SGLang's NGRAM do);
2. from m >= 2, the m tokens before the last one with the last one as a wildcard: in a repeated template the
   new token is a counter or a name (``id = 4`` after ``id = 3;``) and the template goes on after it;
3. with ``numbers`` (a tokenizer that writes numbers one digit per token), numbers in the continuation are
   extrapolated instead of copied: where the occurrence before the latest one has a number at the same place,
   the draft carries on the difference (``id = 3`` after ``id = 2`` drafts ``id = 4``, ``price: 35`` after
   ``30``, ``25`` drafts ``40``). Without a second occurrence, or where the two do not line up, it copies.

The copy runs on over the drafts themselves where the text runs out (an overlapping copy, as in LZ77):
periodic text continues for as many steps as asked, not for one period. A draft only proposes: the target's
verification decides every token, so a wrong guess costs acceptance, never correctness.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Sequence

__all__ = ["NGRAM_MAX_MATCH", "NGRAM_MIN_MATCH", "NgramIndex", "NumberTokens", "lookup_ngram", "propose_ngram",
           "propose_ngram_tree"]

NGRAM_MAX_MATCH = 4
NGRAM_MIN_MATCH = 1


class NumberTokens:
    """The token ids of the digits '0'..'9' for a tokenizer that writes every number one digit per token
    (Gemma, Llama 2): what lets NGRAM drafts extrapolate counters. ``from_tokenizer`` returns None for a
    tokenizer that merges digits (its numbers' tokens would not follow from their digits)."""

    def __init__(self, digit_ids: Sequence[int]):
        if len(digit_ids) != 10 or len(set(digit_ids)) != 10:
            raise ValueError(f"NumberTokens needs ten distinct token ids for '0'..'9'; got {list(digit_ids)}")
        self.ids = tuple(int(i) for i in digit_ids)
        self.digit = {token: digit for digit, token in enumerate(self.ids)}  # token id -> 0..9

    @classmethod
    def from_tokenizer(cls, tokenizer) -> "NumberTokens | None":
        """From ``tokenizer.encode(text, add_bos=False)``: None unless "0123456789" and "90817263544536271809"
        encode as one token per digit, the same token for the same digit."""
        try:
            first = tokenizer.encode("0123456789", add_bos=False)
            second = tokenizer.encode("90817263544536271809", add_bos=False)
        except Exception:  # noqa: BLE001 - a tokenizer that cannot encode plain digits gets no counters
            return None
        if len(first) != 10 or len(second) != 20 or len(set(first)) != 10:
            return None
        if any(token != first[int(char)] for char, token in zip("90817263544536271809", second)):
            return None
        return cls(first)

    def tokens_of(self, value: int, width: int) -> list[int]:
        """The tokens of ``value`` in decimal, zero-padded to ``width`` digits."""
        return [self.ids[int(char)] for char in str(value).zfill(width)]

    def __repr__(self) -> str:
        return f"NumberTokens({list(self.ids)})"


class NgramIndex:
    """Where every n-gram (n = 1..``max_size``) of one request's growing token list ends, so that a lookup finds
    the latest occurrence of a suffix by a dict and a bisection instead of a scan back through the whole text
    (what made a lookup cost 0.2 ms at 300 tokens). ``sync(tokens)`` indexes what was appended since the last
    call; another list object, or a shorter one, starts the index over. Longer patterns fall back to the scan."""

    def __init__(self, max_size: int = NGRAM_MAX_MATCH):
        self.max_size = max_size
        self._tokens: list[int] | None = None
        self._indexed = 0
        self._ends: list[dict[tuple[int, ...], list[int]]] = [{} for _ in range(max_size + 1)]

    def sync(self, tokens: list[int]) -> None:
        if tokens is not self._tokens or len(tokens) < self._indexed:
            self._tokens, self._indexed = tokens, 0
            self._ends = [{} for _ in range(self.max_size + 1)]
        ends = self._ends
        for end in range(self._indexed + 1, len(tokens) + 1):
            for size in range(1, min(self.max_size, end) + 1):
                ends[size].setdefault(tuple(tokens[end - size:end]), []).append(end)
        self._indexed = len(tokens)

    def latest_end(self, pattern: Sequence[int], last_end: int) -> int | None:
        """``_latest_end`` over the synced tokens."""
        size = len(pattern)
        if size > self.max_size:
            return _latest_end(self._tokens, list(pattern), last_end)
        ends = self._ends[size].get(tuple(pattern))
        if not ends:
            return None
        found = bisect_right(ends, last_end)
        return ends[found - 1] if found else None


def propose_ngram(tokens: list[int], steps: int, max_match: int = NGRAM_MAX_MATCH, min_match: int = NGRAM_MIN_MATCH,
                  numbers: NumberTokens | None = None, index: NgramIndex | None = None) -> list[int]:
    """Up to ``steps`` draft tokens continuing ``tokens`` (see the module docstring); [] when no suffix occurs
    earlier (not even the last token): a guess then would only widen the verify. ``index``: the request's
    ``NgramIndex`` (synced here), the same drafts found faster."""
    return lookup_ngram(tokens, steps, max_match, min_match, numbers, index)[0]


def lookup_ngram(tokens: list[int], steps: int, max_match: int = NGRAM_MAX_MATCH, min_match: int = NGRAM_MIN_MATCH,
                 numbers: NumberTokens | None = None, index: NgramIndex | None = None) -> tuple[list[int], int]:
    """``propose_ngram``'s drafts and the length of the match they continue (([], 0): none)."""
    find = _finder(tokens, index)
    length = len(tokens)
    for size in range(min(max_match, length - 1), min_match - 1, -1):
        lookups = [(tokens[length - size:], length - 1, 0)]  # (pattern, latest end allowed, tokens skipped after)
        if 2 <= size <= length - 2:  # the same length of context before a changed last token
            lookups.append((tokens[length - 1 - size:length - 1], length - 2, 1))
        for pattern, last_end, skip in lookups:
            end = find(pattern, last_end)
            if end is None:
                continue
            sources = [end + skip]
            if numbers is not None:  # the occurrence before, for numbers' differences (by its last two tokens)
                before = find(pattern, end - 1)
                if before is None and size > 2:
                    before = find(pattern[-2:], end - 1)
                if before is not None:
                    sources.append(before + skip)
            return _continue(tokens, sources, steps, numbers), size
    return [], 0


def propose_ngram_tree(tokens: list[int], depth: int, topk: int, max_nodes: int, max_match: int = NGRAM_MAX_MATCH,
                       min_match: int = NGRAM_MIN_MATCH, numbers: NumberTokens | None = None,
                       max_sources: int = 16, index: NgramIndex | None = None) -> tuple[list[int], list[int]]:
    """A trie of continuations: ``propose_ngram``'s drafts first, then what followed other occurrences of the
    text's suffix (the longest suffixes first, the latest occurrences first), merged so that a node keeps at
    most ``topk`` children, the trie at most ``max_nodes`` nodes and ``depth`` levels. Returns (node tokens,
    node parents), nodes numbered from 1 in insertion order (a parent comes before its children; 0 is the
    text's last token, the root); ([], []) when nothing occurs earlier."""
    primary = propose_ngram(tokens, depth, max_match, min_match, numbers, index)
    if not primary:
        return [], []
    find = _finder(tokens, index)
    node_tokens: list[int] = []
    parents: list[int] = []
    child_of: dict[tuple[int, int], int] = {}
    children = [0]

    def insert(branch: list[int]) -> None:
        node = 0
        for token in branch[:depth]:
            if (node, token) in child_of:
                node = child_of[node, token]
                continue
            if len(node_tokens) >= max_nodes or children[node] >= topk:
                return
            node_tokens.append(token)
            parents.append(node)
            children[node] += 1
            children.append(0)
            child_of[node, token] = len(node_tokens)
            node = len(node_tokens)

    insert(primary)
    length, sources = len(tokens), 0
    for size in range(min(max_match, length - 1), min_match - 1, -1):
        pattern = tokens[length - size:]
        end = find(pattern, length - 1)
        while end is not None and sources < max_sources and len(node_tokens) < max_nodes:
            insert(tokens[end:end + depth])
            sources += 1
            end = find(pattern, end - 1)
        if sources >= max_sources or len(node_tokens) >= max_nodes:
            break
    return node_tokens, parents


def _finder(tokens: list[int], index: NgramIndex | None):
    """``find(pattern, last_end)``: the index's lookup once synced to ``tokens``, else the scan."""
    if index is None:
        return lambda pattern, last_end: _latest_end(tokens, pattern, last_end)
    index.sync(tokens)
    return index.latest_end


def _latest_end(tokens: list[int], pattern: list[int], last_end: int) -> int | None:
    """The end (index past the last token) of the latest occurrence of ``pattern`` ending at or before
    ``last_end``; None if there is none."""
    size = len(pattern)
    for end in range(last_end, size - 1, -1):
        if tokens[end - size:end] == pattern:
            return end
    return None


def _continue(tokens: list[int], sources: list[int], steps: int, numbers: NumberTokens | None) -> list[int]:
    """``steps`` tokens copied from ``tokens[sources[0]]`` on (over the drafts past the end); with ``numbers``
    and a second source (the occurrence before), a number at both places continues their difference."""
    length = len(tokens)
    drafts: list[int] = []

    def at(index: int) -> int | None:  # the text and the drafts so far as one sequence
        if index < length:
            return tokens[index]
        return drafts[index - length] if index - length < len(drafts) else None

    latest = sources[0]
    before = sources[1] if numbers is not None and len(sources) > 1 else None
    digit = numbers.digit if numbers is not None else {}
    if digit.get(tokens[-1]) is not None and digit.get(at(latest - 1)) is not None:
        # the text ends inside a number: finish the extrapolated one if it starts with the digits written
        written = _digits_before(at, length, digit)
        start = latest - _digits_before(at, latest, digit)
        finish = None
        if before is not None and digit.get(at(before - 1)) is not None:
            successor, width, before = _successor(numbers, at, start, before - _digits_before(at, before, digit))
            if successor and successor[:written] == tokens[length - written:]:
                finish = successor[written:]
        else:
            width = _number_at(at, start, digit)[1]
        if finish is None:  # copy the rest of the source's number
            finish, before = [at(index) for index in range(latest, start + width)], None
        drafts.extend(finish)
        latest = start + width
    while len(drafts) < steps:
        token = at(latest)
        if token is None:  # the copy caught up with its own end (a number that got shorter)
            break
        if token not in digit:
            drafts.append(token)
            latest += 1
            if before is not None:
                before = None if digit.get(at(before)) is not None else before + 1
            continue
        successor = []
        if before is not None and digit.get(at(before)) is not None:
            successor, width, before = _successor(numbers, at, latest, before)
        else:
            width, before = _number_at(at, latest, digit)[1], None  # a number against text: no alignment
        drafts.extend(successor or [at(index) for index in range(latest, latest + width)])
        latest += width
    while len(drafts) < steps:  # always ``steps`` tokens: the verify has that width
        drafts.append(drafts[-1] if drafts else tokens[-1])
    return drafts[:steps]


def _successor(numbers: NumberTokens, at, start: int, before_start: int) -> tuple[list[int], int, int]:
    """(tokens of v + (v - u), width of v, end of u) for the number v at ``start`` and u at ``before_start``;
    no tokens when v + (v - u) < 0. A zero-padded v (``007``) keeps its width."""
    value, width = _number_at(at, start, numbers.digit)
    previous, previous_width = _number_at(at, before_start, numbers.digit)
    successor = value + (value - previous)
    padded = width > 1 and numbers.digit.get(at(start)) == 0
    tokens = numbers.tokens_of(successor, width if padded else 1) if successor >= 0 else []
    return tokens, width, before_start + previous_width


def _number_at(at, start: int, digit: dict[int, int]) -> tuple[int, int]:
    """(value, number of digits) of the digit run starting at ``start``."""
    value, index = 0, start
    while (d := digit.get(at(index))) is not None:
        value = value * 10 + d
        index += 1
    return value, index - start


def _digits_before(at, end: int, digit: dict[int, int]) -> int:
    """How many digits run up to (not including) ``end``."""
    count = 0
    while end - count - 1 >= 0 and digit.get(at(end - count - 1)) is not None:
        count += 1
    return count
