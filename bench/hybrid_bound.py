"""What any per-round choice between EAGLE's draft and SUFFIX's could reach: an upper bound for the hybrid.

``specswap bench --workload mixed``'s requests (resample, high, template, low phases, one after another, one
global suffix tree over them all) are served by EAGLE at each fixed chain tier k, one request at a time; each
request's accepted drafts per round give the positions where its rounds began and what EAGLE's draft accepted
there (sampled phases too: the acceptance is the engine's own, in law). The same outputs are replayed through
arctic-inference's suffix trees as ``worker.suffix.SuffixDrafter`` drives them (``suffix_replay.stream_positions``):
at every position, what SUFFIX's chain of k (prompt lookup first, then the trees) and the trees' chain alone
would accept, counted as far as they equal the next emitted tokens. Over a stream sampled from the target, a
deterministic draft's match is its lossless acceptance in law (a point mass d is accepted with probability p(d),
the emitted token equals d with that probability), so at each of EAGLE's round starts the larger of the two
acceptances bounds what a choice made before the round could expect (Jensen: the best choice's mean is at most
the mean of the better one).

All three drafters are judged at the same positions, EAGLE's round starts at each tier: EAGLE, SUFFIX as built
(prompt lookup's chain, else the trees'; a plain decode where neither drafts) and the hindsight hybrid (the
longest accepted of EAGLE's, lookup's and the trees' chains), so the ratio of their speeds says what a per-round
choice adds; the positions a drafter's own rounds would visit differ (a long accepted run skips positions), which
moves every speed here away from its own by the same sampling. Speeds are modelled by forward cost
(``--row-costs``: the verify of k + 1 rows relative to one row) plus, in EAGLE's rounds, its draft cost per step
and per round (``--draft-cost``; by default fitted from the rounds' wall time at each k against target-only's, on
an idle machine only); SUFFIX's lookups are free. Each drafter at its best fixed tier per phase; the mixed
workload's time is the phases' sum (each emits the same tokens).

    PYTHONPATH=python python bench/hybrid_bound.py --json results/hybrid-bound-mixed-epyc.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from specswap.bench import provenance
from specswap.bench import workloads as phased
from specswap.prompt_lookup import NumberTokens
from specswap.worker.suffix import SuffixConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
import suffix_replay  # noqa: E402  (the suffix trees' replay, the row costs)

WHAT = ("What a per-round choice between EAGLE's draft and SUFFIX's adds on the mixed workload: EAGLE served at "
        "each fixed chain tier; at its round starts EAGLE, SUFFIX as built (replayed over the same outputs) and the "
        "better of the two in hindsight, judged at the same positions; speeds modelled by the verify's cost by rows "
        "plus EAGLE's draft cost, each at its best fixed tier per phase")


def serve(args, steps: int | None, phases) -> tuple[list[dict], float]:
    """The workload's requests one at a time through an Engine (EAGLE at ``steps``; None: target-only): per request
    its prompt, output and accepted drafts per round; and the seconds spent in ``generate``."""
    from specswap.engine import Engine
    algorithm = {} if steps is None else dict(speculative_algorithm="EAGLE", speculative_num_steps=steps)
    engine = Engine(args.model, weights=args.weights, max_batch_size=1, max_seq_len=args.max_seq_len, **algorithm)
    engine.generate(["Warm up."], 4)
    rows, seconds, seed = [], 0.0, 0
    for phase in phases:
        for text in phase.prompts:
            began = time.perf_counter()
            out = engine.generate([text], args.max_new_tokens, temperature=phase.temperature, seed=seed,
                                  ignore_eos=True)[0]
            seconds += time.perf_counter() - began
            rows.append({"phase": phase.name, "prompt_ids": list(out.prompt_token_ids),
                         "output_ids": list(out.token_ids), "accept_lengths": list(out.accept_lengths)})
            seed += 1
    return rows, seconds


def round_starts(accept_lengths: list[int], length: int) -> list[tuple[int, int]]:
    """(output position where a round began, what it accepted) for every round that began before ``length`` - 1
    (positions count from the output's first token, emitted by the prefill)."""
    out, position = [], 1
    for accepted in accept_lengths:
        if position >= length:
            break
        out.append((position, accepted))
        position += accepted + 1
    return out


def phase_figures(rows: list[dict], positions, k: int, costs, draft: tuple[float, float]) -> dict:
    """One phase at tier k, at EAGLE's round starts (every drafter judged at the same positions): tokens per round
    and modelled time per output token (one-row forwards; renewal: a round's mean cost over its mean tokens) of
    EAGLE, SUFFIX as built (prompt lookup's chain, else the trees'; a plain decode where neither drafts) and the
    hindsight hybrid (the longest accepted of EAGLE's, lookup's and the trees' chains). ``draft``: EAGLE's cost
    per draft step and per round (its draft-extend, host work), added to its rounds' verify."""
    verify = costs(k + 1)
    eagle_round = verify + k * draft[0] + draft[1]
    eagle_time = suffix_time = hybrid_time = 0.0
    eagle_tokens = suffix_tokens = hybrid_tokens = rounds = chose_suffix = 0
    for row, at in zip(rows, positions):
        for position, accepted in round_starts(row["accept_lengths"], len(row["output_ids"])):
            here = at[position - 1]  # stream_positions starts at output position 1
            built = here.lookup[k] if here.lookup[k] is not None else here.trees[k]
            either = max(a for a in (here.lookup[k], here.trees[k], -1) if a is not None)
            rounds += 1
            eagle_tokens += accepted + 1
            eagle_time += eagle_round
            suffix_tokens += (built or 0) + 1
            suffix_time += 1.0 if built is None else verify
            hybrid_tokens += max(accepted, either) + 1
            chose_suffix += either > accepted
            hybrid_time += verify if either > accepted else eagle_round
    return {"rounds": rounds, "eagle_tokens_per_round": eagle_tokens / rounds,
            "suffix_tokens_per_round": suffix_tokens / rounds, "hybrid_tokens_per_round": hybrid_tokens / rounds,
            "suffix_share": chose_suffix / rounds,
            "eagle": eagle_time / eagle_tokens, "suffix": suffix_time / suffix_tokens,
            "hybrid": hybrid_time / hybrid_tokens}


def fit_draft_cost(seconds: dict, rounds: dict, tokens: int, costs) -> tuple[float, float]:
    """EAGLE's draft cost relative to one row, (per step, per round): least squares of
    round_seconds(k) / plain_seconds - rows(k + 1) = step k + fixed over the tiers served."""
    plain = seconds[None] / tokens
    points = [(k, seconds[k] / rounds[k] / plain - costs(k + 1)) for k in seconds if k is not None]
    mean_k = sum(k for k, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    var = sum((k - mean_k) ** 2 for k, _ in points)
    step = sum((k - mean_k) * (y - mean_y) for k, y in points) / var if var else 0.0
    return step, mean_y - step * mean_k


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gemma-3-270m")
    parser.add_argument("--weights", default="native", choices=["native", "bf16", "fp32"])
    parser.add_argument("--prompt-set", default="report", choices=sorted(phased.PROMPT_SETS))
    parser.add_argument("--requests-per-phase", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=80)
    parser.add_argument("--max-seq-len", type=int, default=1024)
    parser.add_argument("--tiers", type=int, nargs="+", default=list(suffix_replay.BOUND_TIERS))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--row-costs", default="results/gemma-forward-t1.json",
                        help="bench/bench_gemma_forward.py's JSON: the verify's cost by rows")
    parser.add_argument("--draft-cost", type=float, nargs=2, default=None, metavar=("PER_STEP", "PER_ROUND"),
                        help="EAGLE's draft cost relative to one row (default: fitted from the rounds' wall time "
                             "here against target-only's; idle machine only)")
    parser.add_argument("--streams", default=None,
                        help="cache the served outputs and timings here (reused when the settings match)")
    parser.add_argument("--json", default=None)
    return parser


def main() -> None:
    args = build_parser().parse_args()
    import torch
    torch.set_num_threads(args.threads)
    costs = suffix_replay.RowCosts.from_json(args.row_costs, args.weights)
    phases = phased.build_workload("mixed", args.requests_per_phase, prompt_set=args.prompt_set)
    started = time.perf_counter()
    settings = {key: getattr(args, key) for key in ("model", "weights", "prompt_set", "requests_per_phase",
                                                     "max_new_tokens", "tiers", "threads")}
    cached = json.loads(Path(args.streams).read_text()) if args.streams and Path(args.streams).exists() else None
    if cached and cached["settings"] == settings:
        print(f"streams and timings from {args.streams}")
        served = {None if k == "plain" else int(k): v for k, v in cached["served"].items()}
        seconds = {None if k == "plain" else int(k): v for k, v in cached["seconds"].items()}
    else:
        served, seconds = {}, {}
        for steps in [None, *args.tiers]:
            served[steps], seconds[steps] = serve(args, steps, phases)
            print(f"{'target-only' if steps is None else f'EAGLE static-{steps}'}: {seconds[steps]:.1f} s "
                  f"({time.perf_counter() - started:.0f} s)", flush=True)
        if args.streams:
            provenance.write_report(args.streams, {
                "settings": settings, "served": {"plain" if k is None else str(k): v for k, v in served.items()},
                "seconds": {"plain" if k is None else str(k): v for k, v in seconds.items()}})
    tokens = sum(len(r["output_ids"]) for r in served[None])
    rounds = {k: sum(len(r["accept_lengths"]) for r in served[k]) for k in args.tiers}
    measured = fit_draft_cost(seconds, rounds, tokens, costs)
    draft = measured if args.draft_cost is None else tuple(args.draft_cost)
    from specswap.engine import Engine  # the tokenizer's digit tokens, as NGRAM's lookup extrapolates them
    numbers = NumberTokens.from_tokenizer(Engine(args.model, weights=args.weights, max_batch_size=1).tokenizer)
    names = [phase.name for phase in phases]
    per_phase = {name: {} for name in names}
    for k in args.tiers:
        rows = served[k]
        positions = suffix_replay.stream_positions([(r["prompt_ids"], r["output_ids"]) for r in rows], numbers,
                                                   SuffixConfig())
        for name in names:
            chosen = [i for i, r in enumerate(rows) if r["phase"] == name]
            per_phase[name][k] = phase_figures([rows[i] for i in chosen], [positions[i] for i in chosen], k, costs,
                                               draft)
    report = {"draft_cost": [round(x, 4) for x in draft], "draft_cost_measured": [round(x, 4) for x in measured],
              "phases": []}
    kinds = ("eagle", "suffix", "hybrid")
    totals = dict.fromkeys(kinds, 0.0)
    for name in names:
        by_tier = per_phase[name]
        best = {kind: min(by_tier, key=lambda k: by_tier[k][kind]) for kind in kinds}
        time_per_token = {kind: by_tier[best[kind]][kind] for kind in kinds}
        for kind in kinds:  # every phase emits the same tokens (ignore_eos): the mixed time is the phases' sum
            totals[kind] += time_per_token[kind]
        entry = {"phase": name, "best_tier": best,
                 "speed_vs_plain": {kind: round(1.0 / value, 3) for kind, value in time_per_token.items()},
                 "hybrid_vs_better": round(min(time_per_token["eagle"], time_per_token["suffix"])
                                           / time_per_token["hybrid"], 3),
                 "tiers": {k: {key: round(value, 3) for key, value in f.items()} for k, f in by_tier.items()}}
        report["phases"].append(entry)
        print(f"{name}: {entry['speed_vs_plain']} (tiers {best}) hybrid / better {entry['hybrid_vs_better']}",
              flush=True)
    report["mixed"] = {"speed_vs_plain": {kind: round(len(names) / value, 3) for kind, value in totals.items()},
                       "hybrid_vs_better": round(min(totals["eagle"], totals["suffix"]) / totals["hybrid"], 3)}
    print(f"mixed: {report['mixed']}; EAGLE's draft (per step, per round) {report['draft_cost']}")
    if args.json:
        provenance.write_report(args.json, {
            **provenance.stamp(), "what": WHAT, "model": args.model, "weights": args.weights,
            "prompt_set": args.prompt_set, "requests_per_phase": args.requests_per_phase,
            "max_new_tokens": args.max_new_tokens, "threads": args.threads, "row_costs": args.row_costs,
            "tiers": args.tiers, "suffix_settings": SuffixConfig().__dict__,
            "served_seconds": {"plain" if k is None else str(k): round(v, 2) for k, v in seconds.items()}, **report})


if __name__ == "__main__":
    main()
