"""bench/bench_qlinear.py: a smoke run on tiny shapes writes a JSON with its provenance and every cell."""

import json

import pytest
from scripts import load_script

from components import require_native_kernels
from specswap.models import quantized

require_native_kernels()


def load():
    return load_script("bench_qlinear")


def test_quick_run_writes_every_cell_with_its_provenance(tmp_path, capsys):
    bench = load()
    path = tmp_path / "qlinear.json"
    report = bench.main(["--quick", "--bf16", "on", "--json", str(path)])
    written = json.loads(path.read_text())
    assert written == json.loads(json.dumps(report))
    assert {"command", "cpu", "commit"} <= set(written)
    assert written["command"].endswith("bench_qlinear.py --quick --bf16 on --json " + str(path))
    assert written["cpu"] and written["commit"]
    assert written["threads"] == 1 and written["rows"] == [1, 2]
    cells = {(r["shape"], r["backend"], r["rows"]): r for r in written["results"]}
    from specswap._core import _C
    fast = _C.ggml_fast_kernels_available()
    ours = {"ggml vec_dot"} if fast else set()  # our kernels against ggml's, where our kernels exist
    layout = {"interleaved"} if quantized.repack_default() else set()  # Q8_0 and Q4_K repacked by eight rows
    expected_backends = {"64x256:Q8_0": {"ggml", "torch fp32", "torch bf16"} | ours | layout,
                         "32x256:Q4_K": {"ggml", "torch fp32", "torch bf16"} | ours | layout,
                         "32x256:Q5_K": {"ggml", "torch fp32", "torch bf16"}}  # no multi-row kernel for Q5_K
    for shape, backends in expected_backends.items():
        assert {b for s, b, _ in cells if s == shape} == backends, shape
        for backend in backends:
            one, two = cells[shape, backend, 1], cells[shape, backend, 2]
            assert one["ratio_to_one_row"] == 1.0 and one["ms"] > 0 and two["ms"] > 0
            assert two["ratio_to_one_row"] == pytest.approx(two["ms"] / one["ms"], rel=0.01, abs=0.002)
    assert cells["64x256:Q8_0", "ggml", 1]["weight_bytes"] == 64 * 272  # 8 Q8_0 blocks of 34 bytes a row
    if layout:
        assert cells["64x256:Q8_0", "interleaved", 1]["weight_bytes"] == 64 * 272  # the same bytes, rearranged
    table = capsys.readouterr().out
    assert "64x256:Q8_0 64x256 Q8_0" in table and "2 rows" in table


def test_bad_options_name_the_value():
    bench = load()
    with pytest.raises(SystemExit, match="'12x7' is neither a Gemma shape"):
        bench.main(["--shapes", "12x7"])
    with pytest.raises(SystemExit, match="type 'Q9' is not one of"):
        bench.main(["--shapes", "64x256:Q9"])
    with pytest.raises(SystemExit, match="--rows must be comma-separated positive integers, got '0,2'"):
        bench.main(["--rows", "0,2"])
    with pytest.raises(SystemExit, match="--threads must be at least 1, got 0"):
        bench.main(["--threads", "0"])
