"""The adaptive policy's trace on the tiny pair: for each algorithm, greedy and seeded sampling, the tier every
step ran and every request's tokens, as one JSON. Deterministic (the EMA policy on accepted lengths; the goodput
policy is excluded, its input is wall time), so two commits' traces compare byte for byte:

    python bench/policy_trace.py --out trace.json
"""

from __future__ import annotations

import argparse
import json
import sys

import specswap

PROMPTS = ["def fibonacci(n):\n", "1, 2, 3, 4, 5, 6,", "The quick brown fox", "for i in range(10):\n    print(i)\n"]
CONFIG = {"policy": "sglang", "candidate_steps": [1, 3, 7], "ema_alpha": 0.5, "warmup_batches": 0,
          "update_interval": 1}


def trace(algorithm: str, temperature: float, graphs: bool) -> dict:
    engine = specswap.Engine("tiny", speculative_algorithm=algorithm, speculative_adaptive=True,
                             speculative_adaptive_config=CONFIG, max_batch_size=3, disable_graphs=not graphs)
    ids = [engine.add_request(prompt, max_new_tokens=48, temperature=temperature, seed=7 + index)
           for index, prompt in enumerate(PROMPTS)]
    tiers, tokens = [], {}
    while engine.has_unfinished():
        step = engine.step()
        tiers.append(step.tier)
        for output in step.finished:
            tokens[ids.index(output.request_id)] = output.token_ids
    stats = engine.stats()
    return {"tiers": tiers, "tokens": [tokens[i] for i in range(len(PROMPTS))],
            "rounds_per_tier": {str(k): v for k, v in stats["rounds_per_tier"].items()},
            "num_switches": stats["num_switches"]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="where the trace JSON goes")
    args = parser.parse_args(argv)
    runs = {f"{algorithm} T={temperature} graphs={graphs}": trace(algorithm, temperature, graphs)
            for algorithm in ("EAGLE", "STANDALONE", "NGRAM") for temperature in (0.0, 0.8)
            for graphs in (False, True)}
    with open(args.out, "w") as handle:
        json.dump(runs, handle, sort_keys=True)
    print(f"wrote {args.out}: {len(runs)} runs, {sum(len(r['tiers']) for r in runs.values())} steps", file=sys.stderr)


if __name__ == "__main__":
    main()
