"""The phased benchmark: figures from recorded runs, the oracle, and end-to-end runs (in process, over HTTP)."""

import json

import pytest

from server_helpers import loaded_models, random_models, running_server
from specswap.adaptive_config import VALID_KEYS
from specswap.bench import report
from specswap.bench.cli import mode_settings, oracle_candidates, run_from_args
from specswap.bench.workloads import REPORT_HIGH_PROMPTS, REPORT_LOW_PROMPTS, build_workload
from specswap.capability import cpu_capability
from specswap.cli import build_parser, main


def _phase(name, tokens, seconds):
    return {"name": name, "tokens": tokens, "seconds": seconds, "throughput_tok_s": tokens / seconds}


def _mode(*phases):
    tokens = sum(p["tokens"] for p in phases)
    seconds = sum(p["seconds"] for p in phases)
    return {"phases": list(phases), "overall": {"throughput_tok_s": tokens / seconds}}


def test_oracle_takes_the_best_static_mode_per_phase():
    modes = {
        "baseline": _mode(_phase("low", 100, 1.0), _phase("high", 100, 1.0)),   # fastest in low: not a candidate
        "static1": _mode(_phase("low", 100, 2.0), _phase("high", 100, 1.0)),    # 50, 100
        "static3": _mode(_phase("low", 100, 4.0), _phase("high", 120, 0.5)),    # 25, 240
        "adaptive": _mode(_phase("low", 100, 2.5), _phase("high", 120, 0.6)),
    }
    best = report.oracle(modes)
    assert best["candidates"] == ["static1", "static3"]
    assert [(p["name"], p["mode"]) for p in best["phases"]] == [("low", "static1"), ("high", "static3")]
    assert best["phases"][1]["throughput_tok_s"] == pytest.approx(240.0)
    # switching perfectly: static1's low phase then static3's high phase, tokens over time
    assert best["overall"]["throughput_tok_s"] == pytest.approx((100 + 120) / (2.0 + 0.5))
    assert best["best_static"]["mode"] == "static1"  # overall 200 / 3.0 = 66.7 beats static3's 220 / 4.5 = 48.9
    ratios = report.ratios(modes, best)
    assert ratios["adaptive_vs_best_static"] == pytest.approx((220 / 3.1) / (200 / 3.0))
    assert ratios["adaptive_vs_oracle"] == pytest.approx((220 / 3.1) / (220 / 2.5))
    assert ratios["adaptive_vs_baseline"] == pytest.approx((220 / 3.1) / 100.0)
    assert report.oracle({"baseline": modes["baseline"]}) is None


def test_summarize_figures_from_a_recorded_run():
    run = {"phases": [
        {"name": "low", "start_s": 0.0, "end_s": 2.0, "requests": [
            {"latency_s": 1.0, "tokens": 10, "verify_rounds": 9, "accepted_draft_tokens": 0},
            {"latency_s": 2.0, "tokens": 10, "verify_rounds": 9, "accepted_draft_tokens": 0}]},
        {"name": "high", "start_s": 2.0, "end_s": 3.0, "requests": [
            {"latency_s": 1.0, "tokens": 40, "verify_rounds": 10, "accepted_draft_tokens": 30}]}],
        "trace": [[0.5, 1, 2, 0], [1.5, 1, 2, 0], [2.5, 3, 4, 1]]}
    summary = report.summarize(run)
    low, high = summary["phases"]
    assert low["throughput_tok_s"] == pytest.approx(10.0) and low["latency_s"] == pytest.approx(1.5)
    assert low["accept_length"] == pytest.approx(1.0)
    assert high["throughput_tok_s"] == pytest.approx(40.0) and high["accept_length"] == pytest.approx(4.0)
    assert summary["overall"]["throughput_tok_s"] == pytest.approx(60 / 3.0)
    assert summary["overall"]["accept_length"] == pytest.approx((30 + 28) / 28)
    assert summary["rounds_per_tier"] == {"1": 2, "3": 1} and summary["tier_switches"] == 1
    assert report.tier_string(summary["trace"], width=4) == "1113"


def _run(*phases):
    """A recorded run: (seconds, tokens) per phase, one request each, phases named low, high, ..."""
    recorded, start = [], 0.0
    for index, (seconds, tokens) in enumerate(phases):
        recorded.append({"name": ("low", "high")[index % 2], "start_s": start, "end_s": start + seconds,
                         "requests": [{"latency_s": seconds, "tokens": tokens, "verify_rounds": 4,
                                       "accepted_draft_tokens": 4}]})
        start += seconds
    return {"phases": recorded, "trace": [[0.1, 3, phases[0][1], 0]]}


def test_repeats_pool_tokens_and_time_per_phase():
    summary = report.summarize(report.pool_runs([_run((1.0, 10)), _run((2.0, 30))]))
    phase = summary["phases"][0]
    assert phase["throughput_tok_s"] == pytest.approx(40 / 3.0) and phase["requests"] == 2
    assert phase["latency_s"] == pytest.approx(1.5) and phase["accept_length"] == pytest.approx(2.0)
    assert phase["repeat_throughput_tok_s"] == pytest.approx([10.0, 15.0])  # each repeat's own
    assert summary["trace"] == [[0.1, 3, 10, 0]]
    assert report.summarize(_run((2.0, 30)))["phases"][0]["repeat_throughput_tok_s"] == pytest.approx([15.0])


def test_phase_ratios_pair_adaptive_with_the_oracle_mode_repeat_by_repeat():
    runs = {"static1": [_run((1.0, 50), (1.0, 100)), _run((1.0, 40), (1.0, 100))],     # low 45 pooled
            "static3": [_run((1.0, 20), (1.0, 200)), _run((1.0, 20), (1.0, 100))],     # high 150 pooled
            "adaptive": [_run((1.0, 45), (1.0, 160)), _run((1.0, 40), (1.0, 110))]}
    modes = {name: report.summarize(report.pool_runs(each)) for name, each in runs.items()}
    best = report.oracle(modes)
    ratios = report.phase_ratios(modes, best)
    assert [(p["name"], p["mode"]) for p in ratios] == [("low", "static1"), ("high", "static3")]
    assert ratios[0]["adaptive_vs_oracle"] == pytest.approx(85 / 90)
    assert ratios[0]["by_repeat"] == pytest.approx([45 / 50, 40 / 40])
    assert ratios[1]["adaptive_vs_oracle"] == pytest.approx(270 / 300)
    assert ratios[1]["by_repeat"] == pytest.approx([160 / 200, 110 / 100])  # repeat 2's static3 was slow
    assert [p["median"] for p in ratios] == pytest.approx([0.95, 0.95])
    # overall, repeat by repeat: each repeat's tokens over its seconds, the oracle's phases at their modes' repeat
    # (repeat 1: adaptive 45 + 160 tokens in 2 s, the oracle 50 + 200 in 2 s; repeat 2: 150 in 2 s, 140 in 2 s)
    assert report.oracle_by_repeat(modes, best) == pytest.approx([205 / 250, 150 / 140])
    assert report.ratios(modes, best)["adaptive_vs_oracle_median"] == pytest.approx((205 / 250 + 150 / 140) / 2)
    older = {name: {**mode, "phases": [{k: v for k, v in p.items() if k != "repeat_tokens"} for p in mode["phases"]]}
             for name, mode in modes.items()}  # a JSON from before repeats' tokens were kept: no median claimed
    assert report.oracle_by_repeat(older, best) == [] and "adaptive_vs_oracle_median" not in report.ratios(older, best)
    line = report.format_table({"modes": modes, "oracle": best, "phase_ratios": ratios}).splitlines()[-1]
    assert line == ("adaptive_vs_oracle per phase: 0:low 0.944x (median 0.950, 0.900-1.000 over 2 repeats), "
                    "1:high 0.900x (median 0.950, 0.800-1.100 over 2 repeats)")
    assert report.phase_ratios({"static1": modes["static1"]}, best) == []  # no adaptive mode: nothing to pair


def test_workloads_alternate_and_do_not_replay_prompts():
    phases = build_workload("transition", 3)
    assert [p.name for p in phases] == ["low", "high", "low", "high"]
    assert phases[0].temperature == 1.0 and phases[1].temperature == 0.0
    assert phases[0].prompts == tuple(REPORT_LOW_PROMPTS[:3]) and phases[2].prompts == tuple(REPORT_LOW_PROMPTS[3:6])
    assert phases[3].prompts == tuple(REPORT_HIGH_PROMPTS[3:6])
    with pytest.raises(ValueError, match="unknown workload"):
        build_workload("medium", 2)


def test_modes_default_to_the_candidates_and_reject_unknown_names():
    assert list(mode_settings(None, "NGRAM", [1, 3, 7], 3, None)) == ["baseline", "static1", "static3", "static7",
                                                                      "adaptive"]
    assert list(mode_settings(["static2", "adaptive"], "EAGLE", [1, 3], 3, None)) == ["static2", "adaptive"]
    assert list(mode_settings(None, None, [1, 3, 7], 3, None)) == ["baseline"]
    with_trees = mode_settings(None, "EAGLE", [1, 2], 2, None, [(3, 2, 6)])  # a config's trees are static modes
    assert list(with_trees) == ["baseline", "static1", "static2", "tree3x2x6", "adaptive"]
    assert with_trees["tree3x2x6"] == {"speculative_algorithm": "EAGLE", "speculative_num_steps": 3,
                                       "speculative_eagle_topk": 2, "speculative_num_draft_tokens": 6}
    with pytest.raises(ValueError, match="unknown bench mode"):
        mode_settings(["static3", "fast"], "NGRAM", [1, 3, 7], 3, None)
    # a second adaptive config beside the first, interleaved with it (tuning one against the other)
    both = mode_settings(["adaptive", "adaptive:configs/goodput.json"], "NGRAM", [1, 3], 3, None)
    assert both["adaptive"]["speculative_adaptive_config"] is None
    assert both["adaptive:configs/goodput.json"] == {**both["adaptive"],
                                                     "speculative_adaptive_config": "configs/goodput.json"}
    hybrid = mode_settings(["adaptive:configs/goodput-eagle-trees.json@EAGLE+SUFFIX"], "NGRAM", [1, 3], 3, None)
    assert hybrid["adaptive:configs/goodput-eagle-trees.json@EAGLE+SUFFIX"] == {
        **both["adaptive"], "speculative_algorithm": "EAGLE", "hybrid_drafter": "SUFFIX",
        "speculative_adaptive_config": "configs/goodput-eagle-trees.json"}


def test_a_mode_at_another_drafter_runs_beside_the_loaded_one():
    """<mode>@<ALGORITHM>: the same weights drafted another way (SUFFIX beside EAGLE; the hybrid), interleaved;
    the oracle stays the run's own algorithm's."""
    modes = mode_settings(["baseline", "adaptive", "adaptive@SUFFIX", "adaptive@eagle+suffix", "static3@SUFFIX"],
                          "EAGLE", [1, 3], 3, None)
    assert modes["adaptive"]["speculative_algorithm"] == "EAGLE" and "hybrid_drafter" not in modes["adaptive"]
    assert modes["adaptive@SUFFIX"] == {**modes["adaptive"], "speculative_algorithm": "SUFFIX"}
    assert modes["adaptive@eagle+suffix"] == {**modes["adaptive"], "hybrid_drafter": "SUFFIX"}
    assert modes["static3@SUFFIX"] == {"speculative_algorithm": "SUFFIX", "speculative_num_steps": 3}
    assert oracle_candidates({**modes, "static1": {}}) == ["static1", "baseline"]
    with pytest.raises(ValueError, match="unknown bench mode"):
        mode_settings(["fast@SUFFIX"], "EAGLE", [1, 3], 3, None)


def _args(tmp_path, *extra):
    return build_parser().parse_args([
        "bench", "--requests-per-phase", "2", "--max-new-tokens", "12", "--concurrency", "2", "--no-progress",
        "--output", str(tmp_path / "results.json"), "--plot", str(tmp_path / "plot.png"), *extra])


def _check_schema(result, modes, phases=("low", "high", "low", "high")):
    assert list(result["modes"]) == list(modes)
    for name in modes:
        mode = result["modes"][name]
        assert set(mode["overall"]) >= {"throughput_tok_s", "latency_s", "accept_length", "tokens", "seconds"}
        assert [p["name"] for p in mode["phases"]] == list(phases)
        assert all(p["throughput_tok_s"] > 0 for p in mode["phases"])
        assert mode["trace"] and all(len(row) == 4 for row in mode["trace"])


def test_bench_in_process_writes_json_schema_and_plot(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SPECSWAP_ROW_COSTS", "off")  # the default's tiers without a table: 1, 3, 7 for a lookup
    args = _args(tmp_path, "--speculative-adaptive-config", _config(tmp_path), "--repeats", "2")
    assert run_from_args(args, loaded_models("NGRAM")) == 0
    result = json.loads((tmp_path / "results.json").read_text())
    _check_schema(result, ["baseline", "static1", "static3", "static7", "adaptive"])
    assert result["prompt_set"] == "report"  # the default: prompts kept apart from tuning
    assert result["command"] and result["cpu"] and result["commit"]  # provenance the docs' citations need
    assert result["modes"]["baseline"]["overall"]["accept_length"] == 1.0
    assert result["modes"]["adaptive"]["overall"]["requests"] == 2 * 4 * 2  # 2 per phase, 4 phases, 2 repeats
    assert result["modes"]["static3"]["rounds_per_tier"].keys() == {"3"}
    assert "adaptive_config" not in result["modes"]["static3"]  # no policy ran
    ran = result["modes"]["adaptive"]["adaptive_config"]  # the config the engine read, every field
    assert ran["candidate_steps"] == [1, 3] and ran["warmup_batches"] == 0 and ran["update_interval"] == 1
    assert set(ran) == set(VALID_KEYS)
    assert result["oracle"]["candidates"] == ["static1", "static3", "static7", "baseline"]
    assert len(result["oracle"]["phases"]) == 4
    assert {"adaptive_vs_baseline", "adaptive_vs_best_static", "adaptive_vs_oracle"} <= set(result["ratios"])
    assert [p["mode"] for p in result["phase_ratios"]] == [p["mode"] for p in result["oracle"]["phases"]]
    assert all(len(p["by_repeat"]) == 2 for p in result["phase_ratios"])
    assert all(len(p["repeat_throughput_tok_s"]) == 2 for p in result["modes"]["static1"]["phases"])
    assert (tmp_path / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = capsys.readouterr().out
    assert "oracle" in out and "adaptive" in out and "tier over time" in out
    assert "adaptive_vs_oracle per phase: 0:low " in out and "over 2 repeats" in out
    line = cpu_capability().describe()
    assert out.splitlines()[0] == line and result["cpu"] == line
    assert result["cpu_capability"] == cpu_capability().as_dict()


def test_trace_estimates_records_the_policy_s_view_each_step_of_each_repeat(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECSWAP_ROW_COSTS", "off")
    args = _args(tmp_path, "--speculative-adaptive-config", _config(tmp_path), "--repeats", "2",
                 "--modes", "static3", "adaptive", "--trace-estimates")
    assert run_from_args(args, loaded_models("NGRAM")) == 0
    result = json.loads((tmp_path / "results.json").read_text())
    assert "estimates_by_repeat" not in result["modes"]["static3"]  # no policy: nothing to record
    repeats = result["modes"]["adaptive"]["estimates_by_repeat"]
    assert len(repeats) == 2 and len(repeats[0]) == len(result["modes"]["adaptive"]["trace"])
    for (t_s, tier, batch, phase, chains), step in zip(repeats[0], result["modes"]["adaptive"]["trace"]):
        assert t_s == step[0] and tier == step[1] and phase == step[3]
        assert tier in (1, 3) and 1 <= batch <= 2 and set(chains) == {"1", "3"}
        assert all(tokens >= 1.0 and ms > 0 for tokens, ms in chains.values())


def _config(tmp_path):
    path = tmp_path / "adaptive.json"
    path.write_text(json.dumps({"candidate_steps": [1, 3], "warmup_batches": 0, "update_interval": 1}))
    return str(path)


def test_bench_against_a_running_server(tmp_path):
    from specswap.engine import Engine
    from specswap.server.app import create_app
    from server_helpers import CharTokenizer
    target, _ = random_models()
    engine = Engine(target, None, "NGRAM", speculative_num_steps=3, max_batch_size=2, max_seq_len=512,
                    tokenizer=CharTokenizer())
    seen = []  # what each request asked of the engine: the bench's default runs every request to max_new_tokens
    add_request = engine.add_request
    engine.add_request = lambda prompt, params=None, **kwargs: seen.append(params.ignore_eos) or add_request(
        prompt, params, **kwargs)
    with running_server(create_app(engine, "random", api_key="k")) as url:
        args = _args(tmp_path, "--server", f"static3={url}", "--api-key", "k", "--workload", "high")
        assert run_from_args(args) == 0
    assert seen == [True, True]
    result = json.loads((tmp_path / "results.json").read_text())
    assert result["settings"]["ignore_eos"] is True
    _check_schema(result, ["static3"], phases=("high",))
    assert result["modes"]["static3"]["overall"]["accept_length"] >= 1.0
    assert result["oracle"]["phases"][0]["mode"] == "static3"


def test_cli_errors_are_reported_before_loading_anything(tmp_path, capsys):
    assert main(["bench", "--speculative-eagle-topk", "4"]) == 2
    assert "runs draft trees as modes" in capsys.readouterr().err
    assert main(["serve", "--speculative-adaptive-config", _config(tmp_path)]) == 2
    assert "without --speculative-adaptive" in capsys.readouterr().err
    assert main(["serve", "--speculative-adaptive", "--speculative-adaptive-config", str(tmp_path / "no.json")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["bench", "--requests-per-phase", "0"]) == 2


def test_the_oracle_s_candidates_do_not_depend_on_the_adaptive_config(tmp_path, monkeypatch):
    """The oracle switches among speculation off and every static mode, whatever the config names: the default
    policy may turn speculation off, so the oracle may too, and the static modes hold each chain the default may
    choose on this machine (its row costs) beside the config's own chains and trees. Tree modes are static modes."""
    from specswap.bench.cli import machine_tiers, oracle_candidates
    from specswap.worker import row_cost

    modes = {name: {} for name in ("baseline", "static1", "static3", "tree3x2x6", "adaptive")}
    assert oracle_candidates(modes) == ["static1", "static3", "tree3x2x6", "baseline"]
    assert oracle_candidates({"static1": {}, "adaptive": {}}) == ["static1"]
    models = loaded_models("NGRAM")
    table = {1: 1.0, 2: 1.084, 4: 1.157, 6: 1.239, 8: 1.327}  # the AMX Xeon's: a lookup's default is 0, 1, 3, 7
    monkeypatch.setattr(row_cost, "resolve_row_costs", lambda *a, **k: row_cost.RowCosts(table, "given"))
    without_zero, trees, sglang = tmp_path / "plain.json", tmp_path / "trees.json", tmp_path / "sglang.json"
    without_zero.write_text(json.dumps({"policy": "goodput", "candidate_steps": [2, 4]}))
    trees.write_text(json.dumps({"policy": "goodput", "candidate_steps": [0, 1], "candidate_trees": [[3, 2, 6]]}))
    sglang.write_text(json.dumps({"candidate_steps": [1, 3]}))
    assert machine_tiers(models, None) == ([1, 3, 7], [])
    assert machine_tiers(models, str(without_zero)) == ([1, 2, 3, 4, 7], [])
    assert machine_tiers(models, str(trees)) == ([1, 3, 7], [(3, 2, 6)])
    assert machine_tiers(models, str(sglang)) == ([1, 3, 7], [])
    assert machine_tiers(loaded_models(None), None) == ([], [])
    baseline_wins_low = {
        "baseline": _mode(_phase("low", 100, 1.0), _phase("high", 100, 1.0)),
        "static1": _mode(_phase("low", 100, 2.0), _phase("high", 100, 0.5)),
    }
    best = report.oracle(baseline_wins_low, oracle_candidates(baseline_wins_low))
    assert [p["mode"] for p in best["phases"]] == ["baseline", "static1"]


class _FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class _FakeEngine:
    """Each step costs ``step_seconds`` on the fake clock and emits one token per running request; requests end
    after ``tokens`` tokens."""

    speculative_algorithm = None

    def __init__(self, name, clock, step_seconds, tokens, log, eos_after=None):
        self.name, self.clock, self.step_seconds, self.tokens, self.log = name, clock, step_seconds, tokens, log
        self.eos_after = eos_after  # a request not ignoring EOS meets it after this many tokens
        self.running, self.next_id, self.limits = {}, 0, {}

    def add_request(self, prompt, **kwargs):
        self.next_id += 1
        self.running[self.next_id] = []
        stops_early = self.eos_after is not None and not kwargs.get("ignore_eos", False)
        self.limits[self.next_id] = self.eos_after if stops_early else self.tokens
        return self.next_id

    def step(self):
        from types import SimpleNamespace
        self.clock.now += self.step_seconds
        self.log.append(self.name)
        outputs = []
        for request_id, tokens in list(self.running.items()):
            tokens.append(7)
            finished = len(tokens) == self.limits[request_id]
            outputs.append(SimpleNamespace(request_id=request_id, token_ids=list(tokens), finished=finished,
                                           num_verify_rounds=len(tokens), accept_lengths=[0] * len(tokens)))
            if finished:
                del self.running[request_id]
        return SimpleNamespace(outputs=outputs, tier=0)


def test_modes_run_interleaved_step_by_step_each_on_its_own_clock(monkeypatch):
    """One engine step of each mode in turn (the order rotating each phase), and a mode's clock counts only its
    own steps: a slow mode's steps between two of a fast mode's never count against the fast one."""
    import argparse

    import specswap.bench.runner as runner_module
    import specswap.cli_flags as cli_flags
    from specswap.bench.cli import run_in_process

    clock, log = _FakeClock(), []
    seconds = {"fast": 1.0, "slow": 3.0}
    monkeypatch.setattr(runner_module.time, "perf_counter", clock)
    monkeypatch.setattr(cli_flags, "build_engine",
                        lambda models, speculative_algorithm, **kwargs: _FakeEngine(speculative_algorithm, clock,
                                                                               seconds[speculative_algorithm], 4, log))
    phases = build_workload("transition", 2, 1.0, "tune")[:2]
    args = argparse.Namespace(max_batch_size=2, concurrency=2, max_new_tokens=4, seed=0, repeats=1, warmup=0,
                              max_seq_len=None, ignore_eos=True)
    modes = {"fast": {"speculative_algorithm": "fast"}, "slow": {"speculative_algorithm": "slow"}}
    summaries = run_in_process(None, args, modes, phases, _Progress())
    # phase 0: fast, slow, fast, slow ...; phase 1 rotates: slow first
    assert log == ["fast", "slow"] * 4 + ["slow", "fast"] * 4
    for name, step in seconds.items():
        for phase in summaries[name]["phases"]:  # 2 requests of 4 tokens, 4 steps of the mode's own time
            assert phase["throughput_tok_s"] == pytest.approx(8 / (4 * step))


class _Progress:
    def update(self, n):
        pass

    def set_description(self, text):
        pass


@pytest.mark.parametrize("ignore_eos", [True, False])
def test_ignore_eos_runs_every_request_to_max_new_tokens(monkeypatch, ignore_eos):
    """The bench's default (SGLang's bench_serving's too): every mode does the same work, whichever of them a
    sampled text would have ended early; --no-ignore-eos lets each request stop at its end-of-sequence token."""
    import argparse

    import specswap.bench.runner as runner_module
    import specswap.cli_flags as cli_flags
    from specswap.bench.cli import run_in_process

    clock = _FakeClock()
    monkeypatch.setattr(runner_module.time, "perf_counter", clock)
    monkeypatch.setattr(cli_flags, "build_engine", lambda models, speculative_algorithm, **kwargs: _FakeEngine(
        speculative_algorithm, clock, 1.0, 6, [], eos_after=2))
    args = argparse.Namespace(max_batch_size=2, concurrency=2, max_new_tokens=6, seed=0, repeats=1, warmup=0,
                              max_seq_len=None, ignore_eos=ignore_eos)
    phases = build_workload("transition", 2, 1.0, "tune")[:2]
    summaries = run_in_process(None, args, {"a": {"speculative_algorithm": "a"}}, phases, _Progress())
    assert [p["tokens"] for p in summaries["a"]["phases"]] == [2 * (6 if ignore_eos else 2)] * 2
    assert build_parser().parse_args(["bench"]).ignore_eos is True
    assert build_parser().parse_args(["bench", "--no-ignore-eos"]).ignore_eos is False


@pytest.mark.parametrize("step_by_step", [False, True])
def test_the_a_a_script_times_each_engine_on_its_own_clock(monkeypatch, step_by_step):
    """bench/bench_interleave_aa.py: under either schedule an engine twice as slow a step gives A/B 2.0."""
    import specswap.bench.runner as runner_module
    from scripts import load_script

    aa = load_script("bench_interleave_aa")
    clock, log = _FakeClock(), []
    monkeypatch.setattr(runner_module.time, "perf_counter", clock)
    engines = [_FakeEngine("a", clock, 2.0, 4, log), _FakeEngine("b", clock, 1.0, 4, log)]
    phase = build_workload("transition", 2, 1.0, "tune")[0]
    assert aa.one_phase(engines, 0, phase, step_by_step, 2, 4) == pytest.approx(0.5)
    assert log == (["a", "b"] * 4 if step_by_step else ["a"] * 4 + ["b"] * 4)


def test_the_collector_runs_between_timed_runs_and_frees_what_it_froze_before():
    """collect_outside_clocks frees start-up garbage, freezes what is alive (no generation-2 collection scans it
    in a timed step), and on its next call frees what the last call froze that was dropped since (a repeat's
    engines): it never keeps a dropped engine alive."""
    import gc
    import weakref

    from specswap.bench.timing import collect_outside_clocks

    class Node:
        pass

    def cycle():
        node = Node()
        node.self = node
        return node

    garbage = cycle()
    freed = weakref.ref(garbage)
    del garbage
    kept = cycle()
    frozen_then_dropped = weakref.ref(kept)
    try:
        collect_outside_clocks()
        assert freed() is None and frozen_then_dropped() is not None
        assert gc.get_freeze_count() > 1000
        del kept
        gc.collect()
        assert frozen_then_dropped() is not None  # frozen: the collector leaves it alone
        collect_outside_clocks()
        assert frozen_then_dropped() is None
    finally:
        gc.unfreeze()
