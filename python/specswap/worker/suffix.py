"""SUFFIX drafting: suffix decoding (Snowflake's SuffixDecoding, vLLM's ``"suffix"`` method) over the suffix trees
of arctic-inference, no draft model.

Each request has a tree over its prompt and output, and the worker one global tree over the outputs of up to
``max_cached_requests`` recent requests (the library's FIFO eviction), less those whose
``SamplingParams.suffix_cache_output`` is False. Each round the library matches each request's last tokens (up
to ``max_tree_depth``) in both trees and takes the continuation with the higher score (the sum of its tokens'
estimated probabilities: child count over parent count along the path, drafting stops below
``min_token_prob``), at most ``floor(max_spec_factor x match length)`` tokens and never past the tier. A chain
tier verifies the best path, padded to the tier's k with its last token; a tree tier a trie of that path, then
the library's best-first tree, cut to the tier's depth, branching and nodes (so its path of first children is
the chain tier's draft). NGRAM's prompt lookup goes first: its draft is verified where it finds one, the trees'
where it finds nothing (a replay of the tune streams: as many tokens a round as prompt lookup or more on every
workload, where the trees alone fell 14-27% short of it on code; results/suffix-replay-tune.json). Everything
else is ``NgramDrafter``'s: a batch where no request has a draft runs a
plain decode, tier-0 rounds check the largest chain's drafts, sampled rounds accept by keyed draws (drafts
without a law), and under tensor parallelism (``tp_draft="leader"``) the first rank looks up and broadcasts
(the others keep no trees). Each worker (a data-parallel group) has its own global tree.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, fields
from typing import Any, Mapping, Sequence

from specswap.worker.ngram import NgramDrafter
from specswap.worker.slots import SlotTable

INSTALL = ('pip install "specswap[suffix]" after its build tools: pip install nanobind==2.9.2 grpcio-tools '
           'protobuf==5.29.6, then PATH=<venv>/bin:$PATH pip install --no-build-isolation arctic-inference==0.3.0 '
           '(bash tools/setup.sh does both)')
# the global tree's bytes are walked again (SuffixTree.estimate_memory) once its tokens moved this far
REMEASURE_FACTOR = 1.25


def suffix_cache_class() -> type:
    """arctic-inference's ``SuffixDecodingCache``; ImportError naming the fix when it is missing."""
    try:
        from arctic_inference.suffix_decoding import SuffixDecodingCache
    except ImportError as error:
        raise ImportError(f"speculative_algorithm SUFFIX needs arctic-inference's suffix trees ({error}): "
                          f"{INSTALL}") from error
    return SuffixDecodingCache


@dataclass(frozen=True)
class SuffixConfig:
    """The trees' settings (Engine keywords and flags ``suffix_decoding_<field>``): vLLM's names and defaults but
    ``max_spec_factor`` 2 (vLLM's 1): chains are padded to the tier, so a draft the factor cuts short fills its
    slots with copies of its last token; at 2 a replay of Gemma 3 270M's tune streams accepted as much or more on
    every workload and shape (results/suffix-replay-tune.json, bench/suffix_replay.py)."""

    max_tree_depth: int = 24            # tokens a match (and a tree path) may span
    max_cached_requests: int = 10000    # outputs in the global tree (0: no global tree); the oldest evicted
    max_spec_factor: float = 2.0        # drafts per matched token (vLLM: 1.0)
    min_token_prob: float = 0.1         # a draft token's estimated probability below this ends the draft

    def __post_init__(self):
        for name, low in (("max_tree_depth", 1), ("max_cached_requests", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value < 2 ** 31:
                raise ValueError(f"suffix_decoding_{name} must be an int in {low}..2**31-1, got {value!r}")
        for name, low, high in (("max_spec_factor", 0.0, float("inf")), ("min_token_prob", 0.0, 1.0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high \
                    or (name == "max_spec_factor" and value == 0):
                raise ValueError(f"suffix_decoding_{name} must be a number in {'(0, inf)' if high > 1 else '[0, 1]'},"
                                 f" got {value!r}")

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> "SuffixConfig":
        """From the Engine keywords (``algorithms.SUFFIX_OPTIONS``), unset ones at their defaults."""
        known = {f"suffix_decoding_{f.name}": f.name for f in fields(cls)}
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise ValueError(f"unknown SUFFIX options {unknown}; valid: {sorted(known)}")
        return cls(**{known[key]: value for key, value in options.items()})


class SuffixDrafter(NgramDrafter):
    """``NgramDrafter`` with the lookups of suffix decoding (``propose``, ``propose_tree``)."""

    def __init__(self, slots: SlotTable, config: SuffixConfig = SuffixConfig(), shadow_steps: int = 0,
                 numbers=None):
        super().__init__(slots, numbers=numbers, shadow_steps=shadow_steps)
        self.config = config
        self._cache_class = suffix_cache_class()
        self._cache = self._new_cache()
        self._ids = itertools.count()
        self._request: list[int | None] = [None] * len(slots.host_tokens)  # per slot: its id in the trees
        self._fed = [0] * len(slots.host_tokens)      # per slot: its tokens the trees hold
        self._cached_tokens: dict[int, int] = {}      # request id -> output tokens it put in the global tree
        self._measured = (0, 0)                       # the global tree's (tokens, bytes) when last walked

    @classmethod
    def build(cls, context) -> "SuffixDrafter":
        return cls(context.slots, SuffixConfig.from_options(context.options),
                   shadow_steps=context.max_steps if 0 in context.tiers else 0, numbers=context.number_tokens)

    def _new_cache(self):
        return self._cache_class(self.config.max_tree_depth, self.config.max_cached_requests)

    # ---- the trees follow the requests ----

    def prefill(self, batch) -> None:
        if self._follower:  # tensor parallelism: the leader's lookups arrive by broadcast
            return
        for slot, prompt in zip(batch.slots, batch.prompts):
            self._start(slot, list(prompt))

    def _start(self, slot: int, tokens: list[int]) -> None:
        request = self._request[slot] = next(self._ids)
        self._cache.start_request(request, tokens)  # its own tree; a place in the global one (FIFO eviction)
        self._fed[slot] = len(tokens)
        cached = self._cache.cached_requests
        if request in cached and not self.slots.params[slot].suffix_cache_output:
            self._cache.evict_cached_response(request)  # its output stays in its own tree only
        if len(self._cached_tokens) > 2 * self.config.max_cached_requests + 64:  # forget the evicted
            self._cached_tokens = {r: n for r, n in self._cached_tokens.items() if r in cached}

    def _feed(self, slot: int) -> None:
        """The slot's tokens committed since the last call into its tree (and the global one)."""
        tokens = self.slots.host_tokens[slot]
        request = self._request[slot]
        if request is None or len(tokens) <= self._fed[slot]:
            return
        new = tokens[self._fed[slot]:]
        self._cache.add_active_response(request, new)
        self._fed[slot] = len(tokens)
        if request in self._cache.cached_requests:
            self._cached_tokens[request] = self._cached_tokens.get(request, 0) + len(new)

    def end_round(self, tier, slots: Sequence[int]) -> None:
        super().end_round(tier, slots)
        for slot in slots:
            self._feed(slot)

    def release(self, slot: int) -> None:
        super().release(slot)
        if self._request[slot] is not None:
            self._cache.stop_request(self._request[slot])  # its output stays in the global tree until evicted
            self._request[slot] = None

    def flush_cache(self) -> None:
        """Empty the global tree. Running requests keep their own trees and their later output joins the new
        global tree (as allowed); what they wrote before the flush does not."""
        self._cache = self._new_cache()
        self._cached_tokens.clear()
        self._measured = (0, 0)
        for slot, request in enumerate(self._request):
            if request is not None:
                self._start(slot, self.slots.host_tokens[slot][:self._fed[slot]])

    # ---- the lookups ----

    def _speculate(self, slot: int, max_tokens: int, tree: bool):
        self._feed(slot)
        context = self.slots.host_tokens[slot][-self.config.max_tree_depth:]
        # max_spec_tokens always passed: arctic-inference 0.3.0's default (None) raises AttributeError
        return self._cache.speculate(self._request[slot], context, max_spec_tokens=max_tokens,
                                     max_spec_factor=self.config.max_spec_factor, max_spec_offset=0.0,
                                     min_token_prob=self.config.min_token_prob, use_tree_spec=tree)

    def _drafting(self, slot: int) -> bool:
        return self._request[slot] is not None and not self.slots.params[slot].disable_speculative_decoding

    def propose(self, slot: int, steps: int) -> list[int]:
        """``scored_chain``'s draft, padded to ``steps`` with its last token ([]: none)."""
        if not self._drafting(slot):
            return []
        tokens = self.scored_chain(slot, steps)[0]
        return tokens + tokens[-1:] * (steps - len(tokens)) if tokens else []

    def scored_chain(self, slot: int, steps: int) -> tuple[list[int], float, int]:
        """SUFFIX's chain of at most ``steps``: prompt lookup's (``NgramDrafter.lookup``) where it finds one, with
        no score and the length of the match it continues; else the trees' best path, its score and 0 (([], 0.0,
        0): none)."""
        tokens, match = self.lookup(slot, steps)
        if tokens:
            return tokens, 0.0, match
        found = self._speculate(slot, steps, tree=False)
        return list(found.token_ids), found.score, 0

    def propose_tree(self, slot: int, depth: int, topk: int, max_nodes: int) -> tuple[list[int], list[int]]:
        """Prompt lookup's trie where it finds one, else the suffix trees'."""
        if not self._drafting(slot):
            return [], []
        found = super().propose_tree(slot, depth, topk, max_nodes)
        return found if found[0] else self.suffix_tree(slot, depth, topk, max_nodes)

    def suffix_chain(self, slot: int, steps: int) -> list[int]:
        """The trees' best path, padded to ``steps`` with its last token ([]: none)."""
        tokens = list(self._speculate(slot, steps, tree=False).token_ids)
        return tokens + tokens[-1:] * (steps - len(tokens)) if tokens else []

    def suffix_tree(self, slot: int, depth: int, topk: int, max_nodes: int) -> tuple[list[int], list[int]]:
        """The trees' best path as a trie, then their best-first tree, within the tier (([], []): none)."""
        tokens, parents, _ = self.scored_suffix_tree(slot, depth, topk, max_nodes)
        return tokens, parents

    def scored_suffix_tree(self, slot: int, depth: int, topk: int,
                           max_nodes: int) -> tuple[list[int], list[int], float]:
        """``suffix_tree`` and its score: the sum of its nodes' estimated path probabilities (the library's; the
        higher where the path's and the tree's lookups both hold a node), the drafts it is expected to get
        accepted, as a chain's score is for a chain (([], [], 0.0): none)."""
        found = self._speculate(slot, depth, tree=False)
        path = list(found.token_ids)
        if not path:
            return [], [], 0.0
        tree = self._speculate(slot, 2 * max_nodes, tree=True)  # more than fit: those past the cuts make room
        tokens, parents = merge_tree(path, tree.token_ids, tree.parents, depth, topk, max_nodes)
        probs = dict(zip(_node_paths(path, range(-1, len(path) - 1)), found.probs))
        for key, prob in zip(_node_paths(tree.token_ids, tree.parents), tree.probs):  # (two matches' estimates)
            probs[key] = max(prob, probs.get(key, 0.0))
        merged = _node_paths(tokens, [parent - 1 for parent in parents])  # ours number from 1, 0 the root
        return tokens, parents, float(sum(probs.get(key, 0.0) for key in merged))

    # ---- the global tree's size ----

    def stats(self) -> dict[str, Any]:
        """The global tree: requests and output tokens it holds, its bytes (``SuffixTree.estimate_memory``, a walk
        of the tree, taken again only once its tokens moved by REMEASURE_FACTOR; between walks the bytes are
        scaled by tokens), bytes per cached token, and its bound."""
        cached = self._cache.cached_requests
        tokens = sum(self._cached_tokens.get(request, 0) for request in cached)
        measured_tokens, measured_bytes = self._measured
        if measured_tokens == 0 or not measured_tokens / REMEASURE_FACTOR <= tokens <= measured_tokens * REMEASURE_FACTOR:
            tree = getattr(self._cache, "_global_tree", None)
            if not hasattr(tree, "estimate_memory"):
                raise RuntimeError("arctic-inference's SuffixDecodingCache has no _global_tree.estimate_memory() "
                                   "(0.3.0 has): the global tree's size cannot be reported; pin arctic-inference==0.3.0")
            measured_tokens, measured_bytes = self._measured = (tokens, tree.estimate_memory())
        per_token = measured_bytes / measured_tokens if measured_tokens else None
        return {"suffix_global_tree": {
            "cached_requests": len(cached), "cached_tokens": tokens,
            "bytes": round(per_token * tokens) if per_token else measured_bytes,
            "bytes_per_cached_token": None if per_token is None else round(per_token, 1),
            "max_cached_requests": self.config.max_cached_requests, "max_tree_depth": self.config.max_tree_depth}}


def merge_tree(path: Sequence[int], tokens: Sequence[int], parents: Sequence[int], depth: int, topk: int,
               max_nodes: int) -> tuple[list[int], list[int]]:
    """A trie of ``path`` (the best chain), then the library's best-first tree (``tokens``, ``parents``: -1 under
    the root, else an earlier index), a node keeping at most ``topk`` children, ``depth`` levels and ``max_nodes``
    nodes; a tree node whose parent was cut is cut. Returns (node tokens, parents), nodes numbered from 1 in
    insertion order, 0 the root: children best first, the path's nodes first of all."""
    node_tokens: list[int] = []
    node_parents: list[int] = []
    levels, children = [0], [0]
    child_of: dict[tuple[int, int], int] = {}

    def insert(parent: int, token: int) -> int | None:
        if (parent, token) in child_of:
            return child_of[parent, token]
        if len(node_tokens) >= max_nodes or children[parent] >= topk or levels[parent] >= depth:
            return None
        node_tokens.append(token)
        node_parents.append(parent)
        children[parent] += 1
        levels.append(levels[parent] + 1)
        children.append(0)
        node = child_of[parent, token] = len(node_tokens)
        return node

    node: int | None = 0
    for token in path:
        node = insert(node, token)
        if node is None:
            break
    placed: list[int | None] = []  # the library's node i -> ours (None: cut)
    for token, parent in zip(tokens, parents):
        above = 0 if parent < 0 else placed[parent]
        placed.append(None if above is None else insert(above, token))
    return node_tokens, node_parents


def _node_paths(tokens: Sequence[int], parents: Sequence[int]) -> list[tuple[int, ...]]:
    """Each node's tokens from the root (``parents``: -1 under the root, else an earlier node's index)."""
    paths: list[tuple[int, ...]] = []
    for token, parent in zip(tokens, parents):
        paths.append((paths[parent] if parent >= 0 else ()) + (token,))
    return paths
