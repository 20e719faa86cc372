"""Two "hosts" on one machine: two network namespaces joined by a veth pair (tools/netns_hosts.sh), one torchrun
per host (``--nnodes 2 --node-rank N``, rendezvous at the first host's address, gloo on the veth interface).
Tensor parallelism across the hosts and a data-parallel group per host give one process's tokens with the tier
traces agreed; a host killed from outside (every process of its namespace) is named by the other's RankFailure
within the collectives' timeout.

Needs root and working ``ip netns`` (CI runs as root); elsewhere the tests skip saying which is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specswap import zoo

sys.path.insert(0, str(Path(__file__).parent))
import launch  # noqa: E402

SCRIPT = launch.ROOT / "tools" / "netns_hosts.sh"
TIMEOUT_S = 5.0  # the collectives' timeout (--dist-timeout) in the killed-host tests
PORT = 29500     # the rendezvous port on the first host's address (each test has namespaces of its own)

pytestmark = pytest.mark.skipif(
    not all((zoo.path(name) / "model.safetensors").is_file() for name in zoo.NAMES),
    reason="tiny zoo weights are not built (python -m specswap.zoo train tiny)")


def _unavailable() -> str | None:
    """Why the namespaces cannot be made here, or None."""
    if not sys.platform.startswith("linux"):
        return "network namespaces are Linux's"
    if os.geteuid() != 0:
        return "not root: network namespaces need root (CI runs as root)"
    if shutil.which("ip") is None:
        return "no `ip` (iproute2) for `ip netns`"
    probe = subprocess.run(["bash", str(SCRIPT), "check"], capture_output=True, text=True, timeout=30)
    return f"no `ip netns` here: {probe.stderr.strip()}" if probe.returncode else None


class Hosts:
    """The pair of namespaces one test made, and the torchruns it starts in them."""

    def __init__(self, name: str):
        self.env = dict(os.environ, NETNS_HOSTS_NAME=name)
        self.master = self.script("addr", "0").strip()
        self.ifname = self.script("ifname").strip()

    def script(self, *args: str) -> str:
        done = subprocess.run(["bash", str(SCRIPT), *args], env=self.env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, f"netns_hosts.sh {' '.join(args)}: {done.stderr}"
        return done.stdout

    def torchrun(self, node: int, scenario: str, out: Path, *args: str, **extra_env: str) -> subprocess.Popen:
        """One torchrun on host ``node``: one rank (global rank ``node``) running ``scenarios.py scenario``."""
        env = dict(self.env, **extra_env, OMP_NUM_THREADS="1", SPECSWAP_DIST_TIMEOUT=str(TIMEOUT_S),
                   PYTHONPATH=launch.package_path(), GLOO_SOCKET_IFNAME=self.ifname)
        env.pop("TORCHELASTIC_USE_AGENT_STORE", None)
        argv = ["bash", str(SCRIPT), "exec", str(node), sys.executable, "-m", "torch.distributed.run",
                "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "1", "--master-addr", self.master,
                "--master-port", str(PORT), str(launch.SCENARIOS), scenario, str(out), *args]
        return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def run(self, scenario: str, out: Path, *args: str, timeout_s: float = 60, **extra_env: str) -> list[dict]:
        """Both hosts' torchruns; each must exit 0; the ranks' JSON results in rank order."""
        results = launch.wait([self.torchrun(node, scenario, out, *args, **extra_env) for node in (0, 1)], timeout_s)
        for node, (code, output) in enumerate(results):
            assert code == 0, f"host {node}'s torchrun exited {code}:\n{output[-4000:]}"
        return [json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1)]

    def link_bytes(self, node: int) -> int:
        """Bytes host ``node`` received on its veth end."""
        return int(self.script("exec", str(node), "cat", f"/sys/class/net/{self.ifname}/statistics/rx_bytes"))


@pytest.fixture
def hosts():
    reason = _unavailable()
    if reason:
        pytest.skip(reason)
    name = f"sst{os.getpid()}"
    env = dict(os.environ, NETNS_HOSTS_NAME=name)
    subprocess.run(["bash", str(SCRIPT), "down"], env=env, capture_output=True, timeout=60)  # a crashed run's
    made = subprocess.run(["bash", str(SCRIPT), "up"], env=env, capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    try:
        yield Hosts(name)
    finally:
        subprocess.run(["bash", str(SCRIPT), "down"], env=env, capture_output=True, timeout=60)


def test_tp2_across_hosts_tokens_identical_to_one_process(hosts, tmp_path):
    """Tensor parallelism 2, a rank per host, NGRAM under adaptive switching: the leader's tokens are one
    process's target-only tokens, the follower's pool switched as the leader's did, and the sharded forwards'
    collectives crossed the link."""
    leader, follower = hosts.run("tp_engine", tmp_path, "NGRAM", "3", "1")
    assert leader["tokens"] == leader["reference"]
    assert leader["num_switches"] >= 1 and len(set(leader["tiers"])) >= 2, leader["tiers"]
    assert follower["followed"] and follower["num_switches"] == leader["num_switches"]
    assert follower["current_steps"] == leader["current_steps"]
    assert min(hosts.link_bytes(0), hosts.link_bytes(1)) > 100_000


def test_dp2_across_hosts_one_group_per_host_agrees(hosts, tmp_path):
    """Data parallelism 2, a group per host, different prompts (different acceptance): every step's tier is the
    same on both hosts, switches happen, and each host's tokens are one process's."""
    first, second = hosts.run("dp_agreement", tmp_path, timeout_s=80, DP_NEW_TOKENS="120")
    assert first["tiers"] == second["tiers"] and first["num_switches"] == second["num_switches"] >= 1
    assert first["agreement_steps"] == second["agreement_steps"] == len(first["tiers"])
    assert first["identical"] and second["identical"]


def _read_when_written(path: Path, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            return json.loads(path.read_text())
        except (FileNotFoundError, ValueError):  # not yet, or not yet whole
            time.sleep(0.1)
    raise AssertionError(f"the survivor wrote no {path.name} in {timeout_s} s")


@pytest.mark.parametrize("layout,victim", [("tp", 1), ("dp", 0)])
def test_a_killed_host_is_named_by_the_other(hosts, tmp_path, layout, victim):
    """Mid-run, every process of one host's namespace is killed (its torchrun and its rank; host 0's torchrun
    hosts the job's store): the rank on the other host raises RankFailure naming the dead rank within the
    collectives' timeout (plus the diagnosis: 3 heartbeat intervals)."""
    procs = [hosts.torchrun(node, "killed_host", tmp_path, layout) for node in (0, 1)]
    survivor = 1 - victim
    try:
        deadline = time.monotonic() + 90
        leaders = (0,) if layout == "tp" else (0, 1)
        while not all((tmp_path / f"rank{r}.running").exists() for r in leaders):
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), \
                [p.poll() for p in procs]
            time.sleep(0.1)
        hosts.script("kill", str(victim))
        result = _read_when_written(tmp_path / f"rank{survivor}.json", TIMEOUT_S + 20)
    finally:  # the survivor's torchrun waits for its dead peer's at exit: every process of both hosts goes
        for node in (0, 1):
            hosts.script("kill", str(node))
        launch.wait(procs, 10)
    assert result["ranks"] == [victim] and f"rank {victim} died" in result["error"], result
    assert result["steps"] >= 10 and result["after_seconds"] < TIMEOUT_S + 3, result


def test_bench_agreement_measures_across_the_link(tmp_path):
    """bench/bench_agreement.py --veth: the agreement's cost on loopback, then with a rank in each namespace, then
    with 0.5 ms added to the link: measured (a step then waits at least one hop), or refused naming the kernel
    module that adds it (this kernel has no netem)."""
    reason = _unavailable()
    if reason:
        pytest.skip(reason)
    out = tmp_path / "agreement.json"
    done = subprocess.run([sys.executable, str(launch.ROOT / "bench" / "bench_agreement.py"), "--steps", "20",
                           "--warmup", "2", "--veth", "--delay-ms", "0.5", "--json", str(out)],
                          env=dict(os.environ, PYTHONPATH=launch.package_path()), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    links = json.loads(out.read_text())["links"]
    assert [(link["link"], link["delay_ms"]) for link in links] == [("loopback", 0), ("veth", 0), ("veth", 0.5)]
    for link in links[:2]:
        assert 0 < link["agreement"]["median_us"] <= link["agreement"]["p99_us"], link
    if "error" in links[2]:
        assert "sch_netem" in links[2]["error"], links[2]
    else:
        assert links[2]["agreement"]["median_us"] >= 500, links[2]
