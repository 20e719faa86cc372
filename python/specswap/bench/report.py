"""Turn recorded runs into per-phase and overall figures, the oracle, a terminal table, JSON and a plot.

Everything but ``plot`` is a pure function of the recorded runs (see runner.py for their shape).
"""

from __future__ import annotations

import statistics
from typing import Any


def _figures(requests: list[dict], seconds: float) -> dict[str, Any]:
    tokens = sum(r["tokens"] for r in requests)
    rounds = sum(r["verify_rounds"] for r in requests)
    accepted = sum(r["accepted_draft_tokens"] for r in requests)
    return {
        "requests": len(requests),
        "tokens": tokens,
        "seconds": seconds,
        "throughput_tok_s": tokens / seconds if seconds > 0 else 0.0,
        "latency_s": sum(r["latency_s"] for r in requests) / len(requests) if requests else 0.0,
        # tokens per verify, bonus included: 1.0 without speculation
        "accept_length": (accepted + rounds) / rounds if rounds else 1.0,
    }


def _phase_seconds(phase: dict[str, Any]) -> float:
    return phase.get("seconds", phase["end_s"] - phase["start_s"])


def pool_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Several runs of the same mode as one: each phase's requests pooled and its durations summed (so its
    throughput is all tokens over all time), each run's own throughput kept (``repeat_throughput_tok_s``); the
    trace is the first run's."""
    if len(runs) == 1:
        return runs[0]
    phases = []
    for index, phase in enumerate(runs[0]["phases"]):
        same = [run["phases"][index] for run in runs]
        each = [_figures(p["requests"], _phase_seconds(p)) for p in same]
        phases.append({**phase, "seconds": sum(_phase_seconds(p) for p in same),
                       "requests": [r for p in same for r in p["requests"]],
                       "repeat_throughput_tok_s": [figures["throughput_tok_s"] for figures in each],
                       "repeat_tokens": [figures["tokens"] for figures in each]})
    pooled = {"phases": phases, "trace": runs[0]["trace"], "repeats": len(runs)}
    if any("estimates" in run for run in runs):
        pooled["estimates_by_repeat"] = [run.get("estimates", []) for run in runs]
    return pooled


def summarize(run: dict[str, Any]) -> dict[str, Any]:
    """Per phase and overall throughput (tokens / wall time), mean latency and accept length, plus the tier trace
    and how many rounds each tier ran."""
    phases = []
    for phase in run["phases"]:
        figures = _figures(phase["requests"], _phase_seconds(phase))
        phases.append({"name": phase["name"], **figures,
                       "repeat_throughput_tok_s": phase.get("repeat_throughput_tok_s", [figures["throughput_tok_s"]]),
                       "repeat_tokens": phase.get("repeat_tokens", [figures["tokens"]])})
    all_requests = [r for phase in run["phases"] for r in phase["requests"]]
    overall = _figures(all_requests, sum(p["seconds"] for p in phases))
    rounds_per_tier: dict[str, int] = {}
    for _, tier, _, _ in run["trace"]:
        rounds_per_tier[str(tier)] = rounds_per_tier.get(str(tier), 0) + 1
    switches = sum(1 for a, b in zip(run["trace"], run["trace"][1:]) if a[1] != b[1])
    summary = {"overall": overall, "phases": phases, "rounds_per_tier": rounds_per_tier, "tier_switches": switches,
               "phase_starts_s": [phase["start_s"] for phase in run["phases"]], "trace": run["trace"]}
    if "estimates" in run or "estimates_by_repeat" in run:  # --trace-estimates
        summary["estimates_by_repeat"] = run.get("estimates_by_repeat", [run.get("estimates", [])])
    return summary


def oracle(modes: dict[str, dict[str, Any]], candidates: list[str] | None = None) -> dict[str, Any] | None:
    """The best static mode in each phase (highest throughput), and the throughput of switching perfectly
    between them at no cost: the oracle's tokens over its time, summed over phases.

    ``modes`` maps a mode name to its summary (``phases[i].{name, tokens, seconds, throughput_tok_s}``);
    ``candidates`` are the static modes to choose from (default: every name starting with "static").
    Returns None when there is no candidate."""
    names = candidates if candidates is not None else [name for name in modes if name.startswith("static")]
    names = [name for name in names if name in modes]
    if not names:
        return None
    num_phases = len(modes[names[0]]["phases"])
    phases, tokens, seconds = [], 0.0, 0.0
    for index in range(num_phases):
        best = max(names, key=lambda name: modes[name]["phases"][index]["throughput_tok_s"])
        phase = modes[best]["phases"][index]
        phases.append({"name": phase["name"], "mode": best, "throughput_tok_s": phase["throughput_tok_s"]})
        tokens += phase["tokens"]
        seconds += phase["seconds"]
    result = {"candidates": names, "phases": phases,
              "overall": {"throughput_tok_s": tokens / seconds if seconds > 0 else 0.0}}
    best_static = max(names, key=lambda name: modes[name]["overall"]["throughput_tok_s"])
    result["best_static"] = {"mode": best_static,
                             "throughput_tok_s": modes[best_static]["overall"]["throughput_tok_s"]}
    return result


def ratios(modes: dict[str, dict[str, Any]], oracle_result: dict[str, Any] | None) -> dict[str, float]:
    """Adaptive against the references measured in the same run."""
    out = {}
    adaptive = modes.get("adaptive", {}).get("overall", {}).get("throughput_tok_s")
    if adaptive is None:
        return out
    if "baseline" in modes and modes["baseline"]["overall"]["throughput_tok_s"]:
        out["adaptive_vs_baseline"] = adaptive / modes["baseline"]["overall"]["throughput_tok_s"]
    if oracle_result is not None:
        if oracle_result["best_static"]["throughput_tok_s"]:
            out["adaptive_vs_best_static"] = adaptive / oracle_result["best_static"]["throughput_tok_s"]
        if oracle_result["overall"]["throughput_tok_s"]:
            out["adaptive_vs_oracle"] = adaptive / oracle_result["overall"]["throughput_tok_s"]
        by_repeat = oracle_by_repeat(modes, oracle_result)
        if by_repeat:
            out["adaptive_vs_oracle_median"] = statistics.median(by_repeat)
    return out


def _repeat_overall(phases: list[dict[str, Any]]) -> list[float]:
    """Per repeat: its tokens over its seconds across ``phases`` (each phase's repeat tokens over its throughput)."""
    out = []
    for repeat in range(min(len(p["repeat_tokens"]) for p in phases)):
        tokens = sum(p["repeat_tokens"][repeat] for p in phases)
        seconds = sum(p["repeat_tokens"][repeat] / p["repeat_throughput_tok_s"][repeat] for p in phases)
        out.append(tokens / seconds if seconds > 0 else 0.0)
    return out


def oracle_by_repeat(modes: dict[str, dict[str, Any]], oracle_result: dict[str, Any] | None) -> list[float]:
    """Adaptive over the oracle overall, repeat by repeat (the oracle: each phase at its mode's same repeat);
    [] without adaptive, an oracle or per-repeat figures (JSONs from before they were kept)."""
    adaptive = modes.get("adaptive")
    if adaptive is None or oracle_result is None:
        return []
    theirs = [modes[best["mode"]]["phases"][index] for index, best in enumerate(oracle_result["phases"])]
    phases = adaptive["phases"] + theirs
    if not all("repeat_tokens" in p and all(p["repeat_throughput_tok_s"]) for p in phases):
        return []
    return [a / b if b else 0.0 for a, b in zip(_repeat_overall(adaptive["phases"]), _repeat_overall(theirs))]


def phase_ratios(modes: dict[str, dict[str, Any]], oracle_result: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Adaptive over the oracle's mode in each phase: pooled over the repeats, and repeat by repeat (each repeat
    ran every mode side by side, so its ratio is one more measurement; their spread is the run's noise)."""
    adaptive = modes.get("adaptive")
    if adaptive is None or oracle_result is None:
        return []
    out = []
    for index, best in enumerate(oracle_result["phases"]):
        ours, theirs = adaptive["phases"][index], modes[best["mode"]]["phases"][index]
        pooled = ours["throughput_tok_s"] / theirs["throughput_tok_s"] if theirs["throughput_tok_s"] else 0.0
        by_repeat = [a / b if b else 0.0 for a, b in zip(ours["repeat_throughput_tok_s"],
                                                         theirs["repeat_throughput_tok_s"])]
        out.append({"name": best["name"], "mode": best["mode"], "adaptive_vs_oracle": pooled,
                    "by_repeat": by_repeat, "median": statistics.median(by_repeat) if by_repeat else pooled})
    return out


def tier_string(trace: list, width: int = 40) -> str:
    """The tier over time as one character per time slice (the most frequent tier in the slice)."""
    if not trace:
        return ""
    end = trace[-1][0] or 1.0
    slices: list[dict[int, int]] = [{} for _ in range(width)]
    for t, tier, _, _ in trace:
        index = min(width - 1, int(t / end * width))
        slices[index][tier] = slices[index].get(tier, 0) + 1
    chars = []
    for counts in slices:
        if not counts:
            chars.append(chars[-1] if chars else " ")
        else:
            tier = max(counts, key=counts.get)
            chars.append(str(tier) if tier < 10 else "+")
    return "".join(chars)


def format_table(result: dict[str, Any]) -> str:
    """A readable table: per mode, overall and per-phase throughput, latency, accept length, tier trace."""
    modes = result["modes"]
    phase_names = [p["name"] for p in next(iter(modes.values()))["phases"]] if modes else []
    header = ["mode", "tok/s", "latency s", "accept"] + [f"{i}:{name} tok/s" for i, name in enumerate(phase_names)]
    rows = []
    for name, summary in modes.items():
        overall = summary["overall"]
        rows.append([name, f"{overall['throughput_tok_s']:.1f}", f"{overall['latency_s']:.2f}",
                     f"{overall['accept_length']:.2f}"]
                    + [f"{p['throughput_tok_s']:.1f} ({p['accept_length']:.2f})" for p in summary["phases"]])
    best = result.get("oracle")
    if best is not None:
        rows.append(["oracle", f"{best['overall']['throughput_tok_s']:.1f}", "", ""]
                    + [f"{p['throughput_tok_s']:.1f} {p['mode']}" for p in best["phases"]])
    widths = [max(len(str(row[i])) for row in [header] + rows) for i in range(len(header))]
    lines = ["  ".join(str(cell).rjust(width) if i else str(cell).ljust(width)
                       for i, (cell, width) in enumerate(zip(row, widths))) for row in [header] + rows]
    lines.append("per phase: throughput (accept length = tokens per verify, bonus included)")
    lines.append("tier over time (one character per 1/40 of each mode's run):")
    label = max([10, *map(len, modes)])
    for name, summary in modes.items():
        lines.append(f"  {name:<{label}} {tier_string(summary['trace'])}")
    for key, value in result.get("ratios", {}).items():
        lines.append(f"{key}: {value:.3f}x")
    if result.get("phase_ratios"):
        cells = []
        for index, phase in enumerate(result["phase_ratios"]):
            spread = phase["by_repeat"]
            cells.append(f"{index}:{phase['name']} {phase['adaptive_vs_oracle']:.3f}x"
                         + (f" (median {phase['median']:.3f}, {min(spread):.3f}-{max(spread):.3f} over "
                            f"{len(spread)} repeats)" if len(spread) > 1 else ""))
        lines.append("adaptive_vs_oracle per phase: " + ", ".join(cells))
    return "\n".join(lines)


def plot(result: dict[str, Any], path: str) -> None:
    """One panel per mode: the tier over time (steps) and throughput over time (tokens per time bin), with the
    phase boundaries dotted."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = result["modes"]
    tiers = sorted({row[1] for summary in modes.values() for row in summary["trace"]}) or [0]
    figure, axes = plt.subplots(len(modes), 1, figsize=(10, 2.2 * len(modes) + 0.6), squeeze=False)
    for axis, (name, summary) in zip(axes[:, 0], modes.items()):
        trace = summary["trace"]
        if trace:
            times = [row[0] for row in trace]
            axis.step(times, [row[1] for row in trace], where="post", color="tab:blue", label="tier (draft steps)")
            end = times[-1] or 1.0
            bins = 40
            width = end / bins
            tokens = [0.0] * bins
            for t, _, step_tokens, _ in trace:
                tokens[min(bins - 1, int(t / width))] += step_tokens
            twin = axis.twinx()
            twin.plot([(i + 0.5) * width for i in range(bins)], [n / width for n in tokens], color="tab:orange",
                      label="throughput")
            twin.set_ylabel("tok/s", color="tab:orange")
        for boundary in summary.get("phase_starts_s", [])[1:]:
            axis.axvline(boundary, color="grey", linestyle=":")
        axis.set_ylabel("tier", color="tab:blue")
        axis.set_yticks(tiers)
        axis.set_ylim(min(tiers) - 0.5, max(tiers) + 0.5)
        axis.set_title(f"{name}: {summary['overall']['throughput_tok_s']:.1f} tok/s overall", fontsize=9)
    axes[-1, 0].set_xlabel("seconds")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
