"""bench/bench_serving_load.py: a few seconds of load on the tiny pair write a JSON with its provenance, latency
percentiles, the 503 rate and the server's memory, and the server drains and exits 0."""

import json

import pytest
from scripts import load_script

from specswap import zoo

pytestmark = pytest.mark.skipif(
    not all((zoo.path(name) / "model.safetensors").is_file() for name in ("tiny", "tiny-eagle")),
    reason="tiny zoo weights are not built (python -m specswap.zoo train tiny)")


def test_short_run_reports_latency_rejections_and_memory(tmp_path, capsys):
    bench = load_script("bench_serving_load")
    path = tmp_path / "load.json"
    serve = ["--model", "tiny", "--speculative-algorithm", "EAGLE", "--threads", "1", "--disable-cuda-graph",
             "--max-running-requests", "1", "--max-queued-requests", "1"]
    report = bench.main(["--clients", "4", "--minutes", "0.05", "--max-tokens", "16", "--warmup", "1",
                         "--deadline-fraction", "0.25", "--json", str(path), "--", *serve])
    written = json.loads(path.read_text())
    assert written == json.loads(json.dumps(report))
    assert {"command", "cpu", "commit"} <= set(written)
    assert written["clients"] == 4 and written["attempts"] == sum(written["status_counts"].values()) > 0
    assert set(written["status_counts"]) <= {"200", "503"}, written["status_counts"]  # no 5xx, no client errors
    assert written["server_errors_5xx"] == 0 and written["incomplete_streams"] == 0
    # 4 clients over 2 places: some are turned away, and the rate says how many
    assert written["status_counts"].get("503", 0) > 0
    assert written["rate_503"] == pytest.approx(written["status_counts"]["503"] / written["attempts"], abs=1e-4)
    latency = written["latency_s"]
    assert latency["n"] == written["status_counts"]["200"] and 0 < latency["p50"] <= latency["p95"] <= latency["p99"]
    rss = written["server_rss_mib"]
    assert rss["before"] > 0 and rss["after"] > 0 and rss["peak"] >= rss["after"]
    assert written["server"]["max_running_requests"] == 1 and written["server"]["requests_rejected"]["queue_full"] > 0
    assert written["exit_code"] == 0 and "drained in" in written["drained"]
    assert "--port <port>" in written["server_command"]
    assert "503 rate" in capsys.readouterr().out


def test_bad_options_are_refused():
    bench = load_script("bench_serving_load")
    with pytest.raises(SystemExit):
        bench.main(["--clients", "0"])
    with pytest.raises(SystemExit):
        bench.main(["--stream-fraction", "2"])
