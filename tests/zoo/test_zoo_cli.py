"""`python -m specswap.zoo train eagle --target T` (and its Gemma alias `train gemma-3-270m-eagle`) forwards to the
resumable head trainer, then measures."""

from __future__ import annotations

import pytest

from specswap.zoo import __main__ as zoo_cli
from specswap.zoo import eagle_training


@pytest.fixture
def calls(monkeypatch):
    recorded = []
    monkeypatch.setattr(eagle_training, "main", lambda argv: recorded.append(list(argv)))
    return recorded


def test_gemma_head_training_is_forwarded_then_measured(calls, tmp_path):
    zoo_cli.main(["train", "gemma-3-270m-eagle", "--minutes", "5", "--work", str(tmp_path / "w"),
                  "--out", str(tmp_path / "o"), "--planned-steps", "30"])
    location = ["--target", "gemma-3-270m", "--work", str(tmp_path / "w"), "--out", str(tmp_path / "o")]
    assert calls == [["--minutes", "5.0", *location, "--planned-steps", "30"], ["--measure", *location]]


def test_gemma_head_defaults_and_no_measure(calls):
    zoo_cli.main(["train", "gemma-3-270m-eagle", "--no-measure"])
    assert calls == [["--minutes", "100.0", "--target", "gemma-3-270m"]]


def test_any_registry_target_is_forwarded(calls):
    zoo_cli.main(["train", "eagle", "--target", "smollm2-135m", "--minutes", "3", "--no-measure"])
    assert calls == [["--minutes", "3.0", "--target", "smollm2-135m"]]


@pytest.mark.parametrize("argv, message", [
    (["train", "eagle", "--target", "no-such-model"], "supported targets are gemma-3-270m, smollm2-135m"),
    (["train", "gemma-3-270m-eagle", "--target", "smollm2-135m"], "use train eagle"),
    (["train", "tiny", "--target", "smollm2-135m"], "--target is for train eagle"),
])
def test_bad_targets_are_refused_before_anything_runs(calls, capsys, argv, message):
    with pytest.raises(SystemExit):
        zoo_cli.main(argv)
    assert message in capsys.readouterr().err and not calls


def test_the_trainer_defaults_follow_the_target():
    assert eagle_training.default_out("smollm2-135m").name == "smollm2-135m-eagle"
    assert eagle_training.default_work("smollm2-135m").name == "smollm2-135m-eagle-run"
    with pytest.raises(ValueError, match="supported: gemma-3-270m, smollm2-135m"):
        eagle_training.check_target("llama-3")


def test_unknown_family_is_refused(capsys):
    with pytest.raises(SystemExit):
        zoo_cli.main(["train", "gemma-3-270m"])
    assert "invalid choice" in capsys.readouterr().err


def test_gemma_head_measurement_refuses_bad_sizes_before_loading_anything(tmp_path):
    with pytest.raises(ValueError, match="new_tokens must be >= 1"):
        eagle_training.measure(tmp_path, tmp_path, new_tokens=0)
    with pytest.raises(ValueError, match="prompts_per_domain must be >= 1"):
        eagle_training.measure(tmp_path, tmp_path, prompts_per_domain=0)


def test_heldout_prompts_are_the_stored_windows_then_more_drawn_from_the_heldout_split():
    torch = pytest.importorskip("torch")
    stored = torch.arange(4 * 8).reshape(4, 8)  # 2 code windows, then 2 prose windows
    data = {"heldout": stored}
    streams = {"code": torch.arange(1000, 1400), "prose": torch.arange(5000, 5300)}
    calls = []

    def heldout_streams():
        calls.append(1)
        return streams

    few = eagle_training.heldout_prompts(data, 2, 6, heldout_streams)
    assert torch.equal(few["code"], stored[:2, :6]) and torch.equal(few["prose"], stored[2:, :6])
    assert not calls  # the stored windows suffice: the corpus is not rebuilt
    more = eagle_training.heldout_prompts(data, 5, 6, heldout_streams)
    again = eagle_training.heldout_prompts(data, 5, 6, heldout_streams)
    for domain, first in (("code", 1000), ("prose", 5000)):
        assert more[domain].shape == (5, 6)
        assert torch.equal(more[domain][:2], few[domain])  # the stored ones first, so earlier figures stay comparable
        extra = more[domain][2:]
        assert ((extra >= first) & (extra < first + len(streams[domain]))).all()  # from that domain's held-out split
        assert (extra[:, 1:] - extra[:, :-1] == 1).all()  # contiguous windows
        assert torch.equal(more[domain], again[domain])  # seeded: both heads are measured on the same prompts
