"""``specswap bench``: the phased workload, every mode side by side in one run, the oracle, JSON and a plot."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from specswap.bench import provenance, report
from specswap.bench.workloads import DEFAULT_PROMPT_SET, PROMPT_SETS, WORKLOADS, build_workload

def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workload", default="transition", choices=list(WORKLOADS),
                        help="low, high, transition (low, high, low, high); where other requests' outputs matter "
                             "(SUFFIX): resample, template, multiturn, mixed (resample, high, template, low)")
    parser.add_argument("--prompt-set", default=DEFAULT_PROMPT_SET, choices=list(PROMPT_SETS),
                        help="report: prompts kept apart from tuning (for published figures); tune: the prompts "
                             "the policy's constants were set on (docs/bench.md)")
    parser.add_argument("--requests-per-phase", type=int, default=8, help="requests of each phase (upstream: 8)")
    parser.add_argument("--concurrency", type=int, default=2, help="requests in flight (the batch size)")
    parser.add_argument("--max-new-tokens", type=int, default=80)
    parser.add_argument("--low-temperature", type=float, default=1.0, help="sampling temperature of low phases")
    parser.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=True,
                        help="run every request to --max-new-tokens (default, as SGLang's bench_serving): sampled "
                             "texts differ between modes, and one that stops early would pay its prefill over "
                             "fewer tokens; --no-ignore-eos stops at the end-of-sequence token")
    parser.add_argument("--warmup", type=int, default=1,
                        help="warm-up requests per mode, on a throwaway engine with the same settings (0: none)")
    parser.add_argument("--modes", nargs="+", default=None,
                        help="subset of: baseline, static<k>, tree<steps>x<topk>x<num_draft_tokens> (a static draft "
                             "tree, e.g. tree3x2x6), adaptive (default: baseline, a static mode per chain the default "
                             "policy may choose here and per chain and tree of the adaptive config, adaptive); "
                             "<mode>@<ALGORITHM> runs a mode with another drafter over the same weights (adaptive@SUFFIX, "
                             "adaptive@EAGLE+SUFFIX: the hybrid), interleaved with the others")
    parser.add_argument("--repeats", type=int, default=1,
                        help="run the modes this many times, interleaved; figures pool every repeat")
    parser.add_argument("--seed", type=int, default=0, help="request i of a mode is seeded with seed + i")
    parser.add_argument("--trace-estimates", action="store_true",
                        help="adaptive modes: record each step's expected tokens and cost per round of every "
                             "candidate chain (the JSON's estimates_by_repeat: [t_s, tier, batch, phase, {k: [E(k), ms]}])")
    parser.add_argument("--output", default=None, help="write the results as JSON (schema: docs/bench.md)")
    parser.add_argument("--plot", default=None, help="write a PNG of tier and throughput over time per mode")
    parser.add_argument("--server", action="append", default=None, metavar="[NAME=]URL",
                        help="benchmark running server(s) instead of an in-process engine (repeatable; NAME "
                             "names the mode, e.g. static3=http://127.0.0.1:30000)")
    parser.add_argument("--api-key", default=None, help="bearer token for --server")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def machine_tiers(models, config_path: str | None) -> tuple[list[int], list[tuple[int, int, int]]]:
    """The static modes (chains > 0, trees) every in-process run compares against: each chain the default policy
    may choose on this machine for this drafter (``auto_steps`` from the target's row costs: the table the Engine
    reads, from the same cache), and beside them the adaptive config's chains and trees (its "auto" ones filled in
    as the Engine fills them). None without speculation."""
    if models.speculative_algorithm is None:
        return [], []
    from specswap.adaptive_config import engine_adaptive_config
    from specswap.algorithms import algorithm
    from specswap.worker.row_cost import resolve_row_costs

    model_drafter = algorithm(models.speculative_algorithm).needs_draft
    costs = resolve_row_costs("auto", models.target, models.weights)
    chains = set(engine_adaptive_config(None, model_drafter=model_drafter).for_machine(costs).candidate_steps)
    trees: list[tuple[int, int, int]] = []
    if config_path is not None:
        config = engine_adaptive_config(config_path, model_drafter=model_drafter).for_machine(costs)
        chains |= set(config.candidate_steps)
        trees = [tuple(int(v) for v in tree) for tree in config.candidate_trees]
    return sorted(int(k) for k in chains if k > 0), trees


def oracle_candidates(modes: dict[str, Any]) -> list[str]:
    """The modes the oracle switches among, whatever the adaptive config: every static chain and tree, and the
    baseline (speculation off: the default policy may turn it off, so the oracle may too; a config without tier 0
    is measured against it as well)."""
    names = [name for name in modes if name.startswith(("static", "tree")) and "@" not in name]
    if "baseline" in modes:
        names.append("baseline")
    return names


def mode_settings(modes: list[str] | None, algorithm: str | None, steps: list[int], initial_steps: int,
                  adaptive_config: str | None, trees: list[tuple[int, int, int]] = ()) -> dict[str, dict[str, Any]]:
    """Mode name -> build_engine keyword arguments (by default: the baseline, a static mode per candidate
    chain ``steps`` and tree ``trees``, adaptive)."""
    available: dict[str, dict[str, Any]] = {"baseline": {"speculative_algorithm": None}}
    if algorithm is not None:
        for k in steps:
            available[f"static{k}"] = {"speculative_algorithm": algorithm, "speculative_num_steps": k}
        for depth, topk, nodes in trees:
            available[f"tree{depth}x{topk}x{nodes}"] = {
                "speculative_algorithm": algorithm, "speculative_num_steps": depth, "speculative_eagle_topk": topk,
                "speculative_num_draft_tokens": nodes}
        available["adaptive"] = {"speculative_algorithm": algorithm, "speculative_num_steps": initial_steps,
                                 "speculative_adaptive": True, "speculative_adaptive_config": adaptive_config}
    if modes is None:
        return available
    for name in modes:
        if name.startswith("static") and name[6:].isdigit() and algorithm is not None:
            available.setdefault(name, {"speculative_algorithm": algorithm, "speculative_num_steps": int(name[6:])})
        shape = name[4:].split("x")
        if name.startswith("tree") and len(shape) == 3 and all(p.isdigit() for p in shape) and algorithm is not None:
            steps, topk, nodes = map(int, shape)  # tree<steps>x<topk>x<num_draft_tokens>, as SGLang's three flags
            available.setdefault(name, {"speculative_algorithm": algorithm, "speculative_num_steps": steps,
                                        "speculative_eagle_topk": topk, "speculative_num_draft_tokens": nodes})
        if name.startswith("adaptive:") and "@" not in name and algorithm is not None:  # adaptive:<config>: beside
            available.setdefault(name, {**available["adaptive"], "speculative_adaptive_config": name[9:]})
    for name in modes:  # <mode>@<ALGORITHM>: that mode with another drafter over the same weights, interleaved
        base, _, other = name.partition("@")
        if other:  # an unknown base mode is refused by the call below, naming it
            first, _, second = other.upper().partition("+")  # EAGLE+SUFFIX: the hybrid
            settings = dict(mode_settings([base], first, steps, initial_steps, adaptive_config, trees)[base])
            if second:
                settings["hybrid_drafter"] = second
            available.setdefault(name, settings)
    unknown = [name for name in modes if name not in available]
    if unknown:
        raise ValueError(f"unknown bench mode(s) {unknown}; valid: {', '.join(available)} (or static<k>, "
                         f"tree<steps>x<topk>x<num_draft_tokens>, adaptive:<config>, <mode>@<ALGORITHM>[+SUFFIX])")
    return {name: available[name] for name in modes}


def _progress(total: int, enabled: bool):
    from tqdm import tqdm
    return tqdm(total=total, unit="req", disable=not enabled, file=sys.stderr, leave=False)


def run_in_process(models, args, modes: dict[str, dict[str, Any]], phases, progress) -> dict[str, dict]:
    """Every mode on its own engine, all built over the same loaded weights and alive together, interleaved
    engine step by engine step within each phase (one step of each mode in turn, the order rotating each phase):
    on a shared machine a slow second then hits every mode's copy of a phase alike, where phase-sized turns
    left the modes' ratios to the machine's drift over a phase (an A/A pair: 0.949-1.034 a phase against
    0.998-1.006, results/bench-interleave-aa.json). Each engine still sees its phases in order, so adaptive
    carries its state across.

    The collector runs outside the clocks (``timing.collect_outside_clocks``): each repeat's engines are built
    after the last repeat's are collected, and frozen before the phases: a generation-2 collection in a mode's
    step took 100-760 ms there, against a high phase of about 2 s."""
    from specswap.bench.runner import EngineRunner, run_interleaved
    from specswap.bench.timing import collect_outside_clocks
    from specswap.cli_flags import build_engine

    batch_size = min(args.max_batch_size, args.concurrency)
    names = list(modes)
    runs: dict[str, list[dict]] = {name: [] for name in names}
    configs: dict[str, dict[str, Any]] = {}  # mode -> the adaptive config its engine ran ("auto" resolved)
    for _ in range(args.repeats):
        runners = {}
        collect_outside_clocks()  # the last repeat's engines
        for name in names:
            settings = modes[name]
            if args.warmup > 0:  # a throwaway engine: warms the kernels without moving this mode's controller
                warm = build_engine(models, max_batch_size=batch_size, max_seq_len=args.max_seq_len, **settings)
                warm_phases = build_workload("transition", 1, args.low_temperature, args.prompt_set)[:2]
                for index in range(args.warmup):
                    phase = warm_phases[index % 2]
                    warm.generate([phase.prompts[0]], max_new_tokens=min(16, args.max_new_tokens),
                                  temperature=phase.temperature, seed=index)
                del warm
            engine = build_engine(models, max_batch_size=batch_size, max_seq_len=args.max_seq_len, **settings)
            controller = getattr(engine, "controller", None)
            if controller is not None:
                configs.setdefault(name, controller.config.to_dict())
            runners[name] = EngineRunner(engine, args.concurrency, args.max_new_tokens, args.seed,
                                         on_request_done=lambda: progress.update(1), ignore_eos=args.ignore_eos,
                                         estimates=getattr(args, "trace_estimates", False))
        collect_outside_clocks()  # this repeat's start-up
        for phase_index, phase in enumerate(phases):
            shift = phase_index % len(names)
            progress.set_description(phase.name)
            run_interleaved(runners[name].phase_steps(phase_index, phase) for name in names[shift:] + names[:shift])
        for name in names:
            runs[name].append(runners[name].run)
    summaries = {}
    for name, settings in modes.items():
        summaries[name] = report.summarize(report.pool_runs(runs[name]))
        summaries[name]["settings"] = {k: v for k, v in settings.items() if v is not None}
        if name in configs:  # what the run read, whether or not the config file stays
            summaries[name]["adaptive_config"] = configs[name]
    return summaries


def run_servers(args, phases, progress) -> dict[str, dict]:
    from specswap.bench.runner import run_server
    summaries = {}
    for index, spec in enumerate(args.server):
        name, _, url = spec.partition("=") if "=" in spec.split("://")[0] else ("", "", spec)
        name = name or ("server" if len(args.server) == 1 else f"server{index}")
        progress.set_description(name)
        run = run_server(url, phases, args.concurrency, args.max_new_tokens, args.seed, api_key=args.api_key,
                         on_request_done=lambda: progress.update(1), ignore_eos=args.ignore_eos)
        summaries[name] = report.summarize(run)
        summaries[name]["settings"] = {"server": url}
    return summaries


def run_bench(args: argparse.Namespace, models=None) -> dict[str, Any]:
    """Run the benchmark described by ``args``; ``models`` (LoadedModels) skips loading (tests, reuse)."""
    import torch

    from specswap.cli_flags import check_speculative_flags, engine_keywords
    from specswap.loading import load_models

    check_speculative_flags(args, adaptive_flag=True)  # the config applies to the adaptive mode
    if args.speculative_eagle_topk != 1 or args.speculative_num_draft_tokens is not None:
        raise ValueError("specswap bench runs draft trees as modes (--modes tree<steps>x<topk>x<num_draft_tokens>, "
                         "e.g. tree3x2x6) and adaptive over trees through the config's candidate_trees; "
                         "--speculative-eagle-topk / --speculative-num-draft-tokens would set no mode")
    for flag in ("requests_per_phase", "concurrency", "max_new_tokens", "repeats"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    if args.threads:
        torch.set_num_threads(args.threads)
    phases = build_workload(args.workload, args.requests_per_phase, args.low_temperature, args.prompt_set)
    requests = sum(phase.num_requests for phase in phases)
    result: dict[str, Any] = {
        **provenance.stamp(),  # "cpu": this process's capability line (with --server: the client's)
        "workload": args.workload,
        "prompt_set": args.prompt_set,
        "phases": [phase.name for phase in phases],
        "settings": {"requests_per_phase": args.requests_per_phase, "concurrency": args.concurrency,
                     "max_new_tokens": args.max_new_tokens, "ignore_eos": args.ignore_eos,
                     "low_temperature": args.low_temperature,
                     "warmup": args.warmup, "repeats": args.repeats, "seed": args.seed,
                     "threads": torch.get_num_threads()},
        # SUFFIX's global tree (and any drafter state across requests): every mode and repeat runs on a new engine
        "drafter_state": "empty at each mode's and repeat's start" if not args.server else "the servers' own",
    }
    start = time.perf_counter()
    if args.server:
        progress = _progress(requests * len(args.server), not args.no_progress)
        with progress:
            result["modes"] = run_servers(args, phases, progress)
        result["model"] = None
    else:
        if models is None:
            models = load_models(args.model, args.draft_model, args.speculative_algorithm,
                                 **engine_keywords(args, "bench", load=True))
        steps, trees = machine_tiers(models, args.speculative_adaptive_config) if args.modes is None else ([], [])
        modes = mode_settings(args.modes, models.speculative_algorithm, steps, args.speculative_num_steps,
                              args.speculative_adaptive_config, trees)
        from specswap.cli_flags import suffix_options
        for settings in modes.values():  # --suffix-decoding-* to every drafting mode (the Engine refuses a misfit)
            if settings.get("speculative_algorithm") is not None:
                settings.update(suffix_options(args))
        result.update(model=models.name, speculative_algorithm=models.speculative_algorithm, dtype=str(models.dtype),
                      weights=models.weights,
                      num_parameters=sum(p.numel() for p in models.target.parameters()))
        progress = _progress(requests * len(modes) * args.repeats, not args.no_progress)
        with progress:
            result["modes"] = run_in_process(models, args, modes, phases, progress)
    result["wall_s"] = time.perf_counter() - start
    result["oracle"] = report.oracle(result["modes"], oracle_candidates(result["modes"]))
    result["ratios"] = report.ratios(result["modes"], result["oracle"])
    result["phase_ratios"] = report.phase_ratios(result["modes"], result["oracle"])
    return result


def run_from_args(args: argparse.Namespace, models=None) -> int:
    from specswap.capability import cpu_capability

    print(cpu_capability().describe(), flush=True)  # before the run: what the dtype and kernel choices saw
    result = run_bench(args, models)
    print(f"workload {result['workload']} ({', '.join(result['phases'])}, {result['prompt_set']} prompts), "
          f"model {result.get('model')}, "
          f"{result.get('speculative_algorithm')}, {result.get('dtype')}, {result['settings']['requests_per_phase']} "
          f"requests/phase, concurrency {result['settings']['concurrency']}, {result['settings']['max_new_tokens']} "
          f"new tokens, {result['settings']['threads']} threads, {result['wall_s']:.1f} s")
    print(report.format_table(result))
    if args.output:
        with open(args.output, "w") as handle:
            json.dump(result, handle, indent=1)
        print(f"wrote {args.output}")
    if args.plot:
        report.plot(result, args.plot)
        print(f"wrote {args.plot}")
    return 0
