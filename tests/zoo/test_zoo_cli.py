"""`python -m specswap.zoo train gemma-3-270m-eagle` forwards to the resumable Gemma head trainer, then measures."""

from __future__ import annotations

import pytest

from specswap.zoo import __main__ as zoo_cli
from specswap.zoo import gemma_eagle


@pytest.fixture
def calls(monkeypatch):
    recorded = []
    monkeypatch.setattr(gemma_eagle, "main", lambda argv: recorded.append(list(argv)))
    return recorded


def test_gemma_head_training_is_forwarded_then_measured(calls, tmp_path):
    zoo_cli.main(["train", "gemma-3-270m-eagle", "--minutes", "5", "--work", str(tmp_path / "w"),
                  "--out", str(tmp_path / "o"), "--planned-steps", "30"])
    assert calls == [["--minutes", "5.0", "--work", str(tmp_path / "w"), "--out", str(tmp_path / "o"),
                      "--planned-steps", "30"],
                     ["--measure", "--work", str(tmp_path / "w"), "--out", str(tmp_path / "o")]]


def test_gemma_head_defaults_and_no_measure(calls):
    zoo_cli.main(["train", "gemma-3-270m-eagle", "--no-measure"])
    assert calls == [["--minutes", "100.0"]]


def test_unknown_family_is_refused(capsys):
    with pytest.raises(SystemExit):
        zoo_cli.main(["train", "gemma-3-270m"])
    assert "invalid choice" in capsys.readouterr().err


def test_gemma_head_measurement_refuses_bad_sizes_before_loading_anything(tmp_path):
    with pytest.raises(ValueError, match="new_tokens must be >= 1"):
        gemma_eagle.measure(tmp_path, tmp_path, new_tokens=0)
    torch = pytest.importorskip("torch")
    torch.save({"heldout": torch.zeros(24, 128, dtype=torch.long)}, tmp_path / "data.pt")
    with pytest.raises(ValueError, match="prompts_per_domain must be 1..12"):
        gemma_eagle.measure(tmp_path, tmp_path, prompts_per_domain=13)
