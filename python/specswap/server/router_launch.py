"""One endpoint for data parallelism (docs/scale-out.md): under torchrun, ``specswap serve --dp-size N`` serves each
data-parallel group on an internal port (``--port`` + 1 + its index) and the job's first rank runs SGLang's router
(``sglang-router``, the ``router`` extra) on ``--port`` in front of them, with ``--router-policy``. Without the
extra it says so and each group serves ``--port`` + its index, as before.

Every rank calls ``place_groups`` (one collective over the job): rank 0's answer decides for all, so a host that
lacks the extra cannot split the job. The router runs in its own session, dies with rank 0 (``PR_SET_PDEATHSIG``)
and is stopped, with its process group (the launcher retitles itself ``sglang::router``), when rank 0 ends.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO

POLICIES = ("round_robin", "power_of_two", "cache_aware", "random")
STOP_SECONDS = 10            # SIGTERM to SIGKILL
ROUTER_GRACE_SECONDS = 2     # the router's own drain (--shutdown-grace-period-secs): rank 0 has drained already
MISSING = ("specswap serve: sglang-router is not installed (pip install \"specswap[router]\"): each data-parallel "
           "group serves its own port, --port + its index")
# the child sets PR_SET_PDEATHSIG (1) so it ends with rank 0 even if rank 0 is killed, then becomes the router
_LAUNCH = ("import ctypes, os, signal, sys; ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM); "
           "os.getppid() == int(sys.argv[1]) or sys.exit(1); "
           "os.execv(sys.executable, [sys.executable, '-m', 'sglang_router.launch_router', *sys.argv[2:]])")


def add_arguments(parser) -> None:
    parser.add_argument("--router-policy", choices=POLICIES, default="round_robin",
                        help="--dp-size under torchrun with sglang-router installed: how the router in front of the "
                             "groups picks one (default round_robin: the groups are alike; power_of_two balances on "
                             "their /get_load; docs/scale-out.md)")


def router_installed() -> bool:
    return importlib.util.find_spec("sglang_router") is not None


def advertised_host(host: str) -> str:
    """The address the router reaches this rank's server at: ``--host``, unless it binds every interface; then
    the interface that routes to the job's rendezvous host (MASTER_ADDR; no packet is sent)."""
    if host not in ("0.0.0.0", "::", ""):
        return host
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((os.environ.get("MASTER_ADDR", "127.0.0.1"), 9))
            return probe.getsockname()[0]
        except OSError:
            return "127.0.0.1"


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


@dataclass
class Placement:
    port: int                          # where this rank's group serves HTTP (its leader only)
    worker_urls: list[str] | None      # rank 0 behind the router: every group's URL, by index; else None


def place_groups(host: str, port: int, group) -> Placement:
    """Where each group serves; every rank of the job must call it (an all-gather). ``group``: the rank's
    ``DistributedGroup``."""
    leader = group.tp_rank == 0
    mine = {"router": router_installed(), "host": advertised_host(host) if leader else None}
    everyone = group.all_gather_object(mine, group="world")
    if not everyone[0]["router"]:
        if group.rank == 0:
            print(MISSING, file=sys.stderr, flush=True)
        return Placement(port + group.dp_rank, None)
    hosts = [entry["host"] for entry in everyone[::group.tp_size]]  # the leaders, by data-parallel index
    urls = [_url(h, port + 1 + index) for index, h in enumerate(hosts)]
    return Placement(port + 1 + group.dp_rank, urls if group.rank == 0 else None)


def bind_groups(host: str, port: int, group, bind) -> socket.socket | None:
    """Each group's leader binds its port (``bind(host, port)``, ``place_groups``' port), and every rank of the job
    hears whether all did (an all-gather): a port one group cannot bind is an error on every rank (ValueError naming
    it), where that group alone would have stopped while the others served on, and the job never ended. Returns
    this rank's socket (None on a tensor-parallel follower)."""
    sock, error = None, None
    if group.tp_rank == 0:
        try:
            sock = bind(host, port)
        except OSError as failure:
            error = f"group {group.dp_rank}: --host {host} port {port} cannot be bound: {failure}"
    errors = [e for e in group.all_gather_object(error, group="world") if e is not None]
    if errors:
        if sock is not None:
            sock.close()
        raise ValueError("; ".join(dict.fromkeys(errors)))
    return sock


def router_command(urls: list[str], host: str, port: int, policy: str, api_key: str | None,
                   extra: Sequence[str] = (), log_level: str = "warn") -> list[str]:
    """The router's arguments (``extra``: more of its flags). Workers are polled for health every second at
    start-up (its default is 30 s); its Prometheus endpoint goes on ``host``, at the port after the groups'."""
    arguments = ["--worker-urls", *urls, "--host", host, "--port", str(port), "--policy", policy,
                 "--worker-startup-check-interval", "1", "--shutdown-grace-period-secs", str(ROUTER_GRACE_SECONDS),
                 "--prometheus-host", host, "--prometheus-port", str(port + 1 + len(urls)), "--log-level", log_level,
                 *extra]
    if api_key is not None:  # the router sends it to the workers and asks it of its clients
        arguments += ["--api-key", api_key]
    return arguments


def front_of_groups(args, group) -> RouterProcess | None:
    """``serve --dp-size N``, every rank: sets ``args.port`` to where this rank's group serves; returns the router
    to run in front of the groups on rank 0 (None elsewhere, or without the extra)."""
    port = args.port
    placement = place_groups(args.host, port, group)
    args.port = placement.port
    if placement.worker_urls is None:
        return None
    return RouterProcess(router_command(placement.worker_urls, args.host, port, args.router_policy, args.api_key),
                         f"specswap serve: sglang-router (--router-policy {args.router_policy}) on "
                         f"{_url(args.host, port)} in front of {len(placement.worker_urls)} data-parallel groups "
                         f"({', '.join(placement.worker_urls)})")


class RouterProcess:
    """``sglang-router`` as a child of this process, in its own process group; ``stop`` ends the group."""

    def __init__(self, arguments: list[str], banner: str = "", output: IO | None = None):
        self.arguments, self.banner, self.output = arguments, banner, output
        self.process: subprocess.Popen | None = None

    def start(self) -> RouterProcess:
        command = [sys.executable, "-c", _LAUNCH, str(os.getpid()), *self.arguments]
        self.process = subprocess.Popen(command, start_new_session=True, stdout=self.output,
                                        stderr=None if self.output is None else subprocess.STDOUT)
        if self.banner:
            print(self.banner, flush=True)
        return self

    def stop(self) -> int | None:
        """SIGTERM to the router's process group, SIGKILL after ``STOP_SECONDS``; returns its exit status."""
        process = self.process
        if process is None:
            return None
        status = None
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                break
            try:
                status = process.wait(STOP_SECONDS)
                break
            except subprocess.TimeoutExpired:
                continue
        try:  # whatever the launcher left in its group (a child holding the port)
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return process.wait(STOP_SECONDS) if status is None else status
