"""The `specswap` command line."""

from __future__ import annotations

import argparse
import random
import sys
import time
from typing import Sequence


def _simulated_accepts(rng: random.Random, acceptance: float, steps: int, batch: int) -> list[int]:
    # accepted draft tokens per request: a chain stops at the first rejection
    counts = []
    for _ in range(batch):
        accepted = 0
        while accepted < steps and rng.random() < acceptance:
            accepted += 1
        counts.append(accepted)
    return counts


def cmd_demo(args: argparse.Namespace) -> int:
    """Drive the C++ policy and state pool through phases of low and high acceptance."""
    from specswap import AdaptiveController, SpecRuntimeState, StatePool
    from specswap.adaptive_config import load_adaptive_config
    from specswap.tier import Tier
    from specswap.worker import RoundResult

    config = load_adaptive_config(args.config)
    pool = StatePool()  # placeholder stages: the demo shows the policy and the switch, not a model
    for steps in sorted({args.initial_steps, *config.candidate_steps}):
        pool.register(SpecRuntimeState(steps, steps + 1, **{name: f"{name}[k={steps}]" for name in
                                                            ("draft", "verify", "draft_extend", "round")}))
    pool.activate(args.initial_steps)
    controller = AdaptiveController(pool, config)
    rng = random.Random(args.seed)
    phases = [("low", 0.15), ("high", 0.92), ("low", 0.15), ("high", 0.92)]
    print(f"tiers {controller.candidate_tiers}, start at {controller.current_tier}")
    print(f"{'phase':<6} {'acceptance':>10} {'rounds':>6}  tier trace (one char per {args.rounds // 40} rounds)")
    switch_seconds = []
    for name, acceptance in phases:
        trace = []
        for round_index in range(args.rounds):
            tier = Tier.from_key(pool.active_tier)
            accepts = _simulated_accepts(rng, acceptance, tier.steps, args.batch_size)
            result = RoundResult([[0]] * len(accepts), accepts, tier, tier, speculating=[True] * len(accepts))
            start = time.perf_counter()
            if controller.observe(result) is not None:
                switch_seconds.append(time.perf_counter() - start)
            if round_index % max(1, args.rounds // 40) == 0:
                trace.append(str(pool.active_tier))
        print(f"{name:<6} {acceptance:>10.2f} {args.rounds:>6}  {''.join(trace)}")
    stats = controller.stats()
    print(f"switches: {stats['num_switches']}, final tier {stats['current_steps']}, EMA {stats['ema']:.2f}")
    for row in stats["tiers"]:
        print(f"  tier {row['speculative_num_steps']}: activated {row['activations']}x, "
              f"active {row['seconds_active'] * 1e3:.1f} ms")
    if switch_seconds:
        print(f"mean observe() with a switch (Python, the policy and the pool's swap): "
              f"{sum(switch_seconds) / len(switch_seconds) * 1e6:.1f} us")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    """Load the model once and serve it over HTTP until SIGTERM / SIGINT, then drain (docs/serving.md)."""
    from specswap.cli_flags import check_speculative_flags
    from specswap.server.limits import ServerLimits
    from specswap.server.startup import check_serve_args
    check_serve_args(args)  # every flag before anything loads: an error names it, exit status 2
    check_speculative_flags(args, args.speculative_adaptive)
    limits = ServerLimits.from_args(args)
    try:
        from specswap.server.app import bind
    except ImportError as error:
        raise ValueError(f"serving needs FastAPI, uvicorn and prometheus-client: pip install \"specswap[serve]\" "
                         f"({error})") from error
    sock = None
    if args.dp_size == 1:  # the port first: a taken one is an error now, not after the model loads
        try:
            sock = bind(args.host, args.port)
        except OSError as error:
            raise ValueError(f"--host {args.host} --port {args.port} cannot be bound: {error}") from error
    try:
        return _serve_loaded(args, limits, sock)
    finally:
        if sock is not None:
            sock.close()


def _serve_loaded(args: argparse.Namespace, limits, sock) -> int:
    """``cmd_serve`` once its flags are checked and its port bound: load, build, serve, shut down."""
    from specswap.cli_flags import build_engine, engine_keywords
    from specswap.loading import load_models
    from specswap.server.app import create_app, serve
    from specswap.server.limits import max_running_requests
    from specswap.server.startup import freeze_startup_objects, ready_line
    if args.threads:
        import torch
        torch.set_num_threads(args.threads)
    algorithm = args.speculative_algorithm
    models = load_models(args.model, args.draft_model, algorithm, **engine_keywords(args, "serve", load=True))
    # every Engine flag through EngineOptions' table; --max-running-requests overrides --max-batch-size
    engine = build_engine(models, **{**engine_keywords(args, "serve"), "max_batch_size": max_running_requests(args)})
    router = None
    if args.dp_size > 1:  # one endpoint: the groups behind sglang-router (server/router_launch.py), else a port each
        from specswap.server.app import bind
        from specswap.server.router_launch import bind_groups, front_of_groups
        router = front_of_groups(args, engine.group)  # every rank: a collective
        sock = bind_groups(args.host, args.port, engine.group, bind)  # every rank: a collective
    if not engine.is_leader:  # a tensor-parallel follower: no HTTP, the leader's steps until it shuts down
        rank = engine.group.rank
        print(f"specswap serve: rank {rank} follows its tensor-parallel leader", flush=True)
        _wait_for_leader_on_signals(rank)
        engine.follow()  # returns once its leader shut down, the group closed
        return 0
    server_args = {key: value for key, value in vars(args).items() if key not in ("func", "api_key")}
    app = create_app(engine, args.served_model_name or args.model, api_key=args.api_key, server_args=server_args,
                     limits=limits)
    print(f"specswap serve: {args.model} ({sum(p.numel() for p in models.target.parameters()) / 1e6:.1f}M, "
          f"{models.dtype}, weights {models.weights}), speculative {algorithm}{' adaptive' if args.speculative_adaptive else ''}, "
          f"max running {engine.max_batch_size}, max queued {limits.max_queued_requests}, max_seq_len "
          f"{engine.max_seq_len}; http://{args.host}:{args.port}/v1",
          flush=True)
    from specswap.capability import cpu_capability
    print(cpu_capability().describe(), flush=True)
    app.state.ready_message = ready_line(f"http://{args.host}:{args.port}", args.served_model_name or args.model,
                                         models.weights, engine.stats())
    for tier in engine.tier_report():  # what each prebuilt tier holds and took to build (SGLang reports its graphs)
        print(f"specswap serve: tier ({tier['speculative_num_steps']}, {tier['speculative_eagle_topk']}, "
              f"{tier['speculative_num_draft_tokens']}): {tier['memory_bytes'] / 2**20:.2f} MiB, built in "
              f"{tier['build_seconds']:.2f} s", flush=True)
    freeze_startup_objects()  # no generation-2 collection rescans the start-up's objects mid-round
    try:
        if router is not None:
            router.start()
        serve(app, args.host, args.port, args.log_level, sock=sock)
    finally:
        if router is not None:
            router.stop()  # it and its process group: a child left behind would hold --port
        # the scheduler thread owns the engine until it is gone (joined); only then may this thread step it
        if app.state.scheduler.stop() and app.state.scheduler.error is None:
            engine.shutdown()  # its followers released, every leader's last step agreed, the group closed
    if app.state.scheduler.error is not None:  # a fault in shared state: non-zero, for a supervisor to restart it
        print(f"specswap serve: error: the engine failed: {app.state.scheduler.error!r}; exiting with status 1",
              file=sys.stderr, flush=True)
        return 1
    return 0


def _wait_for_leader_on_signals(rank: int) -> None:
    """A follower told to stop (torchrun passes SIGTERM / SIGINT to every rank) waits for its leader's shutdown,
    which reaches it (``Engine.follow`` returns): leaving first would fail its leader's collectives."""
    import signal

    def wait(signum, frame):
        print(f"specswap serve: rank {rank} got signal {signum}: it leaves when its leader shuts down", flush=True)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, wait)


def cmd_bench(args: argparse.Namespace) -> int:
    """The phased workload benchmark (see docs/bench.md)."""
    from specswap.bench.cli import run_from_args
    return run_from_args(args)


def build_parser() -> argparse.ArgumentParser:
    from specswap import __version__
    parser = argparse.ArgumentParser(prog="specswap", description="Adaptive speculative decoding")
    parser.add_argument("--version", action="version", version=f"specswap {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="show the adaptive policy switching prebuilt tiers on a simulated workload")
    demo.add_argument("--rounds", type=int, default=400, help="decode rounds per phase")
    demo.add_argument("--batch-size", type=int, default=4)
    demo.add_argument("--initial-steps", type=int, default=3)
    demo.add_argument("--config", default=None, help="adaptive config JSON (see docs/policy.md)")
    demo.add_argument("--seed", type=int, default=0)
    demo.set_defaults(func=cmd_demo)

    from specswap.cli_flags import add_model_arguments
    from specswap.server.startup import LOG_LEVELS, DefaultsFormatter
    serve = sub.add_parser("serve", help="OpenAI-compatible HTTP server with live adaptive metrics (docs/serving.md)",
                           formatter_class=DefaultsFormatter)
    add_model_arguments(serve, "serve")  # the Engine's flags among them (EngineOptions' table), tp and dp included
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    serve.add_argument("--port", type=int, default=30000, help="port to listen on, bound before the model loads")
    serve.add_argument("--api-key", default=None, help="require 'Authorization: Bearer <key>' on every request but "
                                                       "the probes (/health, /health_generate, /metrics)")
    serve.add_argument("--api-key-probes", action="store_true", help="require --api-key on the probes too")
    serve.add_argument("--served-model-name", default=None, help="the model id clients see (default: --model)")
    serve.add_argument("--max-body-bytes", type=int, default=1 << 20, help="larger request bodies get 413")
    from specswap.server.limits import add_arguments as add_limit_arguments
    add_limit_arguments(serve)
    from specswap.server.router_launch import add_arguments as add_router_arguments
    add_router_arguments(serve)
    serve.add_argument("--log-level", default="warning", type=str.lower, choices=LOG_LEVELS,
                       help="uvicorn's log level; the ready line and errors print at any level")
    serve.set_defaults(func=cmd_serve)

    bench = sub.add_parser("bench", help="phased workload benchmark: baseline, static tiers and adaptive side by side "
                                         "(docs/bench.md)")
    add_model_arguments(bench, "bench")
    from specswap.bench.cli import add_bench_arguments
    add_bench_arguments(bench)
    bench.set_defaults(func=cmd_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"specswap {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
