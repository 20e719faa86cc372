"""Render results/README.md and README.md's headline table from the committed results/*.json.

    python tools/render_results.py            rewrite results/README.md and README.md's headline block
    python tools/render_results.py --check    rewrite nothing; exit 1 naming each file that is out of date
    python tools/render_results.py --root DIR the repository to render (default: this script's)

results/README.md is written whole: the provenance rules, then one row per JSON (what it measures, the command,
the CPU, the commit and its headline ratios). README.md is only touched between ``<!-- results:begin -->`` and
``<!-- results:end -->``: a few headline ratios, each cell citing its JSON, in the form
tests/test_docs_evidence.py checks (a figure is a value of the cited JSON, a range one field's minimum and
maximum over a group of its rows).

How a JSON is summarised depends on its kind, recognised by its keys: a phased ``specswap bench`` run
(``ratios``), a ``bench/bench_llamacpp.py`` run (rows with ``runtime`` and ``mode``), a
``bench/bench_gemma_forward.py`` run (``forward_ratio_to_one``), a ``bench/bench_qlinear.py`` run
(``ratio_to_one_row``), a ``bench/bench_engine.py`` run (rows with ``config`` and ``ratio``), a training record
(``best`` and ``acceptance`` or ``evals``), an A/B of two commits (``runs`` with ``pair`` and ``commit``); any other JSON gets
the ranges of its ratio-like keys (``ratio``, ``speedup``, ``vs_``, ``_over_``).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
RATIO_KEY = re.compile(r"ratio|speedup|(?:^|_)vs_|_over_")


@dataclass(frozen=True)
class Result:
    name: str     # file name inside results/
    data: dict


def load_results(root: Path) -> list[Result]:
    """Every results/*.json under ``root``, by name; a file that is not a JSON object is an error naming it."""
    found = []
    for path in sorted((root / "results").glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            raise SystemExit(f"{path}: not JSON: {error}")
        if not isinstance(data, dict):
            raise SystemExit(f"{path}: holds a {type(data).__name__}, not a JSON object")
        found.append(Result(path.name, data))
    return found


# ---- provenance, shortened ----------------------------------------------------------------------------------

def cpu_short(data: dict) -> str:
    """'AMD EPYC, AVX-512' from the capability line (``cpu``): the model, the widest vector ISA, AMX, override."""
    line = str(data.get("cpu", "")).removeprefix("cpu: ")
    parts = [part.strip() for part in line.split(";")]
    model = re.sub(r"\((?:R|TM)\)|\b(?:Processor|CPU)\b", "", parts[0])
    model = " ".join(model.split()) or "unknown CPU"
    features = parts[1].split() if len(parts) > 1 else []
    if "avx512" in features:
        isa = "AVX-512"
    elif "avx2" in features:
        isa = "AVX2 only"
    else:
        isa = "no AVX2"
    if "amx yes" in parts:
        isa += ", AMX"
    override = next((part.removeprefix("override:").split("(")[0].strip() for part in parts
                     if part.startswith("override:")), "")
    return f"{model}, {isa}" + (f" (override `{override}`)" if override else "")


def commit_short(data: dict) -> str:
    return re.sub(r"\b([0-9a-f]{7})[0-9a-f]{33}\b", r"\1", str(data.get("commit", "")))


def command_short(data: dict) -> str:
    """The command as written, with a virtual environment's path to ``specswap`` left out."""
    return re.sub(r"^\S*/bin/(specswap)\b", r"\1", str(data.get("command", "")).strip())


def code(text: str) -> str:
    return "`" + text.replace("|", "\\|") + "`" if text else ""


# ---- figures ------------------------------------------------------------------------------------------------

def fixed(value: float, decimals: int = 2) -> str:
    """``value`` with ``decimals`` decimals, rounded half up from its shortest form, as a reader would."""
    return str(Decimal(repr(float(value))).quantize(Decimal(1).scaleb(-decimals), ROUND_HALF_UP))


def x(value: float) -> str:
    return f"{fixed(value)}x"


def span(values: list[float]) -> str:
    """A range 'a-bx' of ratios (one figure when they are all equal once rounded)."""
    low, high = fixed(min(values)), fixed(max(values))
    return f"{low}x" if low == high else f"{low}-{high}x"


def plural(count, word: str) -> str:
    return f"{count} {word}" + ("" if count == 1 else "s")


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# ---- one summary per kind: (what it measures, its headline ratios) -----------------------------------------

def phased(data: dict) -> tuple[str, str]:
    adaptive = data.get("modes", {}).get("adaptive", {}).get("settings", {})
    config = adaptive.get("speculative_adaptive_config")
    what = (f"phased `specswap bench`: {data.get('model')}, {data.get('speculative_algorithm')}, "
            f"{data.get('workload')} workload ({', '.join(data.get('phases', []))}), "
            f"{data.get('weights', data.get('dtype'))} weights, {data.get('prompt_set')} prompts, modes "
            f"{', '.join(data.get('modes', {}))}" + (f"; adaptive on `{config}`" if config else ""))
    ratios = data["ratios"]
    best = (data.get("oracle") or {}).get("best_static", {}).get("mode")
    parts = []
    if "adaptive_vs_baseline" in ratios:
        parts.append(f"adaptive {x(ratios['adaptive_vs_baseline'])} baseline")
    if "adaptive_vs_best_static" in ratios:
        parts.append(f"{x(ratios['adaptive_vs_best_static'])} the best static mode" + (f" ({best})" if best else ""))
    if "adaptive_vs_oracle" in ratios:
        parts.append(f"{x(ratios['adaptive_vs_oracle'])} the oracle")
    modes = data.get("modes", {})
    adaptive_tok_s = modes.get("adaptive", {}).get("overall", {}).get("throughput_tok_s")
    for name, mode in modes.items():  # <mode>@<ALGORITHM>: another drafter beside the run's, against its adaptive
        if "@" in name and adaptive_tok_s:
            parts.append(f"{name} {x(mode['overall']['throughput_tok_s'] / adaptive_tok_s)} adaptive")
    phases = data.get("phase_ratios") or []
    if phases:
        repeats = [r for phase in phases for r in phase["by_repeat"]]
        parts.append("per phase " + " / ".join(fixed(phase["adaptive_vs_oracle"], 3) for phase in phases)
                     + " of the oracle" + (f" (repeat by repeat {fixed(min(repeats), 3)}-{fixed(max(repeats), 3)})"
                                           if len(repeats) > len(phases) else ""))
    return what, ", ".join(parts)


def _mode_groups(rows: list[dict]) -> dict[str, list[dict]]:
    groups: dict[str, list[dict]] = {}
    for row in rows:
        if row.get("runtime", "specswap") == "specswap" and row.get("mode") != "target-only":
            groups.setdefault(row["mode"], []).append(row)
    return groups


def best_static(rows: list[dict], algorithm: str, prefix: str = "static-") -> tuple[str, list[float]] | None:
    """The static tier of ``algorithm`` (``prefix`` "tree-": its static trees) with the highest median ratio to
    target-only, and its ratios."""
    tiers = {mode: [row["vs_target_only"] for row in group if _number(row.get("vs_target_only"))]
             for mode, group in _mode_groups(rows).items() if mode.startswith(f"{algorithm} {prefix}")}
    tiers = {mode: values for mode, values in tiers.items() if values}
    if not tiers:
        return None
    mode = max(sorted(tiers), key=lambda name: statistics.median(tiers[name]))
    return mode, tiers[mode]


def llamacpp(data: dict) -> tuple[str, str]:
    rows = data["results"]
    with_llamacpp = any(row.get("runtime") == "llama.cpp" for row in rows)
    modes = ", ".join(sorted({row["mode"] for row in rows if row.get("runtime") == "specswap"}))
    what = ("specswap against llama.cpp on the same GGUF" if with_llamacpp else "specswap's modes against target-only")
    what += (f": {data.get('model')}, {data.get('weights')} weights, {conditions(data)}, "
             f"{data.get('num_prompts')} {data.get('prompt_set')} prompts x {data.get('new_tokens')} tokens, "
             f"{plural(data.get('repeats'), 'repeat')}; modes {modes}")
    parts = []
    if with_llamacpp:
        plain = [row["vs_llamacpp_plain"] for row in rows
                 if row.get("mode") == "target-only" and _number(row.get("vs_llamacpp_plain"))]
        if plain:
            parts.append(f"target-only {span(plain)} llama.cpp plain")
        best = [row["specswap_over_llamacpp"] for row in data.get("best", [])
                if _number(row.get("specswap_over_llamacpp"))]
        if best:
            parts.append(f"best mode {span(best)} llama.cpp's best")
    groups = _mode_groups(rows)
    for algorithm in sorted({mode.split()[0] for mode in groups}):
        adaptive = [row["vs_target_only"] for row in groups.get(f"{algorithm} adaptive", [])
                    if _number(row.get("vs_target_only"))]
        if adaptive:
            parts.append(f"{algorithm.upper()} adaptive {span(adaptive)} target-only")
        found = best_static(rows, algorithm)
        if found:
            parts.append(f"{algorithm.upper()} {found[0].split()[-1]} (best static) {span(found[1])} target-only")
        trees = best_static(rows, algorithm, prefix="tree-")
        if trees:
            parts.append(f"{algorithm.upper()} {trees[0].split()[-1]} (best tree) {span(trees[1])} target-only")
        with_trees = [row["vs_target_only"] for row in groups.get(f"{algorithm} adaptive+trees", [])
                      if _number(row.get("vs_target_only"))]
        if with_trees:
            parts.append(f"{algorithm.upper()} adaptive over chains and trees {span(with_trees)} target-only")
    return what, "; ".join(parts) + (" (ranges over its rows)" if parts else "")


def conditions(data: dict) -> str:
    """'sets code/repeat/prose, T=0/1, 1/2 threads' of a bench_llamacpp run."""
    threads = data.get("threads", [])
    return (f"sets {'/'.join(data.get('sets', []))}, T={'/'.join(f'{t:g}' for t in data.get('temperatures', []))}, "
            f"{'/'.join(map(str, threads))} thread" + ("" if threads == [1] else "s"))


def forward(data: dict) -> tuple[str, str]:
    rows = data["results"]
    weights = list(dict.fromkeys(row["weights"] for row in rows))
    lengths = sorted({row["tokens"] for row in rows})
    what = (f"Gemma 3 270M forward at T = {', '.join(map(str, lengths))} tokens over T = 1, batch 1, "
            f"{data.get('context')} tokens of context, weights {', '.join(weights)}, {plural(data.get('threads'), 'thread')}, "
            f"median of {data.get('repeats')}")
    parts = []
    for name in weights:
        cells = [f"T={row['tokens']} {x(row['forward_ratio_to_one'])}" for row in rows
                 if row["weights"] == name and row["tokens"] in (4, 8)]
        if cells:
            parts.append(f"{name}: " + ", ".join(cells))
    return what, "; ".join(parts) + " of T=1's time"


def qlinear(data: dict) -> tuple[str, str]:
    rows = data["results"]
    backends = list(dict.fromkeys(row["backend"] for row in rows))
    shapes = list(dict.fromkeys(row["shape"] for row in rows))
    what = (f"one quantized linear per row count (rows {', '.join(map(str, data.get('rows', [])))}), Gemma's "
            f"shapes {', '.join(shapes)}, backends {', '.join(backends)}, {plural(data.get('threads'), 'thread')}")
    parts = []
    for backend in backends:
        eight = [row["ratio_to_one_row"] for row in rows if row["backend"] == backend and row["rows"] == 8]
        if eight:
            parts.append(f"{backend} {span(eight)}")
    return what, "8 rows over 1 row, over the shapes: " + ", ".join(parts)


def engine_rows(data: dict) -> tuple[str, str]:
    rows = data["rows"]
    model = re.search(r"--model\s+(\S+)", str(data.get("command", "")))
    workloads = list(dict.fromkeys(row["workload"] for row in rows))
    what = (f"`bench/bench_engine.py`: {model[1] if model else 'model ?'}, workloads {', '.join(workloads)}, "
            f"batch {'/'.join(str(b) for b in dict.fromkeys(row.get('batch_size') for row in rows))}, "
            f"{data.get('prompt_set')} prompts")
    parts = []
    temperatures = len({row.get("temperature") for row in rows}) > 1  # --temperatures: each workload at several

    def label(row: dict) -> str:
        return f"{row['workload']} T={fixed(row['temperature'], 0)}" if temperatures else row["workload"]

    for config in dict.fromkeys(row["config"] for row in rows):
        if config == "no-spec":
            continue
        cells = [f"{label(row)} {x(row['ratio'])}" for row in rows
                 if row["config"] == config and _number(row.get("ratio"))]
        parts.append(f"{config}: {', '.join(cells)}")
    return what, "; ".join(parts) + " (x no speculation)"


def training(data: dict) -> tuple[str, str]:
    best = data["best"]
    steps = sorted(key for key in best if re.fullmatch(r"step\d+", key))
    what = str(data.get("kind") or f"training record of {data.get('model')}")
    headline = f"held-out top-1 {' / '.join(str(best[key]) for key in steps)} at draft steps 1-{len(steps)}"
    code_k1 = data.get("acceptance", {}).get("code", {}).get("k=1", {}).get("accepted_per_verify")
    if code_k1 is not None:
        headline += f"; {code_k1} drafts accepted per verify on code at k=1"
    return what, headline + " (no ratios)"


def ab_runs(data: dict) -> tuple[str, str]:
    runs = data["runs"]
    parts = []
    for model in dict.fromkeys(run["model"] for run in runs):
        pairs: dict[int, list[dict]] = {}
        for run in runs:
            if run["model"] == model:
                pairs.setdefault(run["pair"], []).append(run)
        complete = [pair for pair in pairs.values() if len(pair) == 2]
        for config in dict.fromkeys(key for run in runs if run["model"] == model for key in run["tokens_per_second"]):
            ratios = [later["tokens_per_second"][config] / earlier["tokens_per_second"][config]
                      for earlier, later in complete]
            if ratios:
                parts.append(f"{model} {config} {x(statistics.median(ratios))}")
    first = runs[0]["commit"] if runs else "?"
    return str(data.get("what", "")), f"second commit over {first}, median of pairs: " + ", ".join(parts)


def serving(data: dict) -> tuple[str, str]:
    latency = data.get("latency_s") or {}
    what = (f"`specswap serve` under load: {data.get('clients')} clients for {data.get('minutes')} min "
            f"(`{data.get('server_command', '')}`)")
    rss = data.get("server_rss_mib") or {}
    headline = (f"503 rate {fixed(data['rate_503'], 3)}, 5xx {data.get('server_errors_5xx')}, latency p50 / p95 / "
                f"p99 {fixed(latency.get('p50', 0))} / {fixed(latency.get('p95', 0))} / {fixed(latency.get('p99', 0))} "
                f"s, exit {data.get('exit_code')}")
    if _number(rss.get("before")) and _number(rss.get("after")):
        headline += f", server RSS {fixed(rss['before'], 1)} -> {fixed(rss['after'], 1)} MiB"
    return what, headline


def state_pool(data: dict) -> tuple[str, str]:
    parts = [f"{row['name']} {fixed(row['ns_per_iteration'], 1)} ns" for row in data.get("python", [])]
    parts += [f"C++ {row['name']} {fixed(row['ns_per_iteration'], 2)} ns" for row in data.get("cpp", [])
              if row["name"].startswith(("BM_Acquire", "BM_Activate"))]
    return "the state pool on the decode path: acquire, acquire and read the round, a switch (Python and C++)", \
        "; ".join(parts)


def checkouts(data: dict) -> tuple[str, str]:
    rows = data["rows"]
    sides = []
    for side in ("a", "b"):
        env = " ".join(f"{key}={value}" for key, value in (data.get(f"{side}_env") or {}).items())
        sides.append(f"{side.upper()} {data.get(f'{side}_commit', data.get(side))}" + (f" with {env}" if env else ""))
    what = (f"two checkouts side by side (`bench/bench_ab.py`, B over A, medians of {data.get('repeats')} "
            f"alternating runs): {', '.join(sides)}")
    parts = [f"{row['config']} {x(row['b_over_a'])}" for row in rows]
    parts += [f"forward T={row['tokens']} {x(row['b_over_a'])} the time" for row in data.get("forward", [])]
    return what, ", ".join(parts)


def agreement(data: dict) -> tuple[str, str]:
    what = (f"the distributed tier agreement per step: {data.get('world')} ranks over {data.get('backend')}, "
            f"{data.get('steps')} steps, a {data.get('vector_bytes')}-byte vector all-gathered")
    cost, bare = data["agreement"], data.get("bare_all_gather", {})
    parts = [f"median {fixed(cost['median_us'], 0)} us, p99 {fixed(cost['p99_us'], 0)} us"]
    if bare:
        parts.append(f"a bare all-gather of it: median {fixed(bare['median_us'], 0)} us")
    for link in data.get("links", [])[1:]:  # bench_agreement.py --veth: the first is the loopback above
        name = f"{link['link']}" + (f" +{link['delay_ms']} ms" if link.get("delay_ms") else "")
        parts.append(f"{name}: " + (f"median {fixed(link['agreement']['median_us'], 0)} us" if "agreement" in link
                                    else "not measured (no netem)" if "netem" in link.get("error", "")
                                    else "not measured"))
    return what, "; ".join(parts)


def tensor_parallel(data: dict) -> tuple[str, str]:
    one = data["one_process"]
    if "tensor_parallel_runs" in data:  # several draft placements, one after the other in one run
        runs = data["tensor_parallel_runs"]
        what = (f"{data.get('model')} at TP={runs[0].get('tp_size')} (1 thread a rank) by draft placement "
                f"(`tp_draft`) against one process at {one.get('threads')} threads: {data.get('weights')} weights, "
                f"{data.get('algorithm')} {data.get('steps')} steps, {data.get('prompts')} prompts x "
                f"{data.get('new_tokens')} tokens, batch {data.get('batch')}")
        parts = [f"{run['tp_draft']} {fixed(run['tokens_per_second'], 1)} tok/s ({x(run['speedup'])} one process)"
                 for run in runs]
        return what, (f"one process {fixed(one['tokens_per_second'], 1)} tok/s; " + "; ".join(parts) +
                      f"; tokens identical: {data.get('tokens_identical')}")
    tp = data["tensor_parallel"]
    what = (f"{data.get('model')} at TP={tp.get('tp_size')} ({tp.get('threads_per_rank')} thread a rank) against one "
            f"process at {one.get('threads')} threads: {data.get('weights')} weights, {data.get('algorithm')}, "
            f"{data.get('prompts')} prompts x {data.get('new_tokens')} tokens, batch {data.get('batch')}")
    return what, (f"TP {x(data['speedup'])} one process ({fixed(tp['tokens_per_second'], 1)} against "
                  f"{fixed(one['tokens_per_second'], 1)} tok/s); tokens identical: {data.get('tokens_identical')}")


def generic(data: dict) -> tuple[str, str]:
    """Top-level ratio-like numbers as they are, ratio-like keys of row lists as ranges."""
    parts = []
    for key, value in data.items():
        if _number(value) and RATIO_KEY.search(key):
            parts.append(f"{key} {x(value)}")
        elif isinstance(value, dict):
            parts += [f"{key}.{name} {x(inner)}" for name, inner in value.items()
                      if _number(inner) and RATIO_KEY.search(name)]
        elif isinstance(value, list) and value and all(isinstance(row, dict) for row in value):
            for name in dict.fromkeys(name for row in value for name in row):
                numbers = [row[name] for row in value if _number(row.get(name))]
                if numbers and RATIO_KEY.search(name):
                    parts.append(f"{key}[].{name} {span(numbers)}")
    return str(data.get("what", "")), "; ".join(parts)


def _rows(data: dict, key: str) -> list[dict]:
    value = data.get(key)
    return value if isinstance(value, list) and all(isinstance(row, dict) for row in value) else []


def kind(data: dict) -> str:
    results, rows, runs = _rows(data, "results"), _rows(data, "rows"), _rows(data, "runs")
    if isinstance(data.get("ratios"), dict) and isinstance(data.get("modes"), dict):
        return "phased"
    if results and all("runtime" in row and "mode" in row for row in results):
        return "llamacpp"
    if results and all("forward_ratio_to_one" in row for row in results):
        return "forward"
    if results and all("ratio_to_one_row" in row for row in results):
        return "qlinear"
    if rows and all("config" in row and "workload" in row for row in rows):
        return "engine"
    if isinstance(data.get("best"), dict) and (isinstance(data.get("acceptance"), dict)
                                               or isinstance(data.get("evals"), list)):
        return "training"
    if runs and all({"pair", "commit", "tokens_per_second", "model"} <= set(row) for row in runs):
        return "ab"
    if rows and all({"config", "b_over_a"} <= set(row) for row in rows):
        return "checkouts"
    if isinstance(data.get("latency_s"), dict) and "rate_503" in data:
        return "serving"
    if isinstance(data.get("python"), list) and all("ns_per_iteration" in row for row in data["python"]):
        return "state_pool"
    if isinstance(data.get("agreement"), dict) and "median_us" in data["agreement"]:
        return "agreement"
    if isinstance(data.get("one_process"), dict) and (isinstance(data.get("tensor_parallel"), dict)
                                                      or _rows(data, "tensor_parallel_runs")):
        return "tensor_parallel"
    return "generic"


SUMMARIES = {"phased": phased, "llamacpp": llamacpp, "forward": forward, "qlinear": qlinear,
             "engine": engine_rows, "training": training, "ab": ab_runs, "checkouts": checkouts, "serving": serving,
             "state_pool": state_pool, "agreement": agreement, "tensor_parallel": tensor_parallel, "generic": generic}


def summary(result: Result) -> tuple[str, str]:
    return SUMMARIES[kind(result.data)](result.data)


# ---- the two outputs ----------------------------------------------------------------------------------------

PROVENANCE = """\
# Committed benchmark results

Generated by `python tools/render_results.py` from the JSONs in this folder: do not edit it by hand; rerun the
script after adding or changing a JSON (`--check`, which `tests/test_results_summary.py` runs, fails while this
file or README.md's headline table is out of date).

Every figure in README.md and docs/ cites a JSON in this folder (or a `training_record.json` shipped in
`python/specswap/zoo/weights/`). Each JSON here carries, at its top level:

- `command`: the command line that wrote it;
- `cpu`: the CPU it ran on (the capability line, docs/engine.md, "CPU capability");
- `commit`: the git commit it measured (`-dirty` when tracked files differed from it).

`specswap bench --output` and the `bench/` scripts' `--json` write these keys themselves
(`specswap.bench.provenance`); a JSON from any other script must add them. Published figures are measured on
the `report` prompt set (docs/bench.md, "Prompt sets"). `tests/test_docs_evidence.py` checks that every
`results/` path named in README.md and docs/*.md exists, parses and carries the three keys, that every JSON
here carries them, that no doc cites the untracked `runs` folder, and that every figure quoted next to a
citation is in the cited JSON, rounded as written (the rule is in its docstring).

Ratios are measured side by side in one run; absolute tok/s and ms move between runs on a shared machine.
A range is the minimum and the maximum over the JSON's rows.
"""


def render_summary(results: list[Result]) -> str:
    lines = [PROVENANCE, "| JSON | what it measures | command | CPU | commit | headline |",
             "|---|---|---|---|---|---|"]
    for result in results:
        what, headline = summary(result)
        cells = [f"[{result.name}]({result.name})", what, code(command_short(result.data)),
                 cpu_short(result.data), code(commit_short(result.data)), headline]
        lines.append("| " + " | ".join(cell.replace("\n", " ") for cell in cells) + " |")
    return "\n".join(lines) + "\n"


def _cite(result: Result) -> str:
    return f"([{result.name}](results/{result.name}))"


def render_headline(results: list[Result]) -> str:
    """README's block: adaptive from the main-job runs, specswap against llama.cpp, EAGLE's best static tier on
    code from the runs made for it (greedy code only, no capability override)."""
    rows = []
    for result in results:
        data = result.data
        if kind(data) == "phased" and data.get("workload") == "transition":
            ratios = data["ratios"]
            keys = ("adaptive_vs_baseline", "adaptive_vs_best_static", "adaptive_vs_oracle")
            if all(key in ratios for key in keys):
                config = data.get("modes", {}).get("adaptive", {}).get("settings", {}).get(
                    "speculative_adaptive_config")
                # "variant": a run of code that did not stay (named by its commit), not what runs now
                policy = data.get("variant") or (f"`{Path(config).name}`" if config else "the default policy")
                threads = data.get("settings", {}).get("threads")
                rows.append((0, f"transition workload ({data.get('speculative_algorithm')}, {policy}"
                                + (f", {threads} thread{'s' if threads != 1 else ''}" if threads else "")
                                + "): adaptive over baseline / the best static tier / the oracle", cpu_short(data),
                             " / ".join(x(ratios[key]) for key in keys) + " " + _cite(result)))
    for result in results:
        data = result.data
        if kind(data) != "llamacpp":
            continue
        table = data["results"]
        plain = [row["vs_llamacpp_plain"] for row in table
                 if row.get("mode") == "target-only" and _number(row.get("vs_llamacpp_plain"))]
        best = [row["specswap_over_llamacpp"] for row in data.get("best", [])
                if _number(row.get("specswap_over_llamacpp"))]
        if plain and best:
            rows.append((1, "specswap over llama.cpp, same GGUF, batch 1: target-only over plain / best mode over "
                            f"llama.cpp's best ({conditions(data)})", cpu_short(data),
                         f"{span(plain)} / {span(best)} {_cite(result)}"))
        greedy_code = table and all(row.get("set") == "code" and row.get("temperature") == 0 for row in table)
        overridden = "override:" in str(data.get("cpu", ""))
        if greedy_code and not overridden:
            cells = []
            for threads in sorted({row["threads"] for row in table}):
                found = best_static([row for row in table if row["threads"] == threads], "eagle")
                if found:
                    cells.append(f"{x(max(found[1]))} ({found[0].split()[-1]}, {plural(threads, 'thread')})")
            if cells:
                rows.append((2, "EAGLE's best static tier over target-only, greedy code", cpu_short(data),
                             ", ".join(cells) + " " + _cite(result)))
    rows.sort(key=lambda row: row[0])
    lines = [BEGIN,
             "<!-- generated by `python tools/render_results.py` from results/*.json: edit the script, not this -->",
             "",
             "Gemma 3 270M with native weights, ratios measured side by side in one run:",
             "",
             "| what | CPU | ratio |", "|---|---|---|"]
    lines += [f"| {what} | {cpu} | {cell} |" for _, what, cpu, cell in rows]
    lines += ["", "Every other committed run, with its command, CPU and commit: [results/README.md](results/README.md).",
              END]
    return "\n".join(lines)


def render_readme(readme: str, block: str, path: Path) -> str:
    start, end = readme.find(BEGIN), readme.find(END)
    if start < 0 or end < start:
        raise SystemExit(f"{path}: no {BEGIN} ... {END} block to render the headline table into")
    return readme[:start] + block + readme[end + len(END):]


def outputs(root: Path) -> dict[Path, str]:
    """What results/README.md and README.md should hold, rendered from ``root``'s results/*.json."""
    results = load_results(root)
    readme = root / "README.md"
    return {root / "results" / "README.md": render_summary(results),
            readme: render_readme(readme.read_text(), render_headline(results), readme)}


def stale(root: Path) -> list[Path]:
    """The rendered files under ``root`` whose text differs from what the JSONs give."""
    return [path for path, text in outputs(root).items() if not path.is_file() or path.read_text() != text]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a rendered file is stale")
    parser.add_argument("--root", type=Path, default=REPOSITORY, help="the repository (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.check:
        out_of_date = stale(args.root)
        for path in out_of_date:
            print(f"{path.relative_to(args.root)} is out of date: run python tools/render_results.py", file=sys.stderr)
        return 1 if out_of_date else 0
    for path, text in outputs(args.root).items():
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)
            print(f"wrote {path.relative_to(args.root)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
