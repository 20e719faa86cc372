"""SUFFIX's parameters measured by replay, not by speed: what a drafter would have accepted on a fixed stream.

Gemma 3 270M's own outputs (target-only, greedy where the workload is greedy, seeded keyed draws where it samples:
the same text SUFFIX and NGRAM emit, since their sampled rounds accept against the same keyed draws) are generated
once for the tune prompts of six workloads and cached under ``runs/``. Each request's prompt and output are then
replayed through arctic-inference's ``SuffixDecodingCache`` exactly as ``worker.suffix.SuffixDrafter`` drives it:
``start_request`` with the prompt, every round ``speculate`` over the last ``max_tree_depth`` tokens
(``max_spec_tokens`` always passed), a chain padded to k with its last token, a tree merged by ``merge_tree`` and
padded with the last token under the root, a round with no draft run as a plain decode (one token, no verify),
the accepted tokens and the bonus token fed back, ``stop_request`` at the end; one cache per workload (each
benchmark run starts with an empty global tree), requests one at a time in serving order. Plain prompt lookup
(NGRAM's ``propose_ngram`` / ``propose_ngram_tree`` with the tokenizer's digit tokens) is replayed at the same
shapes, and SUFFIX as the drafter is built (rows "SUFFIX": prompt lookup first, the trees at its default
settings where it finds nothing) beside the trees alone over the settings grid (rows "SUFFIX trees"). A draft
counts as far as it equals the next tokens of the stream (greedy tree verify: the deepest node
whose whole path matches); nothing depends on the machine's load.

The requests are those ``specswap bench`` sends at concurrency 1 (``specswap.bench.workloads.build_workload``;
resample: 4 prompts x 3 samples at T = 0.7, seeds 0..11; template: 8; multiturn: 4 first turns, each followed by
its second turn) and ``bench/bench_engine.py``'s code, repeat and prose prompts (the first ``--num-prompts``; prose
at T = 1.0, request i seeded i). ``--ignore-eos`` (default, as ``specswap bench``) runs each to
``--max-new-tokens``.

    PYTHONPATH=python python bench/suffix_replay.py --threads 1 --json results/suffix-replay-tune.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol, Sequence

from specswap.bench import provenance
from specswap.bench import workloads as phased
from specswap.prompt_lookup import NgramIndex, NumberTokens, propose_ngram, propose_ngram_tree
from specswap.worker.suffix import SuffixConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_engine  # noqa: E402  (code, repeat and prose prompts)

WORKLOADS = ("resample", "template", "multiturn", "code", "repeat", "prose")
VLLM_DEFAULTS = (24, 1.0, 0.1)  # max_tree_depth, max_spec_factor, min_token_prob


# ---- the replay ---------------------------------------------------------------------------------------------


class ReplayDrafter(Protocol):
    """One workload's drafter: requests one at a time (``start`` ... ``stop``), a draft per round."""

    def start(self, prompt: list[int]) -> None: ...
    def draft(self, tokens: list[int]) -> tuple[list[int], list[int]]: ...  # (node tokens, parents); ([], []): none
    def feed(self, new: list[int]) -> None: ...
    def stop(self) -> None: ...


@dataclass
class Tally:
    requests: int = 0
    tokens: int = 0          # output tokens after each request's first (that one comes from the prefill)
    verifies: int = 0        # rounds that verified a draft
    plain_rounds: int = 0    # rounds with no draft: a plain decode
    accepted: int = 0        # drafted tokens accepted, over the verifies

    def figures(self) -> dict:
        rounds = self.verifies + self.plain_rounds
        return {**asdict(self),
                "accepted_per_verify": round(self.accepted / self.verifies, 3) if self.verifies else 0.0,
                "tokens_per_verify": round((self.accepted + self.verifies) / self.verifies, 3) if self.verifies else 0.0,
                "verify_share": round(self.verifies / rounds, 3) if rounds else 0.0,
                "tokens_per_round": round(self.tokens / rounds, 3) if rounds else 0.0}


def accepted_length(nodes: Sequence[int], parents: Sequence[int], actual: Sequence[int]) -> int:
    """The depth of the deepest node whose path from the root equals ``actual``'s first tokens (greedy verify).
    ``parents[i]`` is node i+1's parent (0: the root), nodes numbered from 1 in an order where parents come first."""
    depth, matched = [0], [True]
    best = 0
    for token, parent in zip(nodes, parents):
        level = depth[parent] + 1
        ok = matched[parent] and level <= len(actual) and actual[level - 1] == token
        depth.append(level)
        matched.append(ok)
        if ok:
            best = max(best, level)
    return best


def chain(tokens: Sequence[int]) -> tuple[list[int], list[int]]:
    return list(tokens), list(range(len(tokens)))


def replay(requests: Sequence[tuple[Sequence[int], Sequence[int]]], drafter: ReplayDrafter,
           trace: list | None = None) -> Tally:
    """Each (prompt, output) in order: the prefill emits output[0], then each round drafts over the tokens so far
    and moves on by the accepted drafts and the bonus token (one token where nothing was drafted). ``trace``:
    each round's accepted drafts appended (None for a plain decode)."""
    tally = Tally()
    for prompt, output in requests:
        tally.requests += 1
        drafter.start(list(prompt))
        tokens = list(prompt) + list(output[:1])
        drafter.feed(list(output[:1]))
        position = 1
        while position < len(output):
            nodes, parents = drafter.draft(tokens)
            step = 1
            if nodes:
                accepted = accepted_length(nodes, parents, output[position:])
                tally.verifies += 1
                tally.accepted += accepted
                step = min(accepted + 1, len(output) - position)
            else:
                accepted = None
                tally.plain_rounds += 1
            if trace is not None:
                trace.append(accepted)
            new = list(output[position:position + step])
            tokens += new
            drafter.feed(new)
            position += step
            tally.tokens += step
        drafter.stop()
    return tally


@dataclass(frozen=True)
class Shape:
    """A chain of ``steps`` (topk 1) or a tree: ``steps`` deep, ``topk`` children a node, ``nodes`` verified with
    the root (``speculative_num_draft_tokens``)."""

    steps: int
    topk: int = 1
    nodes: int = 0

    @property
    def label(self) -> str:
        return f"chain-{self.steps}" if self.topk == 1 else f"tree-{self.steps}x{self.topk}x{self.nodes}"

    @classmethod
    def parse(cls, text: str) -> "Shape":
        steps, topk, nodes = (int(part) for part in text.split("x"))
        return cls(steps, topk, nodes)


def pad_tree(tokens: list[int], parents: list[int], nodes: int, last: int) -> tuple[list[int], list[int]]:
    """NgramDrafter._trie's padding: copies of the request's last token under the root up to ``nodes - 1``."""
    pad = nodes - 1 - len(tokens)
    return tokens + [last] * pad, parents + [0] * pad


class SuffixReplay:
    """``worker.suffix.SuffixDrafter``'s calls on one ``SuffixDecodingCache`` (the workload's global tree)."""

    def __init__(self, shape: Shape, max_tree_depth: int, max_spec_factor: float, min_token_prob: float,
                 max_cached_requests: int = 10000, lookup: "NgramReplay | None" = None):
        from specswap.worker.suffix import suffix_cache_class
        self.lookup = lookup  # SuffixDrafter's prompt lookup first (None: the trees alone)
        self.shape, self.depth = shape, max_tree_depth
        self.factor, self.min_prob = max_spec_factor, min_token_prob
        self.cache = suffix_cache_class()(max_tree_depth, max_cached_requests)
        self.ids = itertools.count()
        self.request = None

    def start(self, prompt: list[int]) -> None:
        self.request = next(self.ids)
        self.cache.start_request(self.request, prompt)
        if self.lookup is not None:
            self.lookup.start(prompt)

    def feed(self, new: list[int]) -> None:
        self.cache.add_active_response(self.request, new)

    def stop(self) -> None:
        self.cache.stop_request(self.request)

    def _speculate(self, tokens: list[int], max_tokens: int, tree: bool):
        return self.cache.speculate(self.request, tokens[-self.depth:], max_spec_tokens=max_tokens,
                                    max_spec_factor=self.factor, max_spec_offset=0.0,
                                    min_token_prob=self.min_prob, use_tree_spec=tree)

    def draft(self, tokens: list[int]) -> tuple[list[int], list[int]]:
        from specswap.worker.suffix import merge_tree
        found = self.lookup.draft(tokens) if self.lookup is not None else ([], [])
        if found[0]:
            return found
        shape = self.shape
        path = list(self._speculate(tokens, shape.steps, tree=False).token_ids)
        if not path:
            return [], []
        if shape.topk == 1:  # SuffixDrafter.propose: padded to k with the draft's last token
            return chain(path + path[-1:] * (shape.steps - len(path)))
        found = self._speculate(tokens, 2 * (shape.nodes - 1), tree=True)
        merged, parents = merge_tree(path, found.token_ids, found.parents, shape.steps, shape.topk, shape.nodes - 1)
        return pad_tree(merged, parents, shape.nodes, tokens[-1])


class NgramReplay:
    """``worker.ngram.NgramDrafter``'s lookups (prompt lookup over the request, digits extrapolated)."""

    def __init__(self, shape: Shape, numbers: NumberTokens | None):
        self.shape, self.numbers = shape, numbers
        self.index = NgramIndex()

    def start(self, prompt: list[int]) -> None:
        self.index = NgramIndex()

    def feed(self, new: list[int]) -> None:
        pass

    def stop(self) -> None:
        pass

    def draft(self, tokens: list[int]) -> tuple[list[int], list[int]]:
        shape = self.shape
        if shape.topk == 1:
            drafts = propose_ngram(tokens, shape.steps, numbers=self.numbers, index=self.index)
            return chain(drafts) if drafts else ([], [])
        nodes, parents = propose_ngram_tree(tokens, shape.steps, shape.topk, shape.nodes - 1, numbers=self.numbers,
                                            index=self.index)
        return pad_tree(nodes, parents, shape.nodes, tokens[-1]) if nodes else ([], [])


# ---- the bound: what any per-round choice could reach -----------------------------------------------------


BOUND_WHAT = ("SUFFIX against NGRAM by replay, speeds modelled by the forward's cost by rows (drafting's host time "
              "not counted): each at its best fixed chain tier, SUFFIX score-gated, and both clairvoyant (each round "
              "a plain decode or any tier's draft, chosen knowing what it accepts); ratios to NGRAM's best fixed tier")
BOUND_TIERS = tuple(range(1, 8))  # chain tiers k (k + 1 rows verified)
SCORE_GATES = (0.5, 1.0, 2.0)     # the trees' draft first where its score is at least this


@dataclass
class Position:
    """What each chain tier would accept at one position of a stream (None: no draft): prompt lookup's chain,
    the trees' chain padded to k (SuffixDrafter.propose), and the trees' own path unpadded (its length, score)."""

    lookup: dict[int, int | None]
    trees: dict[int, int | None]
    path: dict[int, tuple[int, int, float] | None]  # k -> (accepted, length, score)


def common_prefix(draft: Sequence[int], actual: Sequence[int]) -> int:
    return accepted_length(*chain(draft), actual)


def stream_positions(requests, numbers: NumberTokens | None, config: SuffixConfig,
                     max_cached_requests: int = 10000) -> list[list[Position]]:
    """Per request (in order, one global tree), per output position after the first: every tier's drafts."""
    from specswap.worker.suffix import suffix_cache_class
    cache = suffix_cache_class()(config.max_tree_depth, max_cached_requests)
    streams = []
    for request, (prompt, output) in enumerate(requests):
        cache.start_request(request, list(prompt))
        cache.add_active_response(request, list(output[:1]))
        tokens, index, positions = list(prompt) + list(output[:1]), NgramIndex(), []
        for position in range(1, len(output)):
            actual = output[position:]
            at = Position({}, {}, {})
            for k in BOUND_TIERS:
                drafts = propose_ngram(tokens, k, numbers=numbers, index=index)
                at.lookup[k] = common_prefix(drafts, actual) if drafts else None
                found = cache.speculate(request, tokens[-config.max_tree_depth:], max_spec_tokens=k,
                                        max_spec_factor=config.max_spec_factor, max_spec_offset=0.0,
                                        min_token_prob=config.min_token_prob, use_tree_spec=False)
                path = list(found.token_ids)
                at.trees[k] = common_prefix(path + path[-1:] * (k - len(path)), actual) if path else None
                at.path[k] = (common_prefix(path, actual), len(path), found.score) if path else None
            positions.append(at)
            tokens.append(output[position])
            cache.add_active_response(request, [output[position]])
        cache.stop_request(request)
        streams.append(positions)
    return streams


class RowCosts:
    """A forward's cost by rows, relative to one row (``bench/bench_gemma_forward.py``'s JSON:
    ``forward_ratio_to_one`` per ``tokens``), linear between the measured counts."""

    def __init__(self, ratios: dict[int, float]):
        self.ratios = dict(sorted(ratios.items()))

    @classmethod
    def from_json(cls, path: str, weights: str = "native") -> "RowCosts":
        """The rows of ``weights`` (the streams' target: a JSON may hold several kinds, each its own table)."""
        results = json.loads(Path(path).read_text())["results"]
        kinds = sorted({r.get("weights", weights) for r in results})
        chosen = [r for r in results if r.get("weights", weights) == weights]
        if not chosen:
            raise SystemExit(f"{path} has no forward costs for weights {weights!r} (it has {', '.join(kinds)})")
        return cls({int(r["tokens"]): float(r["forward_ratio_to_one"]) for r in chosen})

    def __call__(self, rows: int) -> float:
        if rows in self.ratios:
            return self.ratios[rows]
        below = max(r for r in self.ratios if r < rows)
        above = min(r for r in self.ratios if r > rows)
        return self.ratios[below] + (self.ratios[above] - self.ratios[below]) * (rows - below) / (above - below)


def clairvoyant_time(streams: list[list[Position]], costs: RowCosts, sources: Sequence[str]) -> float:
    """The least forward time (one-row forwards) to emit the streams when every round may choose, knowing what
    each would accept, a plain decode or any tier's draft from any of ``sources`` ("lookup", "trees"): a
    shortest path over each stream's positions."""
    total = 0.0
    for positions in streams:
        best = [0.0] + [float("inf")] * len(positions)
        for i, at in enumerate(positions):
            moves = [(1, 1.0)] + [(accepted + 1, costs(k + 1)) for source in sources
                                  for k, accepted in getattr(at, source).items() if accepted is not None]
            for advance, cost in moves:
                j = min(i + advance, len(positions))
                best[j] = min(best[j], best[i] + cost)
        total += best[-1]
    return total


def fixed_time(streams: list[list[Position]], costs: RowCosts, k: int, rule: str) -> float:
    """Forward time at tier k, a plain decode where the rule has no draft. Rules: "lookup" (NGRAM's prompt
    lookup), "lookup, then trees" (SUFFIX as built: the trees padded to k where lookup finds nothing), "score>=s"
    (the trees' path first where its score is at least s, its own length verified; else as SUFFIX; "score>=s
    padded": padded to k, as a tier verifies today)."""
    gate = float(rule.split(">=")[1].split()[0]) if rule.startswith("score>=") else None
    padded = rule.endswith(" padded")
    total = 0.0
    for positions in streams:
        i = 0
        while i < len(positions):
            at = positions[i]
            path = at.path[k]
            if gate is not None and path is not None and path[2] >= gate:
                accepted, rows = (at.trees[k], k) if padded else (path[0], path[1])
            elif at.lookup[k] is not None:
                accepted, rows = at.lookup[k], k
            elif rule != "lookup" and at.trees[k] is not None:
                accepted, rows = (path[0], path[1]) if gate is not None and not padded else (at.trees[k], k)
            else:
                accepted, rows = None, 0
            total += 1.0 if accepted is None else costs(rows + 1)
            i += 1 if accepted is None else accepted + 1
    return total


def bound_rows(streams: dict, costs: RowCosts, workloads: Sequence[str]) -> list[dict]:
    """Per workload, speeds modelled by forward cost (drafting's host time not counted) as ratios to NGRAM at
    its best fixed tier: SUFFIX as built and score-gated (the trees' path first where its score is high) at their
    best tiers, and both drafters clairvoyant."""
    numbers = NumberTokens(streams["number_tokens"]) if streams.get("number_tokens") else None
    rows = []
    for workload in workloads:
        requests = [(r["prompt_ids"], r["output_ids"]) for r in streams["workloads"][workload]]
        positions = stream_positions(requests, numbers, SuffixConfig())
        tokens = sum(len(p) for p in positions)

        def best(rule):
            times = {k: fixed_time(positions, costs, k, rule) for k in BOUND_TIERS}
            tier = min(times, key=times.get)
            return tier, times[tier]
        ngram_tier, ngram = best("lookup")
        row = {"workload": workload, "tokens": tokens, "ngram_best_tier": ngram_tier,
               "ngram_best_vs_plain": round(tokens / ngram, 3)}
        gated = [f"score>={gate:g}{pad}" for pad in ("", " padded") for gate in SCORE_GATES]
        for rule in ("lookup, then trees", *gated):
            tier, time_ = best(rule)
            row[rule] = {"best_tier": tier, "vs_ngram": round(ngram / time_, 3)}
        lookup_only = clairvoyant_time(positions, costs, ["lookup"])
        both = clairvoyant_time(positions, costs, ["lookup", "trees"])
        row.update(ngram_clairvoyant_vs_ngram=round(ngram / lookup_only, 3),
                   suffix_clairvoyant_vs_ngram=round(ngram / both, 3),
                   suffix_clairvoyant_vs_ngram_clairvoyant=round(lookup_only / both, 3))
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


# ---- the streams --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    text: str
    temperature: float
    followup: str = ""  # multiturn: the second turn's text after this request's answer


def workload_requests(workload: str, num_prompts: int, prompt_set: str) -> list[Request]:
    """First turns in submission order (a multiturn second turn follows its first at once, as ``specswap bench``
    at concurrency 1 sends it)."""
    if workload in phased.CROSS_REQUEST_KINDS:
        prompts = phased.PROMPT_SETS[prompt_set][workload][0]
        count = min(num_prompts, len(prompts)) * (phased.RESAMPLES if workload == "resample" else 1)
        phase = phased.build_workload(workload, count, prompt_set=prompt_set)[0]
        followups = phase.followups or ("",) * len(phase.prompts)
        return [Request(text, phase.temperature, followup) for text, followup in zip(phase.prompts, followups)]
    prompts, temperature = bench_engine.PROMPT_SETS[prompt_set][workload]
    return [Request(text, temperature) for text in prompts[:num_prompts]]


def generate_streams(args) -> dict:
    """Target-only outputs of every workload's requests, request i of a workload seeded i."""
    import torch
    from specswap.engine import Engine
    if args.threads:
        torch.set_num_threads(args.threads)
    engine = Engine(args.model, speculative_algorithm=None, weights=args.weights, max_batch_size=1,
                    max_seq_len=args.max_seq_len)
    numbers = NumberTokens.from_tokenizer(engine.tokenizer)
    streams, started = {}, time.perf_counter()
    for workload in args.workloads:
        rows = []
        for request in workload_requests(workload, args.num_prompts, args.prompt_set):
            text = request.text
            for turn in range(2 if request.followup else 1):
                out = engine.generate([text], args.max_new_tokens, temperature=request.temperature,
                                      seed=len(rows), ignore_eos=args.ignore_eos)[0]
                rows.append({"prompt_ids": list(out.prompt_token_ids), "output_ids": list(out.token_ids),
                             "temperature": request.temperature, "seed": len(rows), "turn": turn + 1})
                text = text + out.text + request.followup
        streams[workload] = rows
        print(f"{workload}: {len(rows)} requests, {sum(len(r['output_ids']) for r in rows)} tokens "
              f"({time.perf_counter() - started:.0f} s)", flush=True)
    return {"settings": stream_settings(args), "number_tokens": list(numbers.ids) if numbers else None,
            "threads": torch.get_num_threads(), "generation_s": round(time.perf_counter() - started, 1),
            "commit": provenance.git_commit(), "workloads": streams}


def stream_settings(args) -> dict:
    return {"model": args.model, "weights": args.weights, "prompt_set": args.prompt_set,
            "num_prompts": args.num_prompts, "max_new_tokens": args.max_new_tokens, "ignore_eos": args.ignore_eos}


def load_streams(args) -> dict:
    """The cached streams when they were made with these settings and hold every workload; else generated."""
    path = Path(args.streams)
    if path.exists() and not args.regenerate:
        cached = json.loads(path.read_text())
        if cached.get("settings") == stream_settings(args) and set(args.workloads) <= set(cached["workloads"]):
            print(f"streams from {path}")
            return cached
    streams = generate_streams(args)
    provenance.write_report(path, streams)
    return streams


# ---- the grid -----------------------------------------------------------------------------------------------


def settings_grid(args) -> list[tuple[int, float, float]]:
    return list(itertools.product(args.depths, args.spec_factors, args.min_probs))


def run_grid(streams: dict, args) -> list[dict]:
    numbers = NumberTokens(streams["number_tokens"]) if streams.get("number_tokens") else None
    shapes = [Shape(k) for k in args.chains] + [Shape.parse(tree) for tree in args.trees]
    rows = []
    for workload in args.workloads:
        requests = [(r["prompt_ids"], r["output_ids"]) for r in streams["workloads"][workload]]
        for shape in shapes:
            base = replay(requests, NgramReplay(shape, numbers)).figures()
            rows.append({"workload": workload, "drafter": "NGRAM", "shape": shape.label, **base})
            config = SuffixConfig()  # SuffixDrafter as built: prompt lookup first, the trees where it finds nothing
            built = replay(requests, SuffixReplay(shape, config.max_tree_depth, config.max_spec_factor,
                                                  config.min_token_prob, args.max_cached_requests,
                                                  lookup=NgramReplay(shape, numbers))).figures()
            rows.append({"workload": workload, "drafter": "SUFFIX", "lookup_first": True, "shape": shape.label,
                         **built, "tokens_per_round_vs_ngram": ratio(built["tokens_per_round"],
                                                                     base["tokens_per_round"])})
            for depth, factor, min_prob in settings_grid(args):
                tally = replay(requests, SuffixReplay(shape, depth, factor, min_prob, args.max_cached_requests))
                figures = tally.figures()
                rows.append({"workload": workload, "drafter": "SUFFIX trees", "shape": shape.label,
                             "max_tree_depth": depth, "max_spec_factor": factor, "min_token_prob": min_prob,
                             **figures, "accepted_vs_ngram": ratio(figures["accepted_per_verify"],
                                                                   base["accepted_per_verify"])})
    return rows


def ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b else None


def setting_summary(rows: list[dict], workloads: Sequence[str]) -> list[dict]:
    """Per SUFFIX setting and shape: accepted per verify on each workload, and its ratio to vLLM's defaults' at
    the same shape (min and max over the workloads)."""
    suffix = [row for row in rows if "max_spec_factor" in row]  # the suffix settings' rows
    key = lambda row: (row["shape"], row["max_tree_depth"], row["max_spec_factor"], row["min_token_prob"])  # noqa
    by_key = {key(row) + (row["workload"],): row for row in suffix}
    summary = []
    for shape, depth, factor, min_prob in dict.fromkeys(map(key, suffix)):
        per = {w: by_key[(shape, depth, factor, min_prob, w)] for w in workloads}
        default = {w: by_key[(shape, *VLLM_DEFAULTS, w)] for w in workloads} \
            if (shape, *VLLM_DEFAULTS, workloads[0]) in by_key else None
        entry = {"shape": shape, "max_tree_depth": depth, "max_spec_factor": factor, "min_token_prob": min_prob,
                 "accepted_per_verify": {w: per[w]["accepted_per_verify"] for w in workloads},
                 "tokens_per_round": {w: per[w]["tokens_per_round"] for w in workloads}}
        if default:
            ratios = {w: ratio(per[w]["accepted_per_verify"], default[w]["accepted_per_verify"]) for w in workloads}
            rounds = {w: ratio(per[w]["tokens_per_round"], default[w]["tokens_per_round"]) for w in workloads}
            entry.update(accepted_vs_default=ratios, tokens_per_round_vs_default=rounds,
                         at_least_default=all(r >= 1 for r in (*ratios.values(), *rounds.values()) if r is not None))
        summary.append(entry)
    return summary


def chosen_summary(summary: list[dict], chosen: Sequence[float]) -> dict:
    """The chosen setting against vLLM's defaults: its ratios' range over every workload and shape."""
    depth, factor, min_prob = chosen
    entries = [e for e in summary if (e["max_tree_depth"], e["max_spec_factor"], e["min_token_prob"]) ==
               (depth, factor, min_prob) and "accepted_vs_default" in e]
    if not entries:
        raise ValueError(f"--chosen {list(chosen)} is not in the grid")
    accepted = [r for e in entries for r in e["accepted_vs_default"].values() if r is not None]
    rounds = [r for e in entries for r in e["tokens_per_round_vs_default"].values() if r is not None]
    return {"max_tree_depth": int(depth), "max_spec_factor": factor, "min_token_prob": min_prob,
            "shapes": [e["shape"] for e in entries], "at_least_default": all(e["at_least_default"] for e in entries),
            "accepted_vs_default_min": min(accepted), "accepted_vs_default_max": max(accepted),
            "tokens_per_round_vs_default_min": min(rounds), "tokens_per_round_vs_default_max": max(rounds)}


def print_rows(rows: list[dict]) -> None:
    print(f"{'workload':10} {'drafter':7} {'shape':15} {'depth':>5} {'factor':>6} {'minp':>5} "
          f"{'acc/verify':>10} {'tok/verify':>10} {'verify%':>7} {'tok/round':>9}")
    for row in rows:
        print(f"{row['workload']:10} {row['drafter']:7} {row['shape']:15} {row.get('max_tree_depth', ''):>5} "
              f"{row.get('max_spec_factor', ''):>6} {row.get('min_token_prob', ''):>5} "
              f"{row['accepted_per_verify']:>10.3f} {row['tokens_per_verify']:>10.3f} "
              f"{100 * row['verify_share']:>6.1f}% {row['tokens_per_round']:>9.3f}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="gemma-3-270m")
    parser.add_argument("--weights", default="native", choices=["native", "bf16", "fp32"])
    parser.add_argument("--threads", type=int, default=1, help="torch threads for the generation")
    parser.add_argument("--prompt-set", default="tune", choices=list(phased.PROMPT_SETS))
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--num-prompts", type=int, default=8,
                        help="prompts per workload, at most the set's (resample: each sampled 3 times; multiturn: "
                             "each with its second turn)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--max-seq-len", type=int, default=1024)
    parser.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=True,
                        help="run every request to --max-new-tokens (specswap bench's default)")
    parser.add_argument("--streams", default="runs/suffix-replay-streams.json",
                        help="the generated outputs, cached (regenerated when the settings differ)")
    parser.add_argument("--regenerate", action="store_true", help="generate the streams even if cached")
    parser.add_argument("--depths", nargs="+", type=int, default=[24, 64], help="max_tree_depth values")
    parser.add_argument("--spec-factors", nargs="+", type=float, default=[1.0, 2.0], help="max_spec_factor values")
    parser.add_argument("--min-probs", nargs="+", type=float, default=[0.1, 0.3], help="min_token_prob values")
    parser.add_argument("--chains", nargs="+", type=int, default=[3, 7], help="chain budgets k")
    parser.add_argument("--trees", nargs="*", default=["7x4x12"],
                        help="tree shapes <steps>x<topk>x<num_draft_tokens> (tokens verified, root included)")
    parser.add_argument("--max-cached-requests", type=int, default=10000)
    parser.add_argument("--chosen", nargs=3, type=float, default=None, metavar=("DEPTH", "FACTOR", "MIN_PROB"),
                        help="a setting of the grid to compare with vLLM's defaults in the JSON (\"chosen\")")
    parser.add_argument("--bound", action="store_true",
                        help="instead of the grid: SUFFIX and NGRAM at every chain tier, score-gated, and clairvoyant "
                             "(any per-round choice), speeds modelled by --row-costs")
    parser.add_argument("--row-costs", default="results/gemma-forward-t1-xeon-amx.json",
                        help="bench/bench_gemma_forward.py's JSON: the forward's cost by rows (--bound)")
    parser.add_argument("--json", default=None, help="write the rows and the summary here")
    return parser


def main() -> None:
    args = build_parser().parse_args()
    streams = load_streams(args)
    started = time.perf_counter()
    if args.bound:
        rows = bound_rows(streams, RowCosts.from_json(args.row_costs, args.weights), args.workloads)
        print(f"replay: {time.perf_counter() - started:.1f} s")
        if args.json:
            provenance.write_report(args.json, {
                **provenance.stamp(), "what": BOUND_WHAT, **stream_settings(args), "streams_commit": streams["commit"],
                "row_costs": args.row_costs, "tiers": list(BOUND_TIERS), "suffix_settings": asdict(SuffixConfig()),
                "rows": rows})
        return
    rows = run_grid(streams, args)
    print_rows(rows)
    print(f"replay: {time.perf_counter() - started:.1f} s")
    summary = setting_summary(rows, args.workloads)
    for entry in summary:
        setting = (entry["max_tree_depth"], entry["max_spec_factor"], entry["min_token_prob"])
        if entry.get("at_least_default") and entry["shape"] == rows[0]["shape"] and setting != VLLM_DEFAULTS:
            print(f"at least vLLM's defaults everywhere: depth {entry['max_tree_depth']}, factor "
                  f"{entry['max_spec_factor']}, min prob {entry['min_token_prob']} (every shape: see the JSON)")
    if args.json:
        requests = {w: {"requests": len(streams["workloads"][w]),
                        "output_tokens": sum(len(r["output_ids"]) for r in streams["workloads"][w]),
                        "temperature": streams["workloads"][w][0]["temperature"]} for w in args.workloads}
        provenance.write_report(args.json, {
            **provenance.stamp(),
            "what": (f"SUFFIX replay (acceptance, not speed): {args.model} {args.weights} target-only outputs of "
                     f"the {args.prompt_set} prompts, {args.max_new_tokens} tokens, replayed through "
                     f"arctic-inference's SuffixDecodingCache and NGRAM's prompt lookup"),
            **stream_settings(args), "streams_commit": streams["commit"], "streams_threads": streams["threads"],
            "streams_seconds": streams["generation_s"], "workloads": requests, "vllm_defaults": list(VLLM_DEFAULTS),
            "rows": rows, "summary": summary,
            **({"chosen": chosen_summary(summary, args.chosen)} if args.chosen else {})})


if __name__ == "__main__":
    main()
