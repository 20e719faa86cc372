"""SGLang's router (``sglang-router``, the ``router`` extra) in front of two ``specswap serve`` replicas of the tiny
model given a chat template, on 127.0.0.1, workers and router behind one --api-key: every route its clients use
answers through it as the worker answers directly, streamed and not; the model is named; loads are reported; a
client that hangs up through the router frees its slot on the worker; a replica killed under load costs only its
in-flight requests (every request answered 200 or a clean error, none hangs), and once restarted it is taken back.
Then ``torchrun ... serve --dp-size 2``: one endpoint, the router in front of both groups, gone with the job.
About a minute and a half on two cores; a missing sglang-router fails the run under SPECSWAP_TEST_REQUIRE_ALL=1.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from components import require_module
from server_helpers import free_port, free_port_block
from specswap import zoo

pytestmark = pytest.mark.skipif(not (zoo.path("tiny") / "model.safetensors").is_file(),
                                reason="tiny zoo weights are not built (python -m specswap.zoo train tiny)")

KEY = "router-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
NAME = "tiny-chat"
TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant:{% endif %}")
SERVE = ["--threads", "1", "--disable-cuda-graph", "--api-key", KEY, "--served-model-name", NAME,
         "--max-running-requests", "4", "--log-level", "warning"]
# the router checks health every second and takes a worker back after one good check, so the test is short
FAST_HEALTH = ["--health-check-interval-secs", "1", "--health-failure-threshold", "1", "--health-success-threshold",
               "1", "--cb-timeout-duration-secs", "2"]
PROMPT = "def fibonacci(n):\n    "
TIMEOUT = 60                 # every client request's timeout (s)


def _package_path() -> str:
    import specswap  # noqa: PLC0415
    return str(Path(specswap.__file__).resolve().parents[1])


def _wait_healthy(url: str, process: subprocess.Popen | None, seconds: float, log: Path | None = None) -> None:
    deadline = time.monotonic() + seconds
    while True:
        assert process is None or process.poll() is None, log.read_text()[-3000:] if log else "it exited"
        try:
            if httpx.get(f"{url}/health", headers=AUTH, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, f"{url} did not come up in {seconds:g} s"
        time.sleep(0.2)


class Fleet:
    """Two replicas and the router; ``kill`` / ``restart`` a replica on its port."""

    def __init__(self, model: Path, logs: Path):
        self.model, self.logs = model, logs
        self.ports = [free_port(), free_port()]
        self.workers = [f"http://127.0.0.1:{port}" for port in self.ports]
        self.replicas: list[subprocess.Popen | None] = [None, None]
        self.router = None
        self.url = ""

    def start_replica(self, index: int) -> None:
        env = {**os.environ, "PYTHONPATH": _package_path(), "OMP_NUM_THREADS": "1"}
        log = self.logs / f"replica{index}.log"
        command = [sys.executable, "-m", "specswap.cli", "serve", "--model", str(self.model), *SERVE,
                   "--port", str(self.ports[index])]
        with open(log, "a") as output:
            self.replicas[index] = subprocess.Popen(command, env=env, stdout=output, stderr=subprocess.STDOUT)

    def wait_replica(self, index: int) -> None:
        _wait_healthy(self.workers[index], self.replicas[index], 120, self.logs / f"replica{index}.log")

    def kill(self, index: int) -> None:
        self.replicas[index].kill()
        self.replicas[index].wait(30)

    def start_router(self) -> None:
        from specswap.server.router_launch import RouterProcess, router_command  # noqa: PLC0415

        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        output = open(self.logs / "router.log", "w")  # noqa: SIM115 - closed in stop()
        arguments = router_command(self.workers, "127.0.0.1", port, "round_robin", KEY, FAST_HEALTH, "info")
        self.router = RouterProcess(arguments, output=output).start()
        deadline = time.monotonic() + 60
        while not self._both_taken():
            assert self.router.process.poll() is None, (self.logs / "router.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the router did not take both workers in 60 s"
            time.sleep(0.2)

    def _both_taken(self) -> bool:
        try:
            return len(httpx.get(f"{self.url}/workers", headers=AUTH, timeout=5).json()["workers"]) == 2
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        if self.router is not None:
            self.router.stop()
            self.router.output.close()
        for replica in self.replicas:
            if replica is not None and replica.poll() is None:
                replica.kill()
                replica.wait(30)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    require_module("sglang_router", "sglang-router", 'pip install "specswap[router]"')
    root = tmp_path_factory.mktemp("router")
    model = root / NAME
    shutil.copytree(zoo.path("tiny"), model)
    config = json.loads((model / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TEMPLATE}))
    fleet = Fleet(model, root)
    try:
        fleet.start_replica(0)
        fleet.start_replica(1)
        fleet.wait_replica(0)
        fleet.wait_replica(1)
        fleet.start_router()
        yield fleet
    finally:
        fleet.stop()


def _bodies(stream: bool) -> dict[str, dict]:
    greedy = {"temperature": 0, "stream": stream}
    sampling = {"max_new_tokens": 12, "temperature": 0}
    return {"/generate": {"text": PROMPT, "stream": stream, "sampling_params": sampling},
            "/v1/completions": {"model": NAME, "prompt": PROMPT, "max_tokens": 12, **greedy},
            "/v1/chat/completions": {"model": NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 12,
                                     **greedy}}


def _text(path: str, response: httpx.Response, stream: bool) -> str:
    """The answer's text; a stream must end with [DONE]."""
    assert response.status_code == 200, response.text
    if not stream:
        body = response.json()
        if path == "/generate":
            return body["text"]
        choice = body["choices"][0]
        return choice["message"]["content"] if path.endswith("chat/completions") else choice["text"]
    lines = [line[len("data: "):] for line in response.text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]", lines[-3:]
    chunks = [json.loads(line) for line in lines[:-1]]
    if path == "/generate":
        return chunks[-1]["text"]
    key = "delta" if path.endswith("chat/completions") else None
    return "".join((c["choices"][0][key].get("content") or "") if key else c["choices"][0]["text"]
                   for c in chunks if c["choices"])


@pytest.mark.parametrize("stream", [False, True])
def test_every_route_answers_through_the_router_as_the_worker_does(fleet, stream):
    for path, body in _bodies(stream).items():
        direct = _text(path, httpx.post(fleet.workers[0] + path, json=body, headers=AUTH, timeout=TIMEOUT), stream)
        routed = _text(path, httpx.post(fleet.url + path, json=body, headers=AUTH, timeout=TIMEOUT), stream)
        assert routed == direct and routed, path
    refused = httpx.post(fleet.url + "/v1/responses", json={"model": NAME, "input": "hi"}, headers=AUTH, timeout=10)
    assert refused.status_code == 501 and "/v1/responses" in refused.json()["error"]["message"]
    assert httpx.post(fleet.url + "/generate", json={"text": "a"}, timeout=10).status_code == 401  # the router's key
    typo = httpx.post(fleet.workers[0] + "/generate", json={"text": "a", "modle": NAME}, headers=AUTH, timeout=10)
    assert typo.status_code == 400 and typo.json()["error"]["param"] == "modle"  # a worker still refuses typos


def test_the_router_names_the_model_and_reads_loads(fleet):
    assert [m["id"] for m in httpx.get(fleet.url + "/v1/models", headers=AUTH, timeout=10).json()["data"]] == [NAME]
    for worker in fleet.workers:
        info = httpx.get(worker + "/get_server_info", headers=AUTH, timeout=10).json()
        assert {key: info[key] for key in ("model_path", "served_model_name", "tp_size", "dp_size")} == \
            {"model_path": str(fleet.model), "served_model_name": NAME, "tp_size": 1, "dp_size": 1}
        model = httpx.get(worker + "/get_model_info", headers=AUTH, timeout=10).json()
        assert model["model_type"] == "llama" and model["architectures"] == ["LlamaForCausalLM"]
    # a long request through the router: its worker reports it, and so does the router's view of the loads
    body = {"text": PROMPT, "stream": True, "sampling_params": {"max_new_tokens": 400, "ignore_eos": True}}
    with httpx.Client(timeout=TIMEOUT, headers=AUTH) as client, client.stream("POST", fleet.url + "/generate",
                                                                               json=body) as response:
        lines = response.iter_lines()  # held: a closed iterator closes the connection, and so ends the request
        next(lines)
        # a worker's load is its scheduler's snapshot, refreshed every 50 ms, and the router polls the workers: the
        # first token can come back before either counts the request, so both are read until they do (or 10 s)
        deadline = time.monotonic() + 10.0
        while True:
            loads = [httpx.get(w + "/get_load", headers=AUTH, timeout=10).json() for w in fleet.workers]
            busy = [load for [load] in loads if load["num_reqs"]]
            routed = httpx.get(fleet.url + "/get_loads", headers=AUTH, timeout=10).json()["workers"]
            counted = len(busy) == 1 and busy[0]["num_tokens"] > 0 and max(w["load"] for w in routed) > 0
            if counted or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        assert len(busy) == 1 and busy[0]["num_tokens"] > len(PROMPT) // 4 and busy[0]["dp_rank"] == 0, loads
        assert sorted(w["worker"] for w in routed) == sorted(fleet.workers)
        assert sorted(w["load"] for w in routed)[0] == 0 and sorted(w["load"] for w in routed)[1] > 0, routed
    for index in range(2):  # the router probed each with gRPC first: answered, not logged as an invalid request
        assert "Invalid HTTP request" not in (fleet.logs / f"replica{index}.log").read_text()


def _finished(fleet) -> list[dict]:
    return [httpx.get(w + "/server_info", headers=AUTH, timeout=10).json() for w in fleet.workers]


def _served(worker: str) -> int:
    return sum(httpx.get(worker + "/server_info", headers=AUTH, timeout=10).json()["requests_finished"].values())


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_hanging_up_through_the_router_aborts_its_request_on_the_worker(fleet, stream):
    before = sum(info["requests_finished"].get("abort", 0) for info in _finished(fleet))
    body = {"text": PROMPT, "stream": stream, "sampling_params": {"max_new_tokens": 480, "ignore_eos": True}}
    if stream:
        with httpx.Client(timeout=TIMEOUT, headers=AUTH) as client, \
                client.stream("POST", fleet.url + "/generate", json=body) as response:
            lines = response.iter_lines()
            next(lines)
    else:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(fleet.url + "/generate", json=body, headers=AUTH, timeout=httpx.Timeout(TIMEOUT, read=0.5))
    deadline = time.monotonic() + 10
    while True:
        infos = _finished(fleet)
        if sum(i["requests_finished"].get("abort", 0) for i in infos) == before + 1 and \
                all(i["num_requests_admitted"] == 0 for i in infos):
            break
        assert time.monotonic() < deadline, [(i["requests_finished"], i["num_requests_admitted"]) for i in infos]
        time.sleep(0.1)


def _client(url: str, stop: threading.Event, outcomes: list, index: int) -> None:
    """Requests one after another until ``stop``: each ("ok", when) or ("error", when, status, code), where a
    clean error is a JSON error body, or a stream that says so (an error chunk, or ended without [DONE])."""
    path, stream = [("/v1/completions", False), ("/generate", True)][index % 2]
    body = {"model": NAME, "prompt": PROMPT, "max_tokens": 48, "temperature": 0, "ignore_eos": True} \
        if path == "/v1/completions" else \
        {"text": PROMPT, "stream": True, "sampling_params": {"max_new_tokens": 48, "ignore_eos": True}}
    with httpx.Client(timeout=TIMEOUT, headers=AUTH) as client:
        while not stop.is_set():
            began = time.monotonic()
            try:
                if not stream:
                    response = client.post(url + path, json=body)
                    if response.status_code == 200:
                        outcomes.append(("ok", began, response.json()["usage"]["completion_tokens"] == 48))
                    else:
                        outcomes.append(("error", began, response.status_code, response.json()["error"]))
                    continue
                with client.stream("POST", url + path, json=body) as response:
                    if response.status_code != 200:
                        response.read()
                        outcomes.append(("error", began, response.status_code, response.json()["error"]))
                        continue
                    lines = [line for line in response.iter_lines() if line.startswith("data: ")]
                complete = bool(lines) and lines[-1] == "data: [DONE]"
                outcomes.append(("ok", began, json.loads(lines[-2][6:])["meta_info"]["completion_tokens"] == 48)
                                if complete else ("error", began, 200, "stream cut short"))
            except httpx.RemoteProtocolError as error:  # the router cut the stream short: an error, not a hang
                outcomes.append(("error", began, None, type(error).__name__))


def test_a_killed_replica_costs_only_its_requests_and_is_taken_back(fleet):
    stop, outcomes = threading.Event(), []
    clients = [threading.Thread(target=_client, args=(fleet.url, stop, outcomes, i)) for i in range(4)]
    for thread in clients:
        thread.start()
    time.sleep(2.0)
    [load] = httpx.get(fleet.workers[1] + "/get_load", headers=AUTH, timeout=10).json()
    assert load["num_reqs"] > 0, load  # the kill hits requests in flight
    killed = time.monotonic()
    fleet.kill(1)
    time.sleep(5.0)
    stop.set()
    for thread in clients:
        thread.join(TIMEOUT + 10)
    assert not any(thread.is_alive() for thread in clients), "a client hung"
    assert all(outcome[0] == "ok" and outcome[2] for outcome in outcomes if outcome[0] == "ok")
    errors = [outcome for outcome in outcomes if outcome[0] == "error"]
    assert all(began < killed + 1.0 for _, began, *_ in errors), errors   # only requests in flight at the kill
    assert len(errors) <= load["num_reqs"], errors
    assert sum(1 for outcome in outcomes if outcome[0] == "ok" and outcome[1] > killed + 1.0) >= 4, outcomes
    # back on its port: the router's health checks take it back, and it serves again
    fleet.start_replica(1)
    fleet.wait_replica(1)
    deadline = time.monotonic() + 30
    while not _served(fleet.workers[1]):
        assert time.monotonic() < deadline, "the router did not send the restarted replica any request in 30 s"
        response = httpx.post(fleet.url + "/v1/completions", json={"model": NAME, "prompt": PROMPT, "max_tokens": 2},
                              headers=AUTH, timeout=TIMEOUT)
        assert response.status_code == 200, response.text


def _dp2_job(*extra: str) -> tuple[int, list[str], dict[str, str]]:
    """``serve --dp-size 2`` of the tiny model under torchrun: (its --port, the command, its environment). The
    router's port, then each group's and the router's metrics (router_launch): four ports in a row, not the
    master's (a master port drawn after a lone free port was once the first group's: it could not bind)."""
    require_module("sglang_router", "sglang-router", 'pip install "specswap[router]"')
    master = free_port()
    port = free_port_block(4, avoid=(master,))
    env = dict(os.environ, OMP_NUM_THREADS="1", SPECSWAP_DIST_TIMEOUT="10", PYTHONPATH=_package_path())
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(master),
               "-m", "specswap.cli", "serve", "--dp-size", "2", "--model", "tiny", "--dtype", "float32",
               "--speculative-algorithm", "NGRAM", "--threads", "1", "--disable-cuda-graph", "--port", str(port),
               *extra]
    return port, command, env


def test_a_group_port_taken_ends_the_whole_dp_job_with_an_error_naming_it(tmp_path):
    """A data-parallel group whose port is taken is an error on every rank, naming the port (exit status 2): the
    group alone stopping left the others serving and the job running, its router never healthy."""
    port, command, env = _dp2_job()
    log = tmp_path / "job.log"
    with socket.socket() as taken, open(log, "w") as output:
        taken.bind(("127.0.0.1", port + 2))  # the second group's
        taken.listen()
        job = subprocess.Popen(command, env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            status = job.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(30)
            raise AssertionError("the job kept running with a group's port taken: " + log.read_text()[-3000:])
    text = log.read_text()
    assert status != 0 and f"group 1: --host 127.0.0.1 port {port + 2} cannot be bound" in text, text[-3000:]
    assert "ready on" not in text


def test_torchrun_serve_dp2_is_one_endpoint_behind_the_router(tmp_path):
    port, command, env = _dp2_job("--router-policy", "round_robin")
    log = tmp_path / "job.log"
    with open(log, "w") as output:
        job = subprocess.Popen(command, env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, job, 120, log)
        deadline = time.monotonic() + 30
        while len(httpx.get(url + "/workers", timeout=5).json()["workers"]) < 2:
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        answers = [httpx.post(url + "/v1/completions", timeout=TIMEOUT, json={"model": "tiny", "prompt": PROMPT,
                                                                              "max_tokens": 8, "temperature": 0})
                   for _ in range(4)]
        assert all(a.status_code == 200 for a in answers)
        assert len({a.json()["choices"][0]["text"] for a in answers}) == 1  # both groups answer alike
        served = [httpx.get(f"http://127.0.0.1:{port + 1 + g}/server_info", timeout=10).json() for g in range(2)]
        assert all(sum(info["requests_finished"].values()) == 2 for info in served), served  # round robin: 2 each
        assert "sglang-router (--router-policy round_robin)" in log.read_text()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(job.pid, signal.SIGTERM)
        try:
            job.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(30)
    with socket.socket() as sock:  # the router went with the job: nothing holds --port
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))


class _Group:
    """A DistributedGroup's face for ``place_groups``: ranks of two data-parallel groups of two tensor ranks."""

    def __init__(self, rank: int, others: list[dict]):
        self.rank, self.tp_size, self.tp_rank, self.dp_rank = rank, 2, rank % 2, rank // 2
        self.others = others

    def all_gather_object(self, obj, group="world"):
        assert group == "world"
        return [obj if r == self.rank else self.others[r] for r in range(4)]


def test_place_groups_follows_rank_0_and_names_every_leader(monkeypatch, capsys):
    from specswap.server import router_launch  # noqa: PLC0415

    monkeypatch.setattr(router_launch, "router_installed", lambda: True)
    everyone = [{"router": True, "host": "10.0.0.1"}, {"router": True, "host": None},
                {"router": False, "host": "10.0.0.2"}, {"router": True, "host": None}]
    first = router_launch.place_groups("10.0.0.1", 8000, _Group(0, everyone))
    assert first == router_launch.Placement(8001, ["http://10.0.0.1:8001", "http://10.0.0.2:8002"])
    assert router_launch.place_groups("10.0.0.2", 8000, _Group(2, everyone)) == router_launch.Placement(8002, None)
    # rank 0 without the extra: every group serves --port + its index, and rank 0 says why
    monkeypatch.setattr(router_launch, "router_installed", lambda: False)
    everyone[0]["router"] = False
    assert router_launch.place_groups("10.0.0.1", 8000, _Group(0, everyone)) == router_launch.Placement(8000, None)
    assert router_launch.place_groups("10.0.0.2", 8000, _Group(3, everyone)) == router_launch.Placement(8001, None)
    assert 'pip install "specswap[router]"' in capsys.readouterr().err
    command = router_launch.router_command(first.worker_urls, "::", 8000, "round_robin", "k")
    assert command[command.index("--worker-urls") + 1:command.index("--host")] == first.worker_urls
    assert command[command.index("--api-key") + 1] == "k" and command[command.index("--policy") + 1] == "round_robin"
    assert router_launch._url("::1", 80) == "http://[::1]:80"
