"""bench/bench_agreement.py on tiny inputs: two ranks start, the JSON carries its provenance and both timings."""

import json

from scripts import load_script

from specswap.distributed.agreement import Observation


def test_bench_agreement_writes_its_report(tmp_path):
    bench = load_script("bench_agreement")
    out = tmp_path / "agreement.json"
    assert bench.main(["--world", "2", "--steps", "20", "--warmup", "2", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert {"command", "cpu", "commit"} <= set(report)
    assert report["world"] == 2 and report["steps"] == 20
    assert report["vector_bytes"] == Observation.width(8) * 8  # float64s: 8 bins for tiers 0-7
    for key in ("agreement", "bare_all_gather"):
        assert 0 < report[key]["median_us"] <= report[key]["p99_us"], report[key]
