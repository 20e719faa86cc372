"""Train an EAGLE-1 head for a registry target (Gemma 3 270M, SmolLM2-135M) on this machine, resumably, from
offline text.

    PYTHONPATH=python python -m specswap.zoo train eagle --target gemma-3-270m --minutes 100 \
        [--work ~/.cache/specswap/<target>-eagle-run] [--out python/specswap/zoo/weights/<target>-eagle]
    PYTHONPATH=python python -m specswap.zoo.eagle_training --target smollm2-135m --measure [--work ...] [--out ...]

(``train gemma-3-270m-eagle`` is the same as ``train eagle --target gemma-3-270m``.)

Pipeline (every phase checkpoints into ``--work``; rerunning the command resumes where it stopped):
1. data: the zoo's offline corpus (CPython stdlib sources = code; docstrings and licence texts = prose), tokenized
   with the target's tokenizer; the draft vocabulary is the ``draft_vocab`` most frequent target tokens there
   (``token_map``), so the head's LM head is a 16k-row slice of the target's.
2. features: rounds of bf16 target forwards over random windows (half code, half prose) plus windows that
   continue a corpus prompt with the target's own greedy tokens; each round stores tokens and the final-normed
   hidden states (the features) as a shard. Teacher logits are not stored: they are recomputed from the stored
   features with the target's LM head rows of the draft vocabulary, exactly the target's logits there.
3. training: between feature rounds, steps over all shards so far: KL to the target's next-token distribution
   (restricted to the draft vocabulary), smooth-L1 regression to the next feature, and a second pass on the head's
   own predicted features (as at draft step 2+), with EAGLE's uniform feature noise.
4. evaluation: held-out top-1 agreement with the target's full-vocabulary greedy token at draft steps 1..3;
   the best head so far (by step-1 top-1) is written to ``--out`` with its token map and training record.

The target's licence applies to the head as a model derived from it (``TARGETS``; Gemma: docs/gemma.md).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from specswap.models import EagleConfig, EagleHead, RopeConfig, load_model, load_tokenizer, save_eagle_head

from .data import build_corpus
from .gemma import cache_root
from .train import kl_to_teacher, learning_rate, make_optimizer, positions_like, step_optimizer

DOMAINS = ("code", "prose")
WEIGHTS = Path(__file__).resolve().parent / "weights"
# the targets a head can be trained for: registry name -> the licence its derived head carries
TARGETS = {
    "gemma-3-270m": "derived from Gemma 3 270M: Gemma Terms of Use apply (https://ai.google.dev/gemma/terms)",
    "smollm2-135m": "derived from SmolLM2-135M-Instruct (Apache-2.0, HuggingFaceTB)",
}
DEFAULT_TARGET = "gemma-3-270m"
DEFAULT_OUT = WEIGHTS / f"{DEFAULT_TARGET}-eagle"


def check_target(target: str) -> str:
    if target not in TARGETS:
        raise ValueError(f"no EAGLE training recipe for target {target!r}; supported: {', '.join(TARGETS)}")
    return target


def default_work(target: str) -> Path:
    """The resumable work directory: ``$SPECSWAP_CACHE_DIR/<target>-eagle-run`` (default ~/.cache/specswap)."""
    return cache_root() / f"{target}-eagle-run"


def default_out(target: str) -> Path:
    return WEIGHTS / f"{target}-eagle"


def load_target(name: str):
    """The bf16 target and its tokenizer, through the one loader's checkpoint resolution."""
    from .registry import resolve_checkpoint  # noqa: PLC0415
    directory = resolve_checkpoint(check_target(name), torch.bfloat16)
    return load_model(directory, torch.bfloat16).requires_grad_(False), load_tokenizer(directory)


@dataclass(frozen=True)
class EagleHeadRecipe:
    """Every knob; recorded verbatim in training_record.json."""

    seed: int = 2026
    draft_vocab: int = 16384
    seq_len: int = 128
    # A round's steps consume ~2.4x the fresh feature tokens the round makes (features are hidden states only:
    # no LM head over 262k tokens), so the head sees each window about 2-3 times. The first shipped run made 16
    # windows per round, saw each ~10 times and was limited by data.
    feature_windows_per_round: int = 64      # corpus windows of seq_len per feature round
    self_generated_per_round: int = 16       # windows continued greedily by the target
    self_generated_batch: int = 16           # greedy continuation batch (sequential decoding: batch it)
    self_prompt_tokens: int = 64             # prompt tokens; the rest of seq_len is generated
    feature_batch: int = 4
    train_batch: int = 8
    steps_per_round: int = 24
    lr: float = 1e-3
    planned_steps: int = 1000                # lr schedule length; training stops earlier at the time budget
    warmup_fraction: float = 0.03
    feature_noise: float = 0.1               # uniform, relative to the features' std (as in EAGLE)
    regression_weight: float = 1.0
    self_feed_weight: float = 0.5
    eval_windows: int = 24
    eval_steps: int = 3                      # draft steps measured for held-out top-1
    eval_every_rounds: int = 3
    save_dtype: str = "bfloat16"
    threads: int = 1                         # shared 2-core machine: see TinyRecipe.threads


# ------------------------------------------------------------------------------------------------ data

def token_streams(tokenizer, corpus, splits=("train", "heldout")) -> dict[str, dict[str, torch.Tensor]]:
    """split -> domain -> one stream of <bos> doc <bos> doc ... token ids (a tokenizer without a BOS token, as
    SmolLM2's, separates documents with its smallest end-of-sequence id)."""
    separator = tokenizer.bos_token_id
    if separator is None:
        separator = min(tokenizer.eos_token_ids)
    streams = {}
    for split in splits:
        streams[split] = {}
        for domain in DOMAINS:
            ids: list[int] = []
            for encoding in tokenizer._tokenizer.encode_batch(corpus.documents[domain][split],
                                                              add_special_tokens=False):
                ids.append(separator)
                ids.extend(encoding.ids)
            streams[split][domain] = torch.tensor(ids, dtype=torch.long)
    return streams


def frequent_tokens(streams: dict[str, torch.Tensor], vocab_size: int, count: int) -> torch.Tensor:
    """The ``count`` most frequent ids over the training streams, sorted by id: the draft vocabulary."""
    counts = sum(torch.bincount(stream, minlength=vocab_size) for stream in streams.values())
    return torch.sort(torch.topk(counts, count).indices).values


def heldout_prompts(data: dict, count: int, length: int, heldout_streams) -> dict[str, torch.Tensor]:
    """domain -> [count, length] held-out prompts: the windows stored in data.pt first, then, when more are asked
    for, further windows drawn (seeded) from the held-out streams that ``heldout_streams()`` rebuilds."""
    stored = data["heldout"]  # first half code windows, second half prose
    half = len(stored) // 2
    prompts = {"code": stored[:half, :length], "prose": stored[half:, :length]}
    if count <= half:
        return {domain: rows[:count] for domain, rows in prompts.items()}
    streams = heldout_streams()
    generator = torch.Generator().manual_seed(EagleHeadRecipe.seed + 2)
    return {domain: torch.cat([rows, random_windows(streams[domain], count - half, length, generator)])
            for domain, rows in prompts.items()}


def random_windows(stream: torch.Tensor, count: int, length: int, generator: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, len(stream) - length, (count,), generator=generator)
    return torch.stack([stream[s:s + length] for s in starts.tolist()])


@torch.inference_mode()
def greedy_continue(target, prompts: torch.Tensor, total_length: int) -> torch.Tensor:
    """prompts: [B, P] -> [B, total_length]: each prompt continued with the target's greedy tokens."""
    batch, prompt_length = prompts.shape
    cache, slots = target.make_cache(batch, total_length), torch.arange(batch)
    logits = target(prompts, positions_like(prompts), cache, slots, prompt_length,
                    logits_at=torch.full((batch,), prompt_length - 1)).logits[:, -1]
    tokens = [prompts]
    for position in range(prompt_length, total_length):
        next_tokens = logits.argmax(-1, keepdim=True)  # [B, 1]
        tokens.append(next_tokens)
        if position == total_length - 1:
            break
        logits = target(next_tokens, torch.full((batch, 1), position), cache, slots, position + 1).logits[:, -1]
    return torch.cat(tokens, dim=1)


@torch.inference_mode()
def target_features(target, windows: torch.Tensor, batch: int) -> torch.Tensor:
    """windows: [N, T] -> final-normed hidden states [N, T, H] in bf16 (cacheless causal forward)."""
    hidden = []
    for start in range(0, len(windows), batch):
        chunk = windows[start:start + batch]
        hidden.append(target(chunk, positions_like(chunk), None, None, with_logits=False).hidden.to(torch.bfloat16))
    return torch.cat(hidden)


# ------------------------------------------------------------------------------------------------ head

def make_head(target, token_map: torch.Tensor) -> EagleHead:
    """One Llama-style decoder layer shaped like one of the target's layers (Gemma: 4 heads of 256, 1 KV head;
    its local rotary base), fresh init."""
    config = target.config
    rope = getattr(config, "rope_local", None) or config.rope
    eagle_config = EagleConfig(
        hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
        num_attention_heads=config.num_attention_heads, num_key_value_heads=config.num_key_value_heads,
        head_dim=config.head_dim, target_vocab_size=config.vocab_size, draft_vocab_size=len(token_map),
        rms_norm_eps=config.rms_norm_eps, rope=RopeConfig(theta=rope.theta),
        max_position_embeddings=config.max_position_embeddings)
    head = EagleHead(eagle_config, target.embed_tokens, target.lm_head, token_map)
    with torch.no_grad():
        for name, parameter in head.named_parameters():
            if parameter.dim() == 2:
                torch.nn.init.normal_(parameter, std=0.02)
        hidden = config.hidden_size
        head.fc.weight[:, hidden:] += torch.eye(hidden)  # start by passing the feature through
    return head.float()


def head_losses(head: EagleHead, draft_lm_weight: torch.Tensor, tokens: torch.Tensor, features: torch.Tensor,
                recipe: EagleHeadRecipe, generator: torch.Generator) -> tuple[torch.Tensor, dict[str, float]]:
    """Head entry q consumes (x_q, f_{q-1}) and predicts f_q and the distribution of x_{q+1}.

    tokens: [B, T]; features: [B, T, H] fp32. Teacher logits over the draft vocabulary are f_q @ W_draft^T.
    """
    with torch.no_grad():
        teacher_logp = F.log_softmax(F.linear(features[:, 1:], draft_lm_weight), dim=-1)   # [B, T-1, Vd]
    inputs, previous = tokens[:, 1:], features[:, :-1]
    noise = (torch.rand(previous.shape, generator=generator) * 2 - 1) * recipe.feature_noise * previous.std()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        first = head(inputs, previous + noise, positions_like(inputs, 1), None, None)
    kl_first = kl_to_teacher(teacher_logp, first.logits)
    regression = F.smooth_l1_loss(first.hidden.float(), features[:, 1:])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        second = head(tokens[:, 2:], first.hidden[:, :-1], positions_like(tokens[:, 2:], 2), None, None)
    kl_second = kl_to_teacher(teacher_logp[:, 1:], second.logits)
    loss = kl_first + recipe.regression_weight * regression + recipe.self_feed_weight * kl_second
    return loss, {"kl": kl_first.item(), "regression": regression.item(), "kl_self_fed": kl_second.item()}


@torch.inference_mode()
def heldout_top1(target, head: EagleHead, windows: torch.Tensor, recipe: EagleHeadRecipe) -> dict[str, float]:
    """Agreement of the head's top-1 (mapped to target ids) with the target's full-vocabulary greedy token, per
    draft step: step 1 from the target's features, step k from the head's own features of step k-1."""
    agree = [0.0] * recipe.eval_steps
    for start in range(0, len(windows), recipe.feature_batch):
        tokens = windows[start:start + recipe.feature_batch]
        teacher = target(tokens, positions_like(tokens), None, None)
        target_next = teacher.logits.argmax(-1)  # [B, T]
        features = teacher.hidden.float()
        for step in range(recipe.eval_steps):
            # step k: entries q consume (x_q, feature of q-1), predicting x_{q+1}
            inputs = tokens[:, step + 1:]
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = head(inputs, features[:, :inputs.shape[1]], positions_like(inputs, step + 1), None, None)
            predicted = head.token_map[out.logits.argmax(-1)]
            agree[step] += (predicted == target_next[:, step + 1:]).float().mean().item() * len(tokens)
            features = out.hidden.float()
    return {f"step{step + 1}": round(total / len(windows), 4) for step, total in enumerate(agree)}


# ------------------------------------------------------------------------------------------------ driver

def train(minutes: float, work: Path, out: Path, recipe: EagleHeadRecipe = EagleHeadRecipe(),
          target_name: str = DEFAULT_TARGET, init: Path | None = None) -> dict:
    """Train (or resume) a head in ``work``; ``init``: a saved head to start from instead of a fresh one (same
    target, same draft vocabulary: its token map must equal the one this work directory's data derives)."""
    torch.set_num_threads(recipe.threads)
    deadline = time.monotonic() + minutes * 60
    work.mkdir(parents=True, exist_ok=True)
    target, tokenizer = load_target(target_name)
    recipe = replace(recipe, draft_vocab=min(recipe.draft_vocab, target.config.vocab_size))

    data_file = work / "data.pt"
    if data_file.is_file():
        data = torch.load(data_file)
    else:
        corpus = build_corpus()
        streams = token_streams(tokenizer, corpus)
        token_map = frequent_tokens(streams["train"], target.config.vocab_size, recipe.draft_vocab)
        generator = torch.Generator().manual_seed(recipe.seed + 1)
        heldout = torch.cat([random_windows(streams["heldout"][d], recipe.eval_windows // 2, recipe.seq_len, generator)
                             for d in DOMAINS])
        data = {"streams": streams["train"], "token_map": token_map, "heldout": heldout,
                "summary": {"fingerprint": corpus.fingerprint(), "documents": corpus.summary(),
                            "tokens": {s: {d: len(t) for d, t in by.items()} for s, by in streams.items()}}}
        torch.save(data, data_file)
    token_map = data["token_map"]

    head = make_head(target, token_map)
    optimizer = make_optimizer(head, recipe.lr)
    state = {"round": 0, "step": 0, "curve": [], "evals": [], "best": None, "seconds": 0.0, "feature_tokens": 0}
    checkpoint_file = work / "checkpoint.pt"
    if checkpoint_file.is_file():
        checkpoint = torch.load(checkpoint_file)
        head.load_state_dict(checkpoint["head"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        state = checkpoint["state"]
        print(f"resuming at round {state['round']}, step {state['step']}", file=sys.stderr)
    elif init is not None:
        state["init"] = start_from(head, init, target, token_map)
    head.set_token_map(token_map)
    draft_lm_weight = target.lm_head.weight.detach()[token_map].float()  # [Vd, H]
    if state.get("init") is not None and state["best"] is None:  # the starting head is the one to beat
        top1 = heldout_top1(target, head, data["heldout"], recipe)
        state["best"] = {"step": 0, **top1}
        state["init"]["heldout_top1"] = top1
        print(f"starting head {init}: held-out top-1 {top1}", file=sys.stderr)
    shards = sorted(work.glob("features-*.pt"))
    tokens_list = [torch.load(s)["tokens"] for s in shards]
    features_list = [torch.load(s)["hidden"] for s in shards]

    session_start = time.monotonic()
    bar = tqdm(desc=f"{target_name} eagle", unit="step", initial=state["step"], total=recipe.planned_steps, dynamic_ncols=True)
    while time.monotonic() < deadline and state["step"] < recipe.planned_steps:
        round_index = state["round"]
        generator = torch.Generator().manual_seed(recipe.seed + 1000 + round_index)
        # features of this round: corpus windows, half code, half prose, and greedy self-continuations
        half = recipe.feature_windows_per_round // 2
        windows = [random_windows(data["streams"][d], half, recipe.seq_len, generator) for d in DOMAINS]
        if recipe.self_generated_per_round:
            domain = DOMAINS[round_index % 2]
            prompts = random_windows(data["streams"][domain], recipe.self_generated_per_round,
                                     recipe.self_prompt_tokens, generator)
            windows += [greedy_continue(target, chunk, recipe.seq_len)
                        for chunk in prompts.split(recipe.self_generated_batch)]
        windows = torch.cat(windows)
        hidden = target_features(target, windows, recipe.feature_batch)
        torch.save({"tokens": windows, "hidden": hidden}, work / f"features-{round_index:05d}.pt")
        tokens_list.append(windows)
        features_list.append(hidden)
        state["feature_tokens"] += windows.numel()
        all_tokens, all_features = torch.cat(tokens_list), torch.cat(features_list)

        head.train()
        for _ in range(recipe.steps_per_round):
            pick = torch.randint(0, len(all_tokens), (recipe.train_batch,), generator=generator)
            loss, parts = head_losses(head, draft_lm_weight, all_tokens[pick], all_features[pick].float(), recipe,
                                      generator)
            loss.backward()
            step_optimizer(optimizer, head, learning_rate(state["step"], recipe.planned_steps, recipe.lr,
                                                          recipe.warmup_fraction))
            state["step"] += 1
            bar.update(1)
            bar.set_postfix(kl=f"{parts['kl']:.3f}", reg=f"{parts['regression']:.3f}")
            if state["step"] % 20 == 0:
                state["curve"].append({"step": state["step"], **{k: round(v, 4) for k, v in parts.items()}})
        head.eval()
        state["round"] += 1
        state["seconds"] += time.monotonic() - session_start
        session_start = time.monotonic()
        last_round = time.monotonic() >= deadline or state["step"] >= recipe.planned_steps
        if state["round"] % recipe.eval_every_rounds == 0 or last_round:
            top1 = heldout_top1(target, head, data["heldout"], recipe)
            state["evals"].append({"step": state["step"], "feature_tokens": state["feature_tokens"], **top1})
            bar.write(f"step {state['step']}: held-out top-1 {top1}")
            if state["best"] is None or top1["step1"] > state["best"]["step1"]:
                state["best"] = {"step": state["step"], **top1}
                ship(head, out, recipe, state, data, target_name)
        torch.save({"head": head.state_dict(), "optimizer": optimizer.state_dict(), "state": state}, checkpoint_file)
    bar.close()
    return {"best": state["best"], "steps": state["step"], "feature_tokens": state["feature_tokens"],
            "train_seconds": round(state["seconds"], 1)}


def start_from(head: EagleHead, init: Path, target, token_map: torch.Tensor) -> dict:
    """Load the saved head in ``init`` into the fresh ``head`` (fp32); what it was, for the training record."""
    from specswap.models import load_eagle_head  # noqa: PLC0415
    start = load_eagle_head(init, target)
    if start.token_map is None or not torch.equal(start.token_map.cpu(), token_map):
        raise ValueError(f"{init}: the head's draft vocabulary is not the one this work directory's data derives "
                         f"(token maps differ); start it from a head trained on the same corpus and draft_vocab")
    head.load_state_dict({name: value.float() for name, value in start.state_dict().items()})
    record_file = Path(init) / "training_record.json"
    record = json.loads(record_file.read_text()) if record_file.is_file() else {}
    return {"from": str(init), "steps": record.get("steps"), "feature_tokens": record.get("feature_tokens"),
            "train_seconds": record.get("train_seconds")}


def ship(head: EagleHead, out: Path, recipe: EagleHeadRecipe, state: dict, data: dict,
         target_name: str = DEFAULT_TARGET) -> None:
    save_eagle_head(head, out, dtype=getattr(torch, recipe.save_dtype))
    record = {
        "model": f"{target_name}-eagle",
        "target": target_name,
        "kind": f"EAGLE-1 head for {target_name} (shares its embedding; LM head = a {len(head.token_map)}-row slice "
                "of the target's)",
        "parameters": sum(p.numel() for p in head.parameters()),
        "draft_vocab": len(head.token_map),
        "best": state["best"], "evals": state["evals"], "loss_curve": state["curve"],
        "steps": state["step"], "feature_tokens": state["feature_tokens"],
        "train_seconds": round(state["seconds"], 1),
        # a head started from another (--init): that head's own training, and its held-out top-1 here
        "init": state.get("init"),
        "recipe": asdict(recipe), "data": data["summary"],
        "sources": ["CPython stdlib .py files -> code; stdlib docstrings and licence texts -> prose",
                    "plus windows continued by the target's own greedy tokens"],
        "licence": TARGETS[target_name],
        "environment": {"python": platform.python_version(), "torch": torch.__version__,
                        "threads": torch.get_num_threads(), "command": " ".join(sys.argv)},
    }
    (out / "training_record.json").write_text(json.dumps(record, indent=2) + "\n")


def measure(work: Path, out: Path, prompts_per_domain: int = 4, prompt_tokens: int = 64, new_tokens: int = 32,
            draft_lengths: tuple[int, ...] = (1, 3), target_name: str = DEFAULT_TARGET) -> dict:
    """Accepted draft tokens per verify of the shipped head with greedy chain drafting on held-out prompts (bf16
    target), via the zoo's acceptance loop; also checks the output equals plain greedy decoding. Recorded in
    ``out``/training_record.json under "acceptance"."""
    from specswap.models import load_eagle_head  # noqa: PLC0415

    from .acceptance import EagleDrafter, chain_draft, greedy  # noqa: PLC0415

    if new_tokens < 1:
        raise ValueError(f"new_tokens must be >= 1; got {new_tokens}")
    if prompts_per_domain < 1:
        raise ValueError(f"prompts_per_domain must be >= 1; got {prompts_per_domain}")
    data = torch.load(work / "data.pt")
    target, tokenizer = load_target(target_name)

    def heldout_streams() -> dict[str, torch.Tensor]:
        corpus = build_corpus()
        if corpus.fingerprint() != data["summary"]["fingerprint"]:
            raise ValueError(f"the offline corpus on this machine is not the one {work / 'data.pt'} was built from "
                             f"(fingerprint {corpus.fingerprint()} != {data['summary']['fingerprint']}); measure "
                             f"with at most {len(data['heldout']) // 2} prompts per domain or retrain")
        return token_streams(tokenizer, corpus, splits=("heldout",))["heldout"]

    prompts_by_domain = heldout_prompts(data, prompts_per_domain, prompt_tokens, heldout_streams)
    head = load_eagle_head(out, target)
    results: dict = {"method": f"greedy chain drafting, bf16 target, {prompts_per_domain} held-out prompts per "
                               f"domain of {prompt_tokens} tokens, {new_tokens} new tokens; accepted = draft tokens "
                               "accepted per target verify"}
    lossless = True
    bar = tqdm(desc="acceptance", unit="prompt", total=len(prompts_by_domain) * prompts_per_domain * (
        1 + len(draft_lengths)), dynamic_ncols=True)
    for domain, rows in prompts_by_domain.items():
        prompts = rows.tolist()
        references = []
        for prompt in prompts:
            references.append(greedy(target, prompt, new_tokens))
            bar.update()
        for k in draft_lengths:
            per_prompt: list[list[int]] = []  # [accepted draft tokens, verifies] per prompt, for paired comparisons
            for prompt, reference in zip(prompts, references):
                result = chain_draft(target, lambda capacity: EagleDrafter(head, capacity), prompt, new_tokens, k)
                lossless &= result.tokens == reference
                per_prompt.append([sum(result.accepted_per_verify), len(result.accepted_per_verify)])
                bar.update()
            accepted, verifies = (sum(column) for column in zip(*per_prompt))
            results.setdefault(domain, {})[f"k={k}"] = {
                "accepted_per_verify": round(accepted / verifies, 3), "verifies": verifies, "per_prompt": per_prompt}
    bar.close()
    results["matches_plain_greedy"] = lossless
    record_file = out / "training_record.json"
    record = json.loads(record_file.read_text())
    record["acceptance"] = results
    record_file.write_text(json.dumps(record, indent=2) + "\n")
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m specswap.zoo.eagle_training", description=__doc__.split("\n")[0])
    parser.add_argument("--target", default=DEFAULT_TARGET, choices=sorted(TARGETS), help="the registry target")
    parser.add_argument("--minutes", type=float, default=100.0, help="wall-clock budget of this run")
    parser.add_argument("--work", type=Path, help="resumable work directory (default ~/.cache/specswap/<target>-eagle-run)")
    parser.add_argument("--out", type=Path, help="the head's directory (default python/specswap/zoo/weights/<target>-eagle)")
    parser.add_argument("--planned-steps", type=int, help="length of the learning-rate schedule")
    parser.add_argument("--lr", type=float, help=f"peak learning rate (default {EagleHeadRecipe.lr})")
    parser.add_argument("--init", type=Path,
                        help="start from this saved head (same target and draft vocabulary) instead of a fresh one; "
                             "it is the head to beat: only a better one is written to --out")
    parser.add_argument("--measure", action="store_true",
                        help="only measure the acceptance of the head in --out (recorded in its training_record.json)")
    parser.add_argument("--prompts-per-domain", type=int, default=4,
                        help="--measure: held-out prompts per domain (beyond the windows data.pt stores, "
                             "more are drawn from the held-out split)")
    parser.add_argument("--new-tokens", type=int, default=32,
                        help="--measure: greedy tokens generated per prompt (more: less noise in the counts)")
    args = parser.parse_args(argv)
    work = args.work or default_work(args.target)
    out = args.out or default_out(args.target)
    if args.measure:
        torch.set_num_threads(EagleHeadRecipe.threads)
        print(json.dumps(measure(work, out, prompts_per_domain=args.prompts_per_domain, new_tokens=args.new_tokens,
                                 target_name=args.target), indent=2))
        return
    recipe = EagleHeadRecipe()
    if args.planned_steps:
        recipe = replace(recipe, planned_steps=args.planned_steps)
    if args.lr:
        recipe = replace(recipe, lr=args.lr)
    print(json.dumps(train(args.minutes, work, out, recipe, args.target, init=args.init), indent=2))


if __name__ == "__main__":
    main()
