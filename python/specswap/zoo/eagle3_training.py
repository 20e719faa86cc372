"""Train an EAGLE-3 head (``models.eagle3``, SpecForge's layout) for a target on this machine, resumably, from
offline text.

    PYTHONPATH=python python -m specswap.zoo.eagle3_training --target gemma-3-270m --minutes 120 \
        [--work ~/.cache/specswap/<target>-eagle3-run] [--out python/specswap/zoo/weights/<target>-eagle3]

Rerunning the same command resumes where it stopped. The recipe (EAGLE-3's):
1. data: the zoo's offline corpus (``zoo.data``: CPython stdlib sources = code; docstrings and licence texts =
   prose) tokenized with the target's tokenizer. The draft vocabulary is the ``draft_vocab`` most frequent target
   tokens there; it is saved as ``d2t`` (target_id = draft_id + d2t[draft_id]) and ``t2d``.
2. features, cached once: ``feature_windows`` windows of ``seq_len`` tokens (half code, half prose, a part of them
   continued with the target's own greedy tokens), each through one target forward returning the fused
   low/middle/high hidden states (the residual stream entering the capture layers: SGLang's default, the inputs
   of layers 2, L // 2, L - 3) and the final-normed hidden state (the teacher: its logits over the draft
   vocabulary are the target's there). Written in shards of ``shard_windows``; a shard on disk is never redone.
3. training, in chunks of ``chunk_steps`` steps, each checkpointed (head, optimizer, state, generator): the head
   is unrolled ``ttt_steps`` times over its own predictions (training-time test). Step 1 reads the fused target
   features; step s >= 2 reads the head's own hidden state of step s - 1, one position further, and attends to the
   step-1 entries up to its start and to its own chain's entries, exactly what it sees at draft step s. Loss:
   KL to the target's next-token law over the draft vocabulary, step s weighted ``step_decay`` ** (s - 1).
4. evaluation after every ``eval_every_chunks`` chunks: held-out top-1 agreement of each unrolled step with the
   target's full-vocabulary greedy token; the best head (by the mean over steps) is written to ``--out`` with
   its training record.

The target's licence applies to the head as a model derived from it.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from specswap.capability import cpu_capability
from specswap.models import load_model, load_tokenizer
from specswap.models.eagle3 import Eagle3Config, Eagle3Head, default_capture_points, save_eagle3_head
from specswap.models.layers import apply_rotary

from .data import build_corpus
from .eagle_training import DOMAINS, frequent_tokens, greedy_continue, random_windows, token_streams
from .gemma import cache_root
from .train import learning_rate, make_optimizer, positions_like, step_optimizer

WEIGHTS = Path(__file__).resolve().parent / "weights"
TARGETS = {
    "tiny": "derived from the zoo's tiny model",
    "gemma-3-270m": "derived from Gemma 3 270M: Gemma Terms of Use apply (https://ai.google.dev/gemma/terms)",
    "smollm2-135m": "derived from SmolLM2-135M-Instruct (Apache-2.0, HuggingFaceTB)",
}
DEFAULT_TARGET = "gemma-3-270m"


@dataclass(frozen=True)
class Eagle3Recipe:
    """Every knob; recorded verbatim in training_record.json."""

    seed: int = 2026
    draft_vocab: int = 16384
    seq_len: int = 128
    feature_windows: int = 1024             # windows cached once (Gemma 3 270M: about 0.7 GB of bf16 features)
    self_generated_fraction: float = 0.25   # windows whose second half the target writes (greedy)
    self_prompt_tokens: int = 64
    shard_windows: int = 64
    feature_batch: int = 4
    heldout_windows: int = 24
    train_batch: int = 4                    # Gemma 3 270M at batch 8: 14 s a step on one shared AVX2 core, fp32
    ttt_steps: int = 3                      # training-time test: unrolled draft steps
    step_decay: float = 0.8                 # loss weight of unrolled step s: decay ** (s - 1)
    lr: float = 5e-4
    planned_steps: int = 2000               # lr schedule length; a run stops earlier at its time budget
    warmup_fraction: float = 0.03
    chunk_steps: int = 50                   # steps between checkpoints
    eval_every_chunks: int = 4
    save_dtype: str = "bfloat16"
    threads: int = 1                        # shared 2-core machine: see TinyRecipe.threads
    # bf16 autocast for the head's matmuls: "auto" = where the CPU has native bf16 (elsewhere torch emulates it,
    # several times slower than fp32), "on", "off"
    autocast: str = "auto"
    # the head starts as an early exit of the target: fc passes the highest capture point's residual stream
    # through (the other points' columns start at 0), the layer is the identity, norm and lm_head are the
    # target's final norm and its draft-vocabulary rows (False: all random)
    warm_start: bool = True
    # eagle_aux_hidden_state_layer_ids: the target layers whose outputs are fused (None: SGLang's default, the
    # inputs of layers 2, L // 2 and L - 3); L - 1 is the last layer's output, the stream the final norm reads,
    # taken before that norm (the head's config records it: specswap_last_layer_capture "pre_norm")
    aux_layer_ids: tuple[int, ...] | None = None


def default_work(target: str) -> Path:
    return cache_root() / f"{target}-eagle3-run"


def default_out(target: str) -> Path:
    return WEIGHTS / f"{target}-eagle3"


def load_target(name: str, dtype: torch.dtype | None = None):
    """The target (frozen) and its tokenizer, through the one loader's checkpoint resolution; ``dtype`` None: bf16
    where the CPU has native bf16, else fp32 (emulated bf16 matmuls are several times slower)."""
    from .registry import resolve_checkpoint  # noqa: PLC0415
    if name not in TARGETS:
        raise ValueError(f"no EAGLE-3 training recipe for target {name!r}; supported: {', '.join(TARGETS)}")
    if dtype is None:
        dtype = torch.bfloat16 if cpu_capability().native_bf16 else torch.float32
    directory = resolve_checkpoint(name, dtype)
    return load_model(directory, dtype).requires_grad_(False), load_tokenizer(directory)


# ------------------------------------------------------------------------------------------------ head

def capture_layer_ids(num_layers: int) -> list[int]:
    """SGLang's default capture points as eagle_aux_hidden_state_layer_ids (the layer whose output is taken)."""
    points = sorted(default_capture_points(num_layers))
    if points[0] < 1:
        raise ValueError(f"a target of {num_layers} layers is too shallow for EAGLE-3's default layers {points}")
    return [point - 1 for point in points]


def make_head(target, token_map: torch.Tensor, warm_start: bool = False,
              aux_layer_ids: tuple[int, ...] | None = None) -> Eagle3Head:
    """A head shaped like one of the target's layers (Gemma: its local rotary base), fresh init, fp32; with
    ``warm_start`` an early exit of the target at its highest capture point (see ``Eagle3Recipe.warm_start``):
    that feature passed through, the layer the identity."""
    config = target.config
    rope = getattr(config, "rope_local", None) or config.rope
    head_config = Eagle3Config(
        hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
        num_attention_heads=config.num_attention_heads, num_key_value_heads=config.num_key_value_heads,
        head_dim=config.head_dim, target_vocab_size=config.vocab_size, draft_vocab_size=len(token_map),
        target_hidden_size=config.hidden_size, rms_norm_eps=config.rms_norm_eps, rope=replace(rope),
        max_position_embeddings=config.max_position_embeddings,
        aux_layer_ids=tuple(aux_layer_ids or capture_layer_ids(config.num_hidden_layers)),
        last_layer_capture="pre_norm")  # this recipe trains on the last layer's output before the final norm
    head = Eagle3Head(head_config, target.embed_tokens, token_map,
                      head_config.capture_points(config.num_hidden_layers))
    with torch.no_grad():
        for parameter in head.parameters():
            if parameter.dim() == 2:
                torch.nn.init.normal_(parameter, std=0.02)
        if warm_start:
            hidden = config.hidden_size
            highest = max(range(len(head.capture_points)), key=lambda i: head.capture_points[i])
            head.fc.weight.zero_()
            head.fc.weight[:, highest * hidden:(highest + 1) * hidden] = torch.eye(hidden)
            # the layer starts as the identity: its two residual branches' output projections at 0 (they get
            # gradients at once; the rest of the branch from the next step)
            head.midlayer.self_attn.o_proj.weight.zero_()
            head.midlayer.mlp.down_proj.weight.zero_()
            final_norm = target.model.norm
            head.norm.weight.copy_(final_norm.weight.float() + final_norm.weight_offset)
            head.lm_head.weight.copy_(target.lm_head.weight.detach()[token_map].float())
    return head.float()


def _mask(length: int, step: int, device) -> torch.Tensor:
    """[T, step * T] bool: step-1 entries causally (key r <= query q), then the query's own chain (diagonals)."""
    causal = torch.ones(length, length, dtype=torch.bool, device=device).tril()
    eye = torch.eye(length, dtype=torch.bool, device=device)
    return torch.cat([causal] + [eye] * (step - 1), dim=1)


def unrolled(head: Eagle3Head, tokens: torch.Tensor, fused: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """The head unrolled ``steps`` times (training-time test) over windows tokens [B, T] with fused target
    features [B, T, 3H]; returns each step's draft logits [B, T-1, Vd].

    Entry q of step 1 consumes (x_{q+1}, f_q) at position q and drafts x_{q+2}; entry q of step s consumes
    (x_{q+s}, the step s-1 entry's hidden) at position q+s-1 and drafts x_{q+s+1}, attending to the step-1 entries
    0..q and to entries q of steps 2..s, as draft step s does at run time. Tokens past the window are 0 (their
    drafts are masked out of the loss by the caller)."""
    layer = head.midlayer
    attention = layer.self_attn
    batch, length = tokens.shape[0], tokens.shape[1] - 1
    heads, kv_heads, dim = attention.num_heads, attention.num_kv_heads, attention.head_dim
    padded = torch.cat((tokens, tokens.new_zeros(batch, steps)), dim=1)
    hidden = head.fc(fused[:, :length])
    keys, values, outputs = [], [], []
    for step in range(1, steps + 1):
        ids = padded[:, step:step + length]
        positions = positions_like(ids, step - 1)
        cos, sin = head.rotary(positions, hidden.dtype)
        embeds = head.embed_tokens(ids).to(hidden.dtype)
        x = torch.cat((layer.input_layernorm(embeds), layer.hidden_norm(hidden)), dim=-1)
        q = apply_rotary(attention.q_proj(x).view(batch, length, heads, dim).transpose(1, 2), cos, sin)
        keys.append(apply_rotary(attention.k_proj(x).view(batch, length, kv_heads, dim).transpose(1, 2), cos, sin))
        values.append(attention.v_proj(x).view(batch, length, kv_heads, dim).transpose(1, 2))
        attended = F.scaled_dot_product_attention(q, torch.cat(keys, 2), torch.cat(values, 2),
                                                  attn_mask=_mask(length, step, x.device), scale=attention.scale,
                                                  enable_gqa=heads != kv_heads)
        hidden = hidden + attention.o_proj(attended.transpose(1, 2).reshape(batch, length, heads * dim))
        hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        outputs.append(head.lm_head(head.norm(hidden)))
    return outputs


def teacher_log_probs(target, final: torch.Tensor, draft_rows: torch.Tensor) -> torch.Tensor:
    """The target's next-token log-law over the draft vocabulary from final-normed hidden states [..., H]."""
    logits = F.linear(final.float(), draft_rows)
    cap = getattr(target.config, "final_logit_softcapping", None)
    if cap is not None:
        logits = torch.tanh(logits / cap) * cap
    return F.log_softmax(logits, dim=-1)


def ttt_loss(head, target, draft_rows, tokens, fused, final, recipe: Eagle3Recipe) -> tuple[torch.Tensor, list]:
    """Sum over unrolled steps of decay^(s-1) * KL(target || head) over the draft vocabulary, at the positions
    whose drafted token lies inside the window."""
    length = tokens.shape[1] - 1
    with torch.no_grad():
        teacher = teacher_log_probs(target, final, draft_rows)   # [B, T, Vd]: law of x_{q+1} at q
    total, parts = 0.0, []
    for step, logits in enumerate(unrolled(head, tokens, fused.float(), recipe.ttt_steps), start=1):
        valid = length - step                                     # entries q <= T - 2 - step
        target_logp = teacher[:, step:step + valid]               # law of x_{q+step+1}
        student = F.log_softmax(logits[:, :valid].float(), dim=-1)
        kl = (target_logp.exp() * (target_logp - student)).sum(-1).mean()
        total = total + recipe.step_decay ** (step - 1) * kl
        parts.append(round(kl.item(), 4))
    return total, parts


@torch.no_grad()
def heldout_top1(head, tokens, fused, target_next, recipe: Eagle3Recipe) -> dict[str, float]:
    """Per unrolled step, how often the head's top-1 (mapped to target ids) is the target's greedy token."""
    agree, counted = [0.0] * recipe.ttt_steps, [0] * recipe.ttt_steps
    length = tokens.shape[1] - 1
    for start in range(0, len(tokens), recipe.feature_batch):
        rows = slice(start, start + recipe.feature_batch)
        for step, logits in enumerate(unrolled(head, tokens[rows], fused[rows].float(), recipe.ttt_steps), 1):
            valid = length - step
            drafted = head.token_map[logits[:, :valid].argmax(-1)]
            agree[step - 1] += (drafted == target_next[rows, step:step + valid]).sum().item()
            counted[step - 1] += drafted.numel()
    return {f"step{s + 1}": round(a / max(c, 1), 4) for s, (a, c) in enumerate(zip(agree, counted))}


# ------------------------------------------------------------------------------------------------ phases

def prepare_data(work: Path, tokenizer, vocab_size: int, recipe: Eagle3Recipe, corpus=None) -> dict:
    """Token streams and the draft vocabulary, once (``work``/data.pt)."""
    data_file = work / "data.pt"
    if data_file.is_file():
        return torch.load(data_file)
    corpus = corpus or build_corpus()
    streams = token_streams(tokenizer, corpus)
    draft_vocab = min(recipe.draft_vocab, vocab_size)
    data = {"streams": streams, "token_map": frequent_tokens(streams["train"], vocab_size, draft_vocab),
            "summary": {"fingerprint": corpus.fingerprint(), "documents": corpus.summary(),
                        "tokens": {s: {d: len(t) for d, t in by.items()} for s, by in streams.items()}}}
    torch.save(data, data_file)
    return data


@torch.inference_mode()
def extract(target, windows: torch.Tensor, batch: int, points: tuple[int, ...],
            full_logits: bool = False) -> dict[str, torch.Tensor]:
    """One target forward per chunk: fused features [N, T, 3H] at the capture ``points`` and final-normed hidden
    [N, T, H] in bf16; with ``full_logits`` the target's greedy next token [N, T] too (held-out windows only: a
    full LM head is costly)."""
    fused, final, greedy = [], [], []
    layers = target.config.num_hidden_layers
    points = (*target.check_aux_points(points, layers), layers)  # the final residual stream last: the teacher
    if points[-2] > layers:
        raise ValueError(f"capture points {list(points[:-1])}: this recipe reads the last layer's output before the "
                         f"final norm (point {layers}), not after it")
    for start in range(0, len(windows), batch):
        chunk = windows[start:start + batch]
        out = target(chunk, positions_like(chunk), None, None, with_logits=False, aux_points=points).hidden
        fused.append(out[..., :-target.config.hidden_size].to(torch.bfloat16))
        normed = target.model.norm(out[..., -target.config.hidden_size:])
        final.append(normed.to(torch.bfloat16))
        if full_logits:
            greedy.append(target.compute_logits(normed).argmax(-1))
    result = {"tokens": windows, "fused": torch.cat(fused), "final": torch.cat(final)}
    if full_logits:
        result["target_next"] = torch.cat(greedy)
    return result


def make_windows(data: dict, count: int, recipe: Eagle3Recipe, generator, target, split: str) -> torch.Tensor:
    """``count`` windows of seq_len, half code, half prose; a self_generated_fraction of them continued by the
    target's greedy tokens after self_prompt_tokens."""
    streams = data["streams"][split]
    half = count // 2
    windows = torch.cat([random_windows(streams[d], n, recipe.seq_len, generator)
                         for d, n in zip(DOMAINS, (half, count - half))])
    generated = int(count * recipe.self_generated_fraction)
    if generated:
        picked = torch.randperm(count, generator=generator)[:generated]
        windows[picked] = torch.cat([greedy_continue(target, chunk[:, :recipe.self_prompt_tokens], recipe.seq_len)
                                     for chunk in windows[picked].split(16)])
    return windows


def cache_features(target, work: Path, data: dict, recipe: Eagle3Recipe, points: tuple[int, ...]) -> None:
    """The feature shards and the held-out shard, each written once (a shard on disk is skipped on resume)."""
    heldout = work / "heldout.pt"
    if not heldout.is_file():
        generator = torch.Generator().manual_seed(recipe.seed + 1)
        windows = make_windows(data, recipe.heldout_windows, recipe, generator, target, "heldout")
        torch.save(extract(target, windows, recipe.feature_batch, points, full_logits=True), heldout)
    shards = math.ceil(recipe.feature_windows / recipe.shard_windows)
    todo = [i for i in range(shards) if not (work / f"features-{i:05d}.pt").is_file()]
    for index in tqdm(todo, desc="features", unit="shard", dynamic_ncols=True, initial=shards - len(todo),
                      total=shards):
        generator = torch.Generator().manual_seed(recipe.seed + 1000 + index)
        count = min(recipe.shard_windows, recipe.feature_windows - index * recipe.shard_windows)
        windows = make_windows(data, count, recipe, generator, target, "train")
        shard = extract(target, windows, recipe.feature_batch, points)
        torch.save(shard, work / f"features-{index:05d}.part")
        (work / f"features-{index:05d}.part").rename(work / f"features-{index:05d}.pt")  # whole or absent


def train(minutes: float, work: Path, out: Path, recipe: Eagle3Recipe = Eagle3Recipe(),
          target_name: str = DEFAULT_TARGET, corpus=None, max_chunks: int | None = None) -> dict:
    """Run (or resume) the recipe in ``work`` for ``minutes`` of wall clock (or ``max_chunks`` training chunks),
    writing the best head so far to ``out``. ``corpus``: the documents (default the zoo's offline corpus)."""
    torch.set_num_threads(recipe.threads)
    deadline = time.monotonic() + minutes * 60
    work.mkdir(parents=True, exist_ok=True)
    recipe_file = work / "recipe.json"
    if recipe_file.is_file() and json.loads(recipe_file.read_text()) != json.loads(json.dumps(asdict(recipe))):
        raise ValueError(f"{work} was started with another recipe ({recipe_file}); resume with the same settings or "
                         f"use a new --work directory")
    recipe_file.write_text(json.dumps(asdict(recipe), indent=2) + "\n")
    target, tokenizer = load_target(target_name)
    data = prepare_data(work, tokenizer, target.config.vocab_size, recipe, corpus)
    token_map = data["token_map"]
    torch.manual_seed(recipe.seed)
    head = make_head(target, token_map, recipe.warm_start, recipe.aux_layer_ids)
    cache_features(target, work, data, recipe, head.capture_points)
    heldout = torch.load(work / "heldout.pt")
    # fc trains on features scaled to rms 1 per capture point (measured on the held-out windows), folded into
    # its weight when a head is written: raw residual streams (Gemma's are hundreds to thousands) make every
    # optimizer step of fc move the hidden state by far more than its own size
    scale = feature_scale(heldout["fused"], len(head.capture_points))

    optimizer = make_optimizer(head, recipe.lr)
    generator = torch.Generator().manual_seed(recipe.seed + 2)
    state = {"step": 0, "chunks": 0, "curve": [], "evals": [], "best": None, "seconds": 0.0}
    checkpoint_file = work / "checkpoint.pt"
    if checkpoint_file.is_file():
        checkpoint = torch.load(checkpoint_file)
        head.load_state_dict(checkpoint["head"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        generator.set_state(checkpoint["generator"])
        state = checkpoint["state"]
        print(f"resuming at step {state['step']} (chunk {state['chunks']})", file=sys.stderr)
    shards = [torch.load(path) for path in sorted(work.glob("features-*.pt"))]
    tokens, fused, final = (torch.cat([s[name] for s in shards]) for name in ("tokens", "fused", "final"))
    draft_rows = target.lm_head.weight.detach()[token_map].float()           # [Vd, H]

    bar = tqdm(desc=f"{target_name} eagle3", unit="step", initial=state["step"], total=recipe.planned_steps,
               dynamic_ncols=True)
    if recipe.autocast not in ("auto", "on", "off"):
        raise ValueError(f"autocast {recipe.autocast!r}: valid are 'auto', 'on', 'off'")
    bf16 = recipe.autocast == "on" or (recipe.autocast == "auto" and cpu_capability().native_bf16)
    chunks_run = 0
    while state["step"] < recipe.planned_steps and time.monotonic() < deadline and \
            (max_chunks is None or chunks_run < max_chunks):
        started = time.monotonic()
        head.train()
        for _ in range(min(recipe.chunk_steps, recipe.planned_steps - state["step"])):
            pick = torch.randint(0, len(tokens), (recipe.train_batch,), generator=generator)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss, parts = ttt_loss(head, target, draft_rows, tokens[pick], fused[pick].float() * scale,
                                       final[pick], recipe)
            loss.backward()
            step_optimizer(optimizer, head, learning_rate(state["step"], recipe.planned_steps, recipe.lr,
                                                          recipe.warmup_fraction))
            state["step"] += 1
            bar.update(1)
            bar.set_postfix(kl="/".join(f"{p:.2f}" for p in parts))
            if state["step"] % 10 == 0:
                state["curve"].append({"step": state["step"], "kl": parts})
        head.eval()
        state["chunks"] += 1
        chunks_run += 1
        state["seconds"] += time.monotonic() - started
        last = state["step"] >= recipe.planned_steps or time.monotonic() >= deadline or \
            (max_chunks is not None and chunks_run >= max_chunks)
        if state["chunks"] % recipe.eval_every_chunks == 0 or last:
            top1 = heldout_top1(head, heldout["tokens"], heldout["fused"].float() * scale, heldout["target_next"],
                                recipe)
            state["evals"].append({"step": state["step"], **top1})
            bar.write(f"step {state['step']}: held-out top-1 per unrolled step {top1}")
            score = sum(top1.values()) / len(top1)
            if state["best"] is None or score > state["best"]["mean"]:
                state["best"] = {"step": state["step"], "mean": round(score, 4), **top1}
                ship(head, scale, out, recipe, state, data, target_name)
        checkpoint = {"head": head.state_dict(), "optimizer": optimizer.state_dict(),
                      "generator": generator.get_state(), "state": state}
        torch.save(checkpoint, work / "checkpoint.part")
        (work / "checkpoint.part").rename(checkpoint_file)
    bar.close()
    return {"best": state["best"], "steps": state["step"], "chunks": state["chunks"],
            "train_seconds": round(state["seconds"], 1)}


def feature_scale(fused: torch.Tensor, points: int) -> torch.Tensor:
    """[points * H]: per capture point, 1 / the rms of its features in ``fused`` [..., points * H]."""
    blocks = fused.float().unflatten(-1, (points, -1))
    rms = blocks.pow(2).mean(dim=tuple(range(blocks.dim() - 2)) + (-1,)).sqrt()   # [points]
    return (1.0 / rms).repeat_interleave(blocks.shape[-1])


def ship(head: Eagle3Head, scale: torch.Tensor, out: Path, recipe: Eagle3Recipe, state: dict, data: dict,
         target_name: str) -> None:
    """Write the head with the feature scale folded into fc (it reads raw features, as SGLang's does)."""
    trained = head.fc.weight.detach().clone()
    with torch.no_grad():
        head.fc.weight.mul_(scale)
    try:
        save_eagle3_head(head, out, dtype=getattr(torch, recipe.save_dtype))
    finally:
        with torch.no_grad():
            head.fc.weight.copy_(trained)
    record = {
        "model": f"{target_name}-eagle3", "target": target_name,
        "kind": f"EAGLE-3 head for {target_name} (LlamaForCausalLMEagle3 layout; shares the target's embedding; "
                f"{head.draft_vocab_size}-token draft vocabulary)",
        "aux_layer_ids": list(head.config.aux_layer_ids or ()),
        "parameters": sum(p.numel() for p in head.parameters()),
        "feature_rms": [round(1.0 / float(v), 2) for v in scale.view(len(head.capture_points), -1)[:, 0]],
        "best": state["best"], "evals": state["evals"], "loss_curve": state["curve"], "steps": state["step"],
        "train_seconds": round(state["seconds"], 1), "recipe": asdict(recipe), "data": data["summary"],
        "licence": TARGETS[target_name],
        "environment": {"python": platform.python_version(), "torch": torch.__version__,
                        "threads": torch.get_num_threads(), "command": " ".join(sys.argv)},
    }
    (out / "training_record.json").write_text(json.dumps(record, indent=2) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m specswap.zoo.eagle3_training",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--target", default=DEFAULT_TARGET, choices=sorted(TARGETS))
    parser.add_argument("--minutes", type=float, default=120.0, help="wall-clock budget of this run")
    parser.add_argument("--work", type=Path, help="resumable work directory (default "
                                                  "~/.cache/specswap/<target>-eagle3-run)")
    parser.add_argument("--out", type=Path, help="the head's directory (default "
                                                 "python/specswap/zoo/weights/<target>-eagle3)")
    parser.add_argument("--planned-steps", type=int, help=f"lr schedule length (default {Eagle3Recipe.planned_steps})")
    parser.add_argument("--feature-windows", type=int,
                        help=f"windows of features cached (default {Eagle3Recipe.feature_windows})")
    parser.add_argument("--ttt-steps", type=int, help=f"unrolled steps (default {Eagle3Recipe.ttt_steps})")
    parser.add_argument("--aux-layer-ids", type=int, nargs=3, metavar="LAYER",
                        help="the three target layers whose outputs are fused (default SGLang's: 1, L // 2 - 1, L - 4)")
    args = parser.parse_args(argv)
    overrides = {name: value for name, value in (("planned_steps", args.planned_steps),
                                                 ("feature_windows", args.feature_windows),
                                                 ("ttt_steps", args.ttt_steps),
                                                 ("aux_layer_ids", args.aux_layer_ids and tuple(args.aux_layer_ids)))
                 if value is not None}
    summary = train(args.minutes, args.work or default_work(args.target), args.out or default_out(args.target),
                    replace(Eagle3Recipe(), **overrides), args.target)
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
