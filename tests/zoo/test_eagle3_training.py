"""The EAGLE-3 training recipe on the tiny target: the unrolled training forward is what the head computes at draft
steps 1..3 at run time; a handful of steps in checkpointed chunks that resume where they stopped, features cached
once, and a shipped head that loads and decodes losslessly."""

import json
import sys
import sysconfig
from pathlib import Path

import pytest
import torch

from specswap.zoo import eagle3_training as recipe_module
from specswap.zoo.data import Corpus
from specswap.zoo.eagle3_training import Eagle3Recipe, make_head, train, unrolled

torch.set_num_threads(1)

TINY = Path(recipe_module.__file__).resolve().parent / "weights" / "tiny" / "config.json"
needs_tiny = pytest.mark.skipif(not TINY.is_file(), reason="tiny zoo weights not built")

SMALL = Eagle3Recipe(draft_vocab=512, seq_len=32, feature_windows=8, shard_windows=4, feature_batch=4,
                     heldout_windows=4, train_batch=2, ttt_steps=3, chunk_steps=2, eval_every_chunks=1,
                     planned_steps=6, self_prompt_tokens=16, save_dtype="float32")


def small_corpus() -> Corpus:
    """A few stdlib files as code and their docstring paragraphs as prose, split by hand (both splits filled)."""
    corpus = Corpus()
    root = Path(sysconfig.get_paths()["stdlib"])
    for index, name in enumerate(["textwrap.py", "bisect.py", "shlex.py", "fnmatch.py", "colorsys.py", "heapq.py"]):
        source = (root / name).read_text()
        split = "heldout" if index % 3 == 2 else "train"
        corpus.documents["code"][split].append(source)
        corpus.documents["prose"][split].extend(p for p in source.split('"""')[1::2] if len(p) > 40)
    return corpus


TOKEN_MAP = torch.arange(0, 2048, 4)


def tiny_head(length: int, seed: int = 0, **head_options):
    """The tiny target, a head made for it (``make_head`` options), 2 random token windows [2, length] and the
    target's fused features there [2, length, 3H]."""
    from specswap.zoo.eagle3_training import load_target
    target, _ = load_target("tiny", torch.float32)
    torch.manual_seed(seed)
    head = make_head(target, TOKEN_MAP, **head_options)
    tokens = torch.randint(0, 2048, (2, length))
    with torch.no_grad():
        fused = target(tokens, torch.arange(length).expand(2, -1), None, None, with_logits=False,
                       aux_points=head.capture_points).hidden
    return target, head, tokens, fused


@needs_tiny
def test_the_unrolled_training_forward_is_the_run_time_draft_chain():
    target, head, tokens, fused = tiny_head(12)
    with torch.no_grad():
        steps = unrolled(head, tokens, fused, 3)
        for q in (0, 4, 7):  # entry q: a cache over head positions 0..q (target features), then draft steps
            cache = head.make_cache(2, 16)
            slots = torch.arange(2)
            out = head(tokens[:, 1:q + 2], fused[:, :q + 1], torch.arange(q + 1).expand(2, -1), cache, slots)
            torch.testing.assert_close(out.logits[:, -1], steps[0][:, q], atol=1e-4, rtol=1e-4)
            hidden = out.hidden[:, -1:]
            for step in (2, 3):  # feeds x_{q+step} (teacher-forced draft) and its own hidden at q + step - 1
                out = head(tokens[:, q + step:q + step + 1], hidden, torch.full((2, 1), q + step - 1), cache, slots)
                torch.testing.assert_close(out.logits[:, 0], steps[step - 1][:, q], atol=1e-4, rtol=1e-4)
                hidden = out.hidden


@needs_tiny
@pytest.mark.parametrize("last_layer", [False, True])
def test_a_warm_started_head_is_the_targets_early_exit_at_its_highest_capture_point(last_layer):
    layers = 4  # the tiny target's
    aux = (0, 1, layers - 1) if last_layer else None  # the last layer's output: the head starts as the target
    target, head, tokens, fused = tiny_head(10, warm_start=True, aux_layer_ids=aux)
    token_map = TOKEN_MAP
    assert target.config.num_hidden_layers == layers
    assert max(head.capture_points) == (layers if last_layer else max(2, layers // 2, layers - 3))
    positions = torch.arange(10).expand(2, -1)
    highest = max(head.capture_points)
    with torch.no_grad():
        exit_hidden = target(tokens, positions, None, None, with_logits=False, aux_points=(highest,)).hidden
        expected = target.lm_head(target.model.norm(exit_hidden))[..., token_map]
        logits = unrolled(head, tokens, fused, 1)[0]
    torch.testing.assert_close(logits, expected[:, :-1], atol=1e-4, rtol=1e-4)
    if last_layer:  # the stream the final norm reads: the warm head's logits are the target's own
        with torch.no_grad():
            own = target(tokens, positions, None, None).logits[..., token_map]
        torch.testing.assert_close(logits, own[:, :-1], atol=1e-4, rtol=1e-4)
    cold = make_head(target, token_map)
    assert not torch.equal(cold.lm_head.weight, head.lm_head.weight)


@needs_tiny
def test_training_in_chunks_resumes_and_ships_a_lossless_head(tmp_path, capfd):
    work, out = tmp_path / "work", tmp_path / "out"
    corpus = small_corpus()
    first = train(5, work, out, SMALL, "tiny", corpus=corpus, max_chunks=1)
    assert first["steps"] == 2 and first["chunks"] == 1
    shards = sorted(work.glob("features-*.pt"))
    assert len(shards) == 2 and (work / "heldout.pt").is_file()
    stamps = [path.stat().st_mtime_ns for path in shards]
    shard = torch.load(shards[0])
    assert shard["fused"].shape == (4, 32, 3 * 256) and shard["final"].shape == (4, 32, 256)

    second = train(5, work, out, SMALL, "tiny", corpus=corpus, max_chunks=5)
    assert second["steps"] == 6 and second["chunks"] == 3  # stopped at planned_steps
    assert "resuming at step 2 (chunk 1)" in capfd.readouterr().err
    assert [path.stat().st_mtime_ns for path in shards] == stamps  # features cached once
    record = json.loads((out / "training_record.json").read_text())
    assert [e["step"] for e in record["evals"]][:1] == [2] and record["aux_layer_ids"] == [0, 1, 1]
    with pytest.raises(ValueError, match="another recipe"):
        train(5, work, out, Eagle3Recipe(), "tiny", corpus=corpus, max_chunks=1)

    from specswap.loading import load_models
    from specswap.worker import SpeculativeWorker
    models = load_models("tiny", draft=str(out), speculative_algorithm="EAGLE3", dtype="float32")
    head = models.draft
    assert head.draft_vocab_size == 512 and head.capture_points == (1, 2, 2)
    prompts = [[5, 17, 300, 9], [40, 41, 42]]
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "worker"))
    from spec_helpers import run_to_completion  # noqa: PLC0415
    expected = run_to_completion(SpeculativeWorker(models.target, None, None, max_seq_len=64), prompts, 12)[0]
    worker = SpeculativeWorker(models.target, head, "EAGLE3", speculative_num_steps=3, max_seq_len=64)
    assert run_to_completion(worker, prompts, 12)[0] == expected


@needs_tiny
def test_a_head_trained_on_scaled_features_is_written_reading_raw_ones(tmp_path):
    from specswap.models.eagle3 import load_eagle3_head
    from specswap.zoo.eagle3_training import feature_scale, ship
    target, head, tokens, fused = tiny_head(10, seed=1)
    fused = fused * torch.tensor([3.0, 300.0, 30.0]).repeat_interleave(256)  # points of very different sizes
    scale = feature_scale(fused, 3)
    blocks = (fused * scale).unflatten(-1, (3, -1))
    torch.testing.assert_close(blocks.pow(2).mean(dim=(0, 1, 3)), torch.ones(3))  # each point at rms 1
    before = head.fc.weight.clone()
    ship(head, scale, tmp_path, Eagle3Recipe(save_dtype="float32"), {"best": None, "evals": [], "curve": [],
                                                                      "step": 0, "seconds": 0.0},
         {"summary": {}}, "tiny")
    assert torch.equal(head.fc.weight, before)  # the training head keeps its own weights
    loaded = load_eagle3_head(tmp_path, target, torch.float32)
    with torch.no_grad():
        expected = unrolled(head, tokens, fused * scale, 2)
        written = unrolled(loaded, tokens, fused, 2)
    for a, b in zip(written, expected):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_the_zoo_command_forwards_train_eagle3(monkeypatch, tmp_path, capsys):
    from specswap.zoo import __main__ as zoo_cli
    calls = []
    monkeypatch.setattr(recipe_module, "main", lambda argv: calls.append(list(argv)))
    zoo_cli.main(["train", "eagle3", "--minutes", "5", "--work", str(tmp_path), "--planned-steps", "30"])
    zoo_cli.main(["train", "eagle3", "--target", "tiny"])
    assert calls == [["--target", "gemma-3-270m", "--minutes", "5.0", "--work", str(tmp_path), "--planned-steps", "30"],
                     ["--target", "tiny", "--minutes", "100.0"]]
    with pytest.raises(SystemExit):
        zoo_cli.main(["train", "eagle3", "--target", "llama-3"])
    assert "supported targets are tiny, gemma-3-270m, smollm2-135m" in capsys.readouterr().err
