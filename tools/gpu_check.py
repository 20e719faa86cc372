"""The Python half of tools/gpu_check.sh: runs every check, measures, and writes the one JSON report.

    python tools/gpu_check.py run --device cuda --report gpu_check.json [--checks graphs engine sampling measure]
                                  [--budget-s 420] [--build-rc 0 --build-seconds 80 --build-log build.log]
    python tools/gpu_check.py measure --device cpu --shape small --steps 1 --batch 1 --rounds 4 --json part.json

``run`` runs each check in its own process (a crash or a hung device fails that check, not the report):
the device tests (pytest with ``SPECSWAP_TEST_DEVICE``, tests/conftest.py) and ``measure``. ``measure`` reports
the memory each tier adds (the shipped tiny pair, every tier 1-7 captured) and times decode rounds replayed from
graphs against eager ones (the engine's ``disable_graphs``, SGLang's ``--disable-cuda-graph``) on a target of
Gemma 3 270M's shapes with random weights (the real weights are too large to travel with a GPU call) and the
shipped Gemma EAGLE head. The report says which checks passed; ``run`` exits 1 if any check failed, 2 on bad
arguments. A check that skipped a test counts as failed: on the GPU, a test that did not run proves nothing.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = "specswap-gpu-check/1"
LOG_TAIL_CHARS = 4000

# name -> (pytest arguments, seconds it may take at most). The tests are the CPU suite's own, run on the device.
PYTEST_CHECKS: dict[str, tuple[list[str], int]] = {
    # every stage of every tier in every bucket (padded ones too), the EAGLE head, round graphs, the engine with
    # a tier switch every round and no capture after start-up
    "graphs": (["tests/graphs/test_device_graphs.py", "tests/graphs/test_worker_graphs.py"], 180),
    # the shipped tiny pair in fp32: greedy output identical to target-only at every tier and under switching
    "engine": (["tests/engine/test_tiny_pair.py", "-k", "every_tier or adaptive_switching"], 180),
    # sampled continuations follow the target's law (chi-square against the exact law), biased verifiers fail
    "sampling": (["tests/worker/test_worker.py", "-k", "sampled_continuations"], 150),
}
MEASURE_SECONDS = 150
CHECKS = (*PYTEST_CHECKS, "measure")

# Gemma 3 270M (google/gemma-3-270m config.json); weights random
GEMMA_3_270M_SHAPE = {
    "vocab_size": 262144, "hidden_size": 640, "intermediate_size": 2048, "num_hidden_layers": 18,
    "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256, "sliding_window": 512,
    "query_pre_attn_scalar": 256, "rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0,
    "rms_norm_eps": 1e-6, "max_position_embeddings": 32768, "model_type": "gemma3_text",
}
# the same architecture, small enough for a CPU test of this script
SMALL_GEMMA_SHAPE = {**GEMMA_3_270M_SHAPE, "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128,
                     "num_hidden_layers": 2, "num_attention_heads": 2, "head_dim": 32, "sliding_window": 32,
                     "query_pre_attn_scalar": 32}
SHAPES = {"gemma-3-270m": GEMMA_3_270M_SHAPE, "small": SMALL_GEMMA_SHAPE}


# ---- the report ----------------------------------------------------------------------------------------------

def environment(device: str) -> dict[str, Any]:
    """What ran the check: Python, torch, the accelerator, the CPU, the driver."""
    env: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform(),
                           "cpu": cpu_line(), "requested_device": device}
    try:
        import torch

        env["torch"] = torch.__version__
        env["torch_cuda"] = torch.version.cuda
        env["cuda_available"] = torch.cuda.is_available()
        if torch.cuda.is_available():
            # the GPU the checks run on: cuda:N's, or the current one for an index-less cuda (and for cpu)
            index = checked_gpu_index(device)
            env["gpu_index"] = index
            env["gpu"] = torch.cuda.get_device_name(index)
            env["gpu_capability"] = ".".join(map(str, torch.cuda.get_device_capability(index)))
            env["gpu_memory_bytes"] = torch.cuda.get_device_properties(index).total_memory
            env["gpu_count"] = torch.cuda.device_count()
    except Exception as error:  # the report must still be written when torch itself is broken
        env["torch_error"] = repr(error)
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        if smi.returncode == 0:
            env["nvidia_smi"] = smi.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return env


def checked_gpu_index(device: str) -> int:
    """The CUDA device index `device` names: N for cuda:N, else the current device (what cuda resolves to)."""
    import torch

    parsed = torch.device(device)
    if parsed.type == "cuda" and parsed.index is not None:
        return parsed.index
    return torch.cuda.current_device()


def cpu_line() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} logical CPUs"
    except OSError:
        pass
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} logical CPUs"


def write_report(path: Path, report: dict[str, Any]) -> None:
    """Write atomically: a reader never sees half a report."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(json.dumps(report, indent=2, sort_keys=False) + "\n")
    partial.replace(path)


def junit_summary(path: Path) -> dict[str, Any]:
    """Counts and failing test names from a pytest JUnit XML file (empty if pytest wrote none)."""
    if not path.is_file():
        return {}
    root = ElementTree.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    counts = {key: sum(int(s.get(key, 0)) for s in suites) for key in ("tests", "failures", "errors", "skipped")}
    problems = []
    for case in root.iter("testcase"):
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                message = (child.get("message") or child.text or "").strip().splitlines()
                problems.append({"test": f"{case.get('classname')}::{case.get('name')}", "kind": child.tag,
                                 "message": message[0][:300] if message else ""})
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    return {**counts, "problems": problems[:30]}


def run_command(name: str, command: list[str], timeout: float, env: dict[str, str], log) -> dict[str, Any]:
    """Run one check; its output goes to the log, its tail into the result."""
    start = time.perf_counter()
    log.write(f"\n===== {name}: {shlex.join(command)} (at most {timeout:.0f} s)\n")
    log.flush()
    try:
        completed = subprocess.run(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True, timeout=timeout, errors="replace")
        output, returncode, timed_out = completed.stdout, completed.returncode, False
    except subprocess.TimeoutExpired as expired:
        output = expired.stdout if isinstance(expired.stdout, str) else (expired.stdout or b"").decode(errors="replace")
        returncode, timed_out = None, True
    except OSError as error:
        output, returncode, timed_out = f"could not start: {error}", None, False
    log.write(output)
    log.flush()
    seconds = time.perf_counter() - start
    result = {"name": name, "command": shlex.join(command), "returncode": returncode, "seconds": round(seconds, 2),
              "ok": returncode == 0 and not timed_out, "log_tail": output[-LOG_TAIL_CHARS:]}
    if timed_out:
        result["error"] = f"timed out after {timeout:.0f} s"
    elif returncode != 0:
        result["error"] = f"exit status {returncode}"
    return result


def run_checks(args: argparse.Namespace) -> int:
    started = time.time()
    deadline = time.perf_counter() + args.budget_s
    report: dict[str, Any] = {
        "schema": SCHEMA, "ok": False, "command": args.command or shlex.join([sys.executable, *sys.argv]),
        "commit": args.commit, "device": args.device, "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "budget_s": args.budget_s, "environment": environment(args.device), "checks": [],
    }
    if args.build_rc is not None:
        build = {"name": "build", "ok": args.build_rc == 0, "returncode": args.build_rc,
                 "seconds": args.build_seconds, "command": args.build_command or ""}
        if args.build_log and Path(args.build_log).is_file():
            build["log_tail"] = Path(args.build_log).read_text(errors="replace")[-LOG_TAIL_CHARS:]
        if args.build_rc != 0:
            build["error"] = f"exit status {args.build_rc}"
        report["checks"].append(build)
    env = {**os.environ, "SPECSWAP_TEST_DEVICE": args.device, "PYTHONUNBUFFERED": "1"}
    if (ROOT / "python" / "specswap" / f"_C{sysconfig.get_config_var('EXT_SUFFIX')}").is_file():
        # built in place (tools/build_inplace.sh, as gpu_check.sh does): check the source tree, not an install
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "python"), env.get("PYTHONPATH")]))
    log_path = Path(args.log) if args.log else Path(args.report).with_suffix(".log")
    built = args.build_rc in (None, 0)
    with tempfile.TemporaryDirectory() as scratch, open(log_path, "w") as log:
        for name in args.checks:
            remaining = deadline - time.perf_counter()
            if not built:
                report["checks"].append({"name": name, "ok": False, "error": "not run: the build failed"})
                continue
            if remaining < 10:
                report["checks"].append({"name": name, "ok": False,
                                         "error": f"not run: the {args.budget_s:.0f} s budget was spent"})
                continue
            if name in PYTEST_CHECKS:
                pytest_args, cap = PYTEST_CHECKS[name]
                junit = Path(scratch) / f"{name}.xml"
                command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfEs",
                           f"--junitxml={junit}", *pytest_args]
                result = run_command(name, command, min(cap, remaining), env, log)
                result["tests"] = junit_summary(junit)
                skipped = result["tests"].get("skipped", 0)
                if result["ok"] and not result["tests"].get("tests"):
                    result.update(ok=False, error="no test ran")
                elif result["ok"] and skipped:
                    result.update(ok=False, error=f"{skipped} test(s) skipped: a check that did not run proves nothing")
            else:
                part = Path(scratch) / "measure.json"
                command = [sys.executable, str(Path(__file__).resolve()), "measure", "--device", args.device,
                           "--json", str(part), *args.measure_args]
                result = run_command(name, command, min(MEASURE_SECONDS, remaining), env, log)
                if part.is_file():
                    measured = json.loads(part.read_text())
                    report["measurements"] = measured
                    if result["ok"] and measured.get("problems"):
                        result.update(ok=False, error="; ".join(measured["problems"]))
                elif result["ok"]:
                    result.update(ok=False, error="measure wrote no results")
            report["checks"].append(result)
            report["seconds"] = round(time.time() - started, 1)
            write_report(Path(args.report), report)  # a report exists even if the machine is taken mid-run
    report["ok"] = bool(report["checks"]) and all(c["ok"] for c in report["checks"])
    report["failed"] = [c["name"] for c in report["checks"] if not c["ok"]]
    report["seconds"] = round(time.time() - started, 1)
    write_report(Path(args.report), report)
    print(f"gpu check: {'PASSED' if report['ok'] else 'FAILED ' + ', '.join(report['failed'])} "
          f"in {report['seconds']} s; report {args.report}")
    return 0 if report["ok"] else 1


# ---- measurements ---------------------------------------------------------------------------------------------

def random_gemma(shape: dict[str, Any], device, dtype, seed: int = 0):
    """A Gemma 3 target of these shapes with random weights, made on the device (no host copy of 270M weights)."""
    import torch

    from specswap.models.gemma3 import Gemma3Config, Gemma3ForCausalLM

    config = Gemma3Config.from_dict(shape, "gpu_check random Gemma shape")
    torch.manual_seed(seed)
    with torch.device(device):
        model = Gemma3ForCausalLM(config)
    model = model.to(dtype).eval()
    model.finish_loading(device)  # rotary tables back in fp32, as a loaded checkpoint has them
    return model


def gemma_draft(target, shape_name: str, device, dtype, seed: int = 1):
    """The shipped Gemma EAGLE head on the Gemma-shaped target; on the small shape, a random head of its shape."""
    import torch

    from specswap import zoo
    from specswap.models import EagleConfig, EagleHead, load_eagle_head

    if shape_name == "gemma-3-270m":
        return load_eagle_head(zoo.path("gemma-3-270m-eagle"), target)
    config = target.config
    head_config = EagleConfig.from_dict({
        "hidden_size": config.hidden_size, "intermediate_size": config.intermediate_size,
        "num_attention_heads": config.num_attention_heads, "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim, "target_vocab_size": config.vocab_size, "draft_vocab_size": config.vocab_size // 2,
        "rms_norm_eps": config.rms_norm_eps, "max_position_embeddings": config.max_position_embeddings,
        "model_type": "eagle"}, "gpu_check small head")
    torch.manual_seed(seed)
    token_map = torch.randperm(config.vocab_size)[:head_config.draft_vocab_size].sort().values
    return EagleHead(head_config, target.embed_tokens, target.lm_head, token_map.to(device)).to(device, dtype).eval()


def synchronize(device) -> None:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def reserved_bytes(device) -> int | None:
    import torch

    if torch.device(device).type == "cuda":
        synchronize(device)
        return torch.cuda.memory_reserved(device)
    return None


def tier_memory(args: argparse.Namespace, problems: list[str]) -> dict[str, Any]:
    """What each tier adds on the device: the shipped tiny pair, EAGLE, every tier 1-7 captured at start-up."""
    from specswap import zoo
    from specswap.engine import Engine

    device = args.device
    if not all((zoo.path(name) / "model.safetensors").is_file() for name in ("tiny", "tiny-eagle")):
        problems.append("tiny zoo weights are missing: no tier memory measured")
        return {}
    before = reserved_bytes(device)
    engine = Engine("tiny", speculative_algorithm="EAGLE", device=device, dtype="float32",
                    max_seq_len=args.memory_max_seq_len, max_batch_size=args.memory_batch, speculative_adaptive=True,
                    speculative_adaptive_config={"candidate_steps": [1, 2, 3, 4, 5, 6, 7]})
    after = reserved_bytes(device)
    by_tier = sorted(engine.tier_memory_bytes().items(), key=lambda item: (isinstance(item[0], str), item[0]))
    memory = {str(tier): int(nbytes) for tier, nbytes in by_tier}
    missing = [tier for tier in range(1, 8) if memory.get(str(tier), 0) <= 0]
    if missing:
        problems.append(f"tiers {missing} report no memory of their own")
    return {"model": f"tiny + tiny-eagle, fp32, max_batch_size {args.memory_batch}, "
                     f"max_seq_len {args.memory_max_seq_len}", "tier_bytes": memory,
            "engine_reserved_bytes": None if before is None else after - before}


def time_graphs_vs_eager(args: argparse.Namespace, problems: list[str]) -> dict[str, Any]:
    """Decode rounds replayed from graphs against eager ones, on the same weights, alternating in bursts."""
    import torch

    sys.path.insert(0, str(ROOT / "bench"))
    from bench_graphs import build, time_rounds  # noqa: E402  (bench/ is no package)
    from specswap.engine import resolve_dtype
    from specswap.graphs import capture_count

    device, dtype = torch.device(args.device), resolve_dtype(args.dtype, args.device)
    target = random_gemma(SHAPES[args.shape], device, dtype)
    head = gemma_draft(target, args.shape, device, dtype)
    rows = []
    for steps in args.steps:
        for batch in args.batch:
            # the workers a decode round runs on (bench_graphs.build), over the same weights
            eager = build(target, steps, batch, False, dtype, args.max_seq_len, args.device, draft=head)
            before_bytes, before_captures, start = reserved_bytes(device), capture_count(), time.perf_counter()
            graphed = build(target, steps, batch, True, dtype, args.max_seq_len, args.device, draft=head)
            synchronize(device)
            capture_seconds = time.perf_counter() - start
            captures = capture_count() - before_captures
            after_bytes = reserved_bytes(device)
            results: dict[str, list[tuple[float, float]]] = {"eager": [], "graph": []}
            per_burst = max(1, args.rounds // args.bursts)
            for burst in range(args.bursts):
                for name, worker in (("eager", eager), ("graph", graphed)):
                    results[name].append(time_rounds(worker, batch, per_burst, prefill=burst == 0))
            late_captures = capture_count() - before_captures - captures
            if late_captures:
                problems.append(f"tier {steps} batch {batch}: {late_captures} captures while decoding")
            eager_ms = statistics.median(r[0] for r in results["eager"]) * 1e3
            graph_ms = statistics.median(r[0] for r in results["graph"]) * 1e3
            same = [eager.slots.host_tokens[s] == graphed.slots.host_tokens[s] for s in range(batch)]
            rows.append({
                "steps": steps, "batch": batch, "rounds": per_burst * args.bursts,
                "eager_ms_per_round": round(eager_ms, 3), "graph_ms_per_round": round(graph_ms, 3),
                "speedup": round(statistics.median(e[0] / g[0] for e, g in zip(results["eager"], results["graph"])),
                                 3),
                "capture_seconds": round(capture_seconds, 3), "captures": captures,
                "captures_while_decoding": late_captures,
                "tier_bytes": int(graphed.tier_memory_bytes().get(steps, 0)),
                "engine_reserved_bytes": None if before_bytes is None else after_bytes - before_bytes,
                # greedy on the same weights: the same tokens unless a key-length bucket's longer (masked) attention
                # sum flips a near-tie in low precision; reported, not required
                "same_tokens_as_eager": all(same),
            })
            if not graph_ms > 0 or not eager_ms > 0:
                problems.append(f"tier {steps} batch {batch}: no round time measured")
            del eager, graphed
            gc.collect()  # the graphs and caches of this pair go before the next pair is built
    return {"target": f"{args.shape} shapes, random weights, {str(dtype).removeprefix('torch.')}",
            "draft": "shipped gemma-3-270m-eagle" if args.shape == "gemma-3-270m" else "random EAGLE head",
            "max_seq_len": args.max_seq_len, "rows": rows}


def measure(args: argparse.Namespace) -> int:
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    problems: list[str] = []
    out: dict[str, Any] = {"device": args.device}
    # no inference_mode here: the worker enters it where it runs the models, as in bench/bench_graphs.py
    if not args.no_memory:
        out["tier_memory"] = tier_memory(args, problems)
    out["decode_rounds"] = time_graphs_vs_eager(args, problems)
    out["problems"] = problems
    Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    for row in out["decode_rounds"]["rows"]:
        print(f"tier {row['steps']} batch {row['batch']}: eager {row['eager_ms_per_round']:.3f} ms, graph "
              f"{row['graph_ms_per_round']:.3f} ms per round ({row['speedup']:.2f}x), tier {row['tier_bytes']} B")
    print("problems: " + ("; ".join(problems) if problems else "none"))
    return 1 if problems else 0


# ---- arguments ------------------------------------------------------------------------------------------------

def device_name(value: str) -> str:
    import torch

    try:
        device = torch.device(value)
    except RuntimeError as error:
        raise argparse.ArgumentTypeError(f"{value!r} is not a device ({error}); valid: cpu, cuda, cuda:N")
    if device.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"device type {device.type!r} is not checked here; valid: cpu, cuda, cuda:N")
    return value


def positive(kind):
    def parse(value: str):
        number = kind(value)
        if number <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0; got {value}")
        return number
    return parse


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = top.add_subparsers(dest="action", required=True)
    run = commands.add_parser("run", help="run the checks and write the report")
    run.add_argument("--device", type=device_name, default="cuda")
    run.add_argument("--report", required=True, help="the JSON report to write")
    run.add_argument("--log", help="full output of every check (default: the report's path with .log)")
    run.add_argument("--checks", nargs="+", choices=CHECKS, default=list(CHECKS))
    run.add_argument("--budget-s", type=positive(float), default=420.0,
                     help="seconds all checks may take together; a check that would start later fails")
    run.add_argument("--commit", default=None)
    run.add_argument("--command", default=None, help="the command line to record (tools/gpu_check.sh passes its own)")
    run.add_argument("--build-rc", type=int, default=None, help="the build's exit status (a failed build fails all)")
    run.add_argument("--build-seconds", type=float, default=None)
    run.add_argument("--build-log", default=None)
    run.add_argument("--build-command", default=None)
    run.add_argument("--measure-args", type=shlex.split, default=[],
                     help="extra arguments for measure, one string (e.g. '--shape small --rounds 4')")
    meas = commands.add_parser("measure", help="tier memory and graph-vs-eager decode rounds")
    meas.add_argument("--device", type=device_name, default="cuda")
    meas.add_argument("--json", required=True)
    meas.add_argument("--shape", choices=sorted(SHAPES), default="gemma-3-270m")
    meas.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="auto",
                      help="of the timed target (auto: bf16 on a GPU); the tier-memory engine runs fp32")
    meas.add_argument("--steps", type=positive(int), nargs="+", default=[1, 3, 7])
    meas.add_argument("--batch", type=positive(int), nargs="+", default=[1, 4])
    meas.add_argument("--rounds", type=positive(int), default=120)
    meas.add_argument("--bursts", type=positive(int), default=6)
    meas.add_argument("--max-seq-len", type=positive(int), default=256)
    meas.add_argument("--threads", type=positive(int), default=None)
    meas.add_argument("--memory-max-seq-len", type=positive(int), default=512, help="of the tier-memory engine")
    meas.add_argument("--memory-batch", type=positive(int), default=8, help="max_batch_size of the tier-memory engine")
    meas.add_argument("--no-memory", action="store_true", help="skip the tier-memory engine")
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.action == "run":
        return run_checks(args)
    return measure(args)


if __name__ == "__main__":
    sys.exit(main())
