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

All three are judged at the same positions, EAGLE's round starts at each tier k: EAGLE, SUFFIX as built (prompt
lookup's chain, else the trees'; a plain decode where neither drafts) and the hindsight hybrid (the longest
accepted of EAGLE's, lookup's and the trees' chains). Their tokens per second there (``tier_speeds``): EAGLE's at
its measured seconds per round at k; SUFFIX's with each round at the verify alone (k + 1 rows, ``--row-costs``,
times target-only's seconds per token; a plain decode where it has no draft); the hybrid's with each round
choosing, in hindsight, EAGLE's draft, the suffix chain or a plain decode so as to emit the most tokens per second
(``best_ratio``), against SUFFIX with EAGLE's draft free (either draft at the verify alone), against EAGLE with its
suffix rounds at the verify alone; and the same choosing between the two drafts only (``drafts_only``: a plain
decode where neither would be accepted is the larger part of the bound's gain on sampled text, and no drafter
knows that before the round).
Per phase, the hybrid at its best tier over the drafter that ``--measured`` (``specswap bench --workload mixed``'s
JSON: EAGLE run, modes ``adaptive`` and ``adaptive@SUFFIX``) found faster there, at that drafter's own best tier,
times that measured speed, gives the bound's speed for the phase; the mixed bound (each phase emits the same
tokens) is set against the better drafter's measured speed over the whole workload. Generous on every count: the
choice is clairvoyant and free, host work is left out of the hybrid's rounds, and a tier's sampled streams (each
tier serves its own) lift its maximum.

``--workload code`` does the same for ``bench/bench_llamacpp.py``'s greedy code set (``--requests-per-phase``
prompts of the report code set, one phase, requests free to stop at EOS as there) against that bench's JSON
(``--measured``: modes ``eagle adaptive`` and ``suffix adaptive``), and sets the bound against OpenVINO's best
prompt lookup in the same JSON.

    PYTHONPATH=python python bench/hybrid_bound.py --json results/hybrid-bound-mixed-epyc.json
    PYTHONPATH=python python bench/hybrid_bound.py --workload code --requests-per-phase 4 --max-new-tokens 96 \
        --measured results/peers-gemma-code-epyc.json --json results/hybrid-bound-code-epyc.json
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
from bench_engine import PROMPT_SETS as ENGINE_PROMPT_SETS  # noqa: E402  (the peer bench's code prompts)

WHAT = ("An upper bound for the hybrid on the {workload} workload: EAGLE served at each fixed chain tier; at its "
        "round starts EAGLE, SUFFIX as built (replayed over the same outputs) and, in hindsight, the draft (or a plain "
        "decode) that emits most per second; per phase what that choice adds over the drafter measured faster there, "
        "times its measured speed")


def serve(args, steps: int | None, phases) -> tuple[list[dict], float, list[int] | None]:
    """The workload's requests one at a time through an Engine (EAGLE at ``steps``; None: target-only): per request
    its prompt, output and accepted drafts per round; the seconds spent in ``generate``; the tokenizer's digit
    tokens (as NGRAM's lookup extrapolates them)."""
    from specswap.engine import Engine
    algorithm = dict(speculative_algorithm=None) if steps is None else \
        dict(speculative_algorithm="EAGLE", speculative_num_steps=steps)  # (the Engine's default drafts: EAGLE)
    engine = Engine(args.model, weights=args.weights, max_batch_size=1, max_seq_len=args.max_seq_len, **algorithm)
    numbers = NumberTokens.from_tokenizer(engine.tokenizer)
    engine.generate(["Warm up."], 4)
    rows, seconds, seed = [], 0.0, 0
    for phase in phases:
        for text in phase.prompts:
            began = time.perf_counter()
            out = engine.generate([text], args.max_new_tokens, temperature=phase.temperature, seed=seed,
                                  ignore_eos=args.workload != "code")[0]  # the peer bench lets requests stop
            seconds += time.perf_counter() - began
            rows.append({"phase": phase.name, "prompt_ids": list(out.prompt_token_ids),
                         "output_ids": list(out.token_ids), "accept_lengths": list(out.accept_lengths)})
            seed += 1
    return rows, seconds, list(numbers.ids) if numbers else None


def by_tier_key(values: dict) -> dict:
    """A dict keyed by tier (None: target-only) as JSON keys ("plain", "1", ...)."""
    return {"plain" if k is None else str(k): v for k, v in values.items()}


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


def phase_figures(rows: list[dict], positions, k: int) -> dict:
    """One phase at tier k, at EAGLE's round starts: tokens per round of EAGLE, SUFFIX as built and the hindsight
    hybrid (the longer accepted), the share of rounds where the suffix chain accepted more than EAGLE's, and per
    round (``pairs``, not a figure) EAGLE's accepted drafts and the longer suffix chain's (None: none)."""
    eagle = suffix = hybrid = rounds = chose_suffix = suffix_drafted = 0
    pairs = []
    for row, at in zip(rows, positions):
        for position, accepted in round_starts(row["accept_lengths"], len(row["output_ids"])):
            here = at[position - 1]  # stream_positions starts at output position 1
            built = here.lookup[k] if here.lookup[k] is not None else here.trees[k]
            either = max(a for a in (here.lookup[k], here.trees[k], -1) if a is not None)
            rounds += 1
            eagle += accepted + 1
            suffix += (built or 0) + 1  # no draft: a plain decode, one token
            suffix_drafted += built is not None
            hybrid += max(accepted, either) + 1
            chose_suffix += either > accepted
            pairs.append((accepted, None if either < 0 else either))
    return {"rounds": rounds, "eagle_tokens_per_round": eagle / rounds, "suffix_tokens_per_round": suffix / rounds,
            "hybrid_tokens_per_round": hybrid / rounds, "suffix_share": chose_suffix / rounds,
            "suffix_drafted": suffix_drafted / rounds, "pairs": pairs}


def best_ratio(rounds: list[list[tuple[float, float]]]) -> float:
    """The most tokens per second one option per round can reach (each option: tokens, seconds), by Dinkelbach's
    iteration: from the first options' ratio, take in every round the option with the most tokens less the ratio
    times its seconds, until the ratio stops rising (it rises each step, and the choices are finite)."""
    ratio = sum(options[0][0] for options in rounds) / sum(options[0][1] for options in rounds)
    while True:
        picks = [max(options, key=lambda option: option[0] - ratio * option[1]) for options in rounds]
        better = sum(t for t, _ in picks) / sum(c for _, c in picks)
        if better <= ratio * (1.0 + 1e-12):
            return ratio
        ratio = better


def tier_speeds(figures: dict, eagle_round: float, verify: float, plain: float) -> dict:
    """Tokens per second at one tier, at EAGLE's round starts: EAGLE's at its measured ``eagle_round`` seconds per
    round; SUFFIX's with its rounds at the verify alone (``verify``; a plain decode, ``plain``, where it has no
    draft); the hybrid's, each round taking EAGLE's draft, the suffix chain (where there is one) or a plain decode
    as emits the most tokens per second (``best_ratio``), against EAGLE (its suffix rounds at the verify alone) and
    against SUFFIX (either draft at the verify alone: EAGLE's draft free)."""
    drafted = figures["suffix_drafted"]

    def hybrid(eagle_cost: float, plain_decodes: bool = True) -> float:
        return best_ratio([[(e + 1, eagle_cost)] + [(1, plain)] * plain_decodes
                           + ([] if s is None else [(s + 1, verify)]) for e, s in figures["pairs"]])
    return {"EAGLE": figures["eagle_tokens_per_round"] / eagle_round,
            "SUFFIX": figures["suffix_tokens_per_round"] / (drafted * verify + (1.0 - drafted) * plain),
            "hybrid_vs_EAGLE": hybrid(eagle_round), "hybrid_vs_SUFFIX": hybrid(verify),
            "drafts_only_vs_EAGLE": hybrid(eagle_round, False), "drafts_only_vs_SUFFIX": hybrid(verify, False)}


def gain_over(by_tier: dict, over: str, hybrid: str = "hybrid") -> tuple[float, int, int]:
    """What the hindsight hybrid (``hybrid``: or "drafts_only") at its best tier adds over ``over`` at its own
    best tier (``speeds`` per tier): the ratio and both tiers."""
    key = f"{hybrid}_vs_{over}"
    best = max(by_tier, key=lambda k: by_tier[k][key])
    alone = max(by_tier, key=lambda k: by_tier[k][over])
    return by_tier[best][key] / by_tier[alone][over], best, alone


def workload_phases(args) -> list:
    """The served phases: ``specswap bench``'s mixed workload, or the peer bench's code set as one greedy phase."""
    if args.workload == "code":
        prompts = ENGINE_PROMPT_SETS[args.prompt_set]["code"][0][:args.requests_per_phase]
        return [phased.Phase("code", tuple(prompts), 0.0)]
    return phased.build_workload("mixed", args.requests_per_phase, prompt_set=args.prompt_set)


PEER_MODES = {"EAGLE": "eagle adaptive", "SUFFIX": "suffix adaptive"}


def peer_speeds(data: dict, path: str) -> tuple[list[dict], dict, float | None]:
    """``bench/bench_llamacpp.py``'s JSON (one set, greedy, one thread): each drafter's tokens per second on its
    set as one phase, and OpenVINO's best prompt lookup (None: not run)."""
    rows = [r for r in data["results"] if r.get("temperature") == 0.0]
    sets = {r["set"] for r in rows}
    speeds = {r["mode"]: r["tokens_per_second"] for r in rows if r["runtime"] == "specswap"}
    missing = [mode for mode in PEER_MODES.values() if mode not in speeds]
    if len(sets) != 1 or missing:
        raise SystemExit(f"{path}: needs one greedy set (has {sorted(sets)}) with specswap modes "
                         f"{list(PEER_MODES.values())} (missing {missing})")
    lookups = [r["tokens_per_second"] for r in rows if r["runtime"] == "openvino" and r["mode"] != "plain"]
    overall = {name: speeds[mode] for name, mode in PEER_MODES.items()}
    return [{"phase": sets.pop(), **overall}], overall, max(lookups) if lookups else None


def measured_speeds(path: str) -> tuple[list[dict], dict, float | None]:
    """``specswap bench --workload mixed``'s JSON: per phase its name and each drafter's tokens per second (EAGLE:
    mode ``adaptive`` of an EAGLE run; SUFFIX: ``adaptive@SUFFIX``), the whole workload's, and None; or the peer
    bench's (``peer_speeds``)."""
    data = json.loads(Path(path).read_text())
    if "results" in data and "modes" not in data:
        return peer_speeds(data, path)
    from specswap import algorithms
    name = data.get("speculative_algorithm")
    if name not in algorithms.ALGORITHMS or not algorithms.algorithm(name).needs_draft \
            or "adaptive@SUFFIX" not in data["modes"]:
        raise SystemExit(f"{path}: needs a model drafter's run of specswap bench (EAGLE) with modes adaptive and "
                         "adaptive@SUFFIX")
    modes = {"EAGLE": data["modes"]["adaptive"], "SUFFIX": data["modes"]["adaptive@SUFFIX"]}
    phases = [{"phase": phase["name"], **{name: mode["phases"][i]["throughput_tok_s"] for name, mode in modes.items()}}
              for i, phase in enumerate(modes["EAGLE"]["phases"])]
    return phases, {name: mode["overall"]["throughput_tok_s"] for name, mode in modes.items()}, None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gemma-3-270m")
    parser.add_argument("--workload", default="mixed", choices=["mixed", "code"],
                        help="specswap bench's mixed workload, or bench_llamacpp.py's greedy code set")
    parser.add_argument("--weights", default="native", choices=["native", "bf16", "fp32"])
    parser.add_argument("--prompt-set", default="report", choices=sorted(phased.PROMPT_SETS))
    parser.add_argument("--requests-per-phase", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=80)
    parser.add_argument("--max-seq-len", type=int, default=1024)
    parser.add_argument("--tiers", type=int, nargs="+", default=list(suffix_replay.BOUND_TIERS))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--row-costs", default="results/gemma-forward-t1.json",
                        help="bench/bench_gemma_forward.py's JSON: the verify's cost by rows")
    parser.add_argument("--measured", default="results/hybrid-mixed-epyc.json",
                        help="specswap bench's JSON of the mixed workload (EAGLE run; modes adaptive, "
                             "adaptive@SUFFIX), or with --workload code bench_llamacpp.py's JSON (modes eagle "
                             "adaptive, suffix adaptive): each phase's measured speeds")
    parser.add_argument("--streams", default=None,
                        help="cache the served outputs and timings here (reused when the settings match)")
    parser.add_argument("--json", default=None)
    return parser


def main() -> None:
    args = build_parser().parse_args()
    import torch
    torch.set_num_threads(args.threads)
    costs = suffix_replay.RowCosts.from_json(args.row_costs, args.weights)
    phases = workload_phases(args)
    started = time.perf_counter()
    settings = {key: getattr(args, key) for key in ("model", "workload", "weights", "prompt_set",
                                                     "requests_per_phase", "max_new_tokens", "tiers", "threads")}
    cached = json.loads(Path(args.streams).read_text()) if args.streams and Path(args.streams).exists() else None
    if cached and any(any(row["accept_lengths"]) for row in cached["served"].get("plain", [])):
        print(f"{args.streams}: its target-only streams drafted (served with the Engine's default, EAGLE): "
              "serving again")
        cached = None
    if cached and cached["settings"] == settings and "number_tokens" in cached:
        print(f"streams and timings from {args.streams} (commit {cached.get('commit')})")
        served = {None if k == "plain" else int(k): v for k, v in cached["served"].items()}
        seconds = {None if k == "plain" else int(k): v for k, v in cached["seconds"].items()}
        number_ids = cached["number_tokens"]
    else:
        served, seconds = {}, {}
        for steps in [None, *args.tiers]:
            served[steps], seconds[steps], number_ids = serve(args, steps, phases)
            print(f"{'target-only' if steps is None else f'EAGLE static-{steps}'}: {seconds[steps]:.1f} s "
                  f"({time.perf_counter() - started:.0f} s)", flush=True)
        if args.streams:
            provenance.write_report(args.streams, {
                **provenance.stamp(), "settings": settings, "number_tokens": number_ids,
                "served": by_tier_key(served), "seconds": by_tier_key(seconds)})
    numbers = NumberTokens(number_ids) if number_ids else None
    tokens = sum(len(r["output_ids"]) for r in served[None])
    plain = seconds[None] / tokens  # target-only's seconds per token
    rounds = {k: sum(len(r["accept_lengths"]) for r in served[k]) for k in args.tiers}
    names = [phase.name for phase in phases]
    per_phase = {name: {} for name in names}
    for k in args.tiers:
        rows = served[k]
        positions = suffix_replay.stream_positions([(r["prompt_ids"], r["output_ids"]) for r in rows], numbers,
                                                   SuffixConfig())
        for name in names:
            chosen = [i for i, r in enumerate(rows) if r["phase"] == name]
            per_phase[name][k] = phase_figures([rows[i] for i in chosen], [positions[i] for i in chosen], k)
    measured, overall, openvino = measured_speeds(args.measured)
    if [m["phase"] for m in measured] != names:
        raise SystemExit(f"{args.measured}: phases {[m['phase'] for m in measured]}, not {names}")
    report = {"measured": args.measured, "measured_overall_tok_s": overall, "phases": []}
    bound_time = drafts_time = 0.0
    for name, speeds in zip(names, measured):
        faster = max(("EAGLE", "SUFFIX"), key=lambda drafter: speeds[drafter])
        by_tier = {k: tier_speeds(f, seconds[k] / rounds[k], costs(k + 1) * plain, plain)
                   for k, f in per_phase[name].items()}
        gain, tier, alone = gain_over(by_tier, faster)
        drafts_gain = gain_over(by_tier, faster, "drafts_only")[0]
        bound_time += 1.0 / (speeds[faster] * gain)  # each phase emits the same tokens
        drafts_time += 1.0 / (speeds[faster] * drafts_gain)
        entry = {"phase": name, "measured_tok_s": {d: speeds[d] for d in ("EAGLE", "SUFFIX")}, "faster": faster,
                 "gain": round(gain, 3), "gain_drafts_only": round(drafts_gain, 3), "hybrid_tier": tier,
                 f"{faster}_tier": alone,
                 "tiers": {k: {**{key: round(v, 3) for key, v in f.items() if key != "pairs"},
                               **{f"{key}_tok_s": round(v, 1) for key, v in by_tier[k].items()}}
                           for k, f in per_phase[name].items()}}
        report["phases"].append(entry)
        print(f"{name}: {faster} faster ({speeds[faster]:.1f} tok/s); the hindsight hybrid adds at most "
              f"{gain:.3f}x (tier {tier} against {alone}), choosing between the drafts only {drafts_gain:.3f}x",
              flush=True)
    bound, drafts_bound = len(names) / bound_time, len(names) / drafts_time
    better = max(overall.values())
    report[args.workload] = {"bound_tok_s": round(bound, 1), "better_measured_tok_s": better,
                             "bound_vs_better": round(bound / better, 3),
                             "drafts_only_bound_tok_s": round(drafts_bound, 1),
                             "drafts_only_bound_vs_better": round(drafts_bound / better, 3)}
    print(f"{args.workload}: the bound {bound:.1f} tok/s, {bound / better:.3f}x the better drafter's measured "
          f"{better:.1f}; choosing between the drafts only {drafts_bound:.1f}, {drafts_bound / better:.3f}x")
    if openvino is not None:
        report[args.workload].update(openvino_prompt_lookup_tok_s=openvino,
                                     bound_vs_openvino_prompt_lookup=round(bound / openvino, 3),
                                     drafts_only_bound_vs_openvino_prompt_lookup=round(drafts_bound / openvino, 3))
        print(f"{args.workload}: the bound {bound / openvino:.3f}x OpenVINO's best prompt lookup ({openvino:.1f}), "
              f"the drafts only {drafts_bound / openvino:.3f}x")
    if args.json:
        provenance.write_report(args.json, {
            **provenance.stamp(), "what": WHAT.format(workload=args.workload), "workload": args.workload,
            "model": args.model, "weights": args.weights,
            "prompt_set": args.prompt_set, "requests_per_phase": args.requests_per_phase,
            "max_new_tokens": args.max_new_tokens, "threads": args.threads, "row_costs": args.row_costs,
            "tiers": args.tiers, "suffix_settings": SuffixConfig().__dict__,
            "streams_commit": (cached or {}).get("commit", provenance.git_commit()),
            "eagle_seconds_per_round": {str(k): round(seconds[k] / rounds[k], 5) for k in args.tiers},
            "plain_seconds_per_token": round(plain, 5),
            "served_seconds": by_tier_key({k: round(v, 2) for k, v in seconds.items()}), **report})


if __name__ == "__main__":
    main()
