"""bench/bench_engine.py runs a native target as the Engine does by default: activations fp32 under ``--dtype auto``
(``loading.resolve_weights``) and the EAGLE head's linears as q8_0 blocks (draft quantization "auto" beside a native
target), not the dense head the dtype alone would pick (which made a draft step dearer than the Engine's)."""

import types

import torch

from scripts import load_script

bench_engine = load_script("bench_engine")


def _loaded(monkeypatch):
    import specswap.loading as loading  # noqa: PLC0415

    asked = {}

    def load_models(name, speculative_algorithm, dtype, weights):
        asked.update(dtype=dtype, weights=weights)
        return types.SimpleNamespace(target=object(), tokenizer=object())

    def load_draft(name, path, algorithm, target, quantization):
        asked.setdefault("quantization", {})[algorithm] = quantization
        return None

    monkeypatch.setattr(loading, "load_models", load_models)
    monkeypatch.setattr(loading, "load_draft", load_draft)
    return asked


def test_a_native_target_gets_the_engines_q8_0_head(monkeypatch):
    asked = _loaded(monkeypatch)
    bench_engine.load_models("gemma-3-270m", ["EAGLE", "NGRAM"], torch.float32, "auto", "native")
    assert asked["weights"] == "native"
    assert asked["quantization"] == {"EAGLE": "q8_0", "NGRAM": None}


def test_dense_weights_keep_the_dtypes_head(monkeypatch):
    asked = _loaded(monkeypatch)
    bench_engine.load_models("gemma-3-270m", ["EAGLE"], torch.float32, "auto", None)
    assert asked["weights"] == "fp32" and asked["quantization"] == {"EAGLE": None}


def test_native_activations_follow_the_engines_auto(monkeypatch):
    seen = {}

    def stop(name, algorithms, dtype, *rest):
        seen["dtype"] = dtype
        raise SystemExit(0)

    monkeypatch.setattr(bench_engine, "load_models", stop)
    for argv, dtype in ((["--weights", "native", "--dtype", "auto"], torch.float32),
                        (["--weights", "native", "--dtype", "bfloat16"], torch.bfloat16),
                        (["--dtype", "bfloat16"], torch.bfloat16)):
        monkeypatch.setattr("sys.argv", ["bench_engine.py", "--model", "gemma-3-270m", *argv])
        try:
            bench_engine.main()
        except SystemExit:
            pass
        assert seen.pop("dtype") == dtype, argv
