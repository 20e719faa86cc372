"""Small random models built through the model classes (no checkpoint needed), and decoding drivers."""

import torch

torch.set_num_threads(1)  # the machine is shared; tiny models gain nothing from threads

from specswap.models import EagleConfig, EagleHead, LlamaConfig, LlamaForCausalLM
from specswap.sampling import SamplingParams
from specswap.worker import SpeculativeWorker


def random_target(vocab_size=64, hidden_size=32, num_layers=2, seed=0, logit_scale=1.0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                         num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=hidden_size // 4, max_position_embeddings=512)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.model.embed_tokens.weight.normal_(0, 1.0)
        model.lm_head.weight.mul_(logit_scale)
    return model


def random_eagle_head(target: LlamaForCausalLM, seed=1, token_map=None) -> EagleHead:
    torch.manual_seed(seed)
    draft_vocab = None if token_map is None else len(token_map)
    config = EagleConfig.for_target(target.config, draft_vocab)
    head = EagleHead(config, target.embed_tokens, target.lm_head,
                     None if token_map is None else torch.tensor(token_map))
    return head.eval()


def run_to_completion(worker: SpeculativeWorker, prompts, max_new_tokens, params=None, switch=None, controller=None):
    """Prefill every prompt into its own slot, then run rounds until each has max_new_tokens tokens.

    ``switch``: optional callable(round_index) -> tier activated in the worker's pool before that round (static
    switch patterns). ``controller``: an AdaptiveController over the worker's pool, fed every round's result (as
    the engine feeds it).
    Returns (tokens per prompt, accept lengths per prompt, tiers used per round).
    """
    params = params or SamplingParams(max_new_tokens=max_new_tokens)
    first = worker.prefill(range(len(prompts)), prompts, [params] * len(prompts))
    outputs = [[token] for token in first]
    accepts = [[] for _ in prompts]
    tiers, running, round_index = [], list(range(len(prompts))), 0
    running = [s for s in running if len(outputs[s]) < max_new_tokens]
    while running:
        if switch is not None:
            worker.pool.activate(switch(round_index))
        result = worker.decode_round(running)
        tiers.append(result.ran.steps)
        if controller is not None:
            controller.observe(result)
        for slot, new, accepted in zip(running, result.new_tokens, result.accept_lengths):
            outputs[slot].extend(new)
            accepts[slot].append(accepted)
        running = [s for s in running if len(outputs[s]) < max_new_tokens]
        round_index += 1
    return [out[:max_new_tokens] for out in outputs], accepts, tiers


def reference_greedy(target: LlamaForCausalLM, prompt, max_new_tokens):
    """Plain greedy decoding that recomputes the whole sequence every token (no cache reuse)."""
    tokens = list(prompt)
    for _ in range(max_new_tokens):
        cache = target.make_cache(1, len(tokens))
        out = target(torch.tensor([tokens]), torch.arange(len(tokens)).unsqueeze(0), cache, torch.tensor([0]))
        tokens.append(int(out.logits[0, -1].argmax()))
    return tokens[len(prompt):]


def attention_pair(vocab_size=64, hidden_size=32, seed=0, head_noise=0.0):
    """A 1-layer random target whose attention matters (half its greedy tokens change when the attention output
    is zeroed), and an EAGLE head that copies its layer and ignores the features: the head then attends over
    the same tokens as the target but the first, so it predicts the target's next token almost always
    (head_noise 0: ~3.9 of 4 drafts accepted), and head_noise > 0 makes it accept a part (0.1: ~1.9 of 4).
    What the target emits depends on its KV cache, the positions and the rollback of rejected drafts, so the
    losslessness tests built on it see bugs there."""
    return _layer_copying_pair(vocab_size, hidden_size, seed, head_noise, attention=True)


def bigram_pair(vocab_size=64, hidden_size=32, seed=0, head_noise=0.0):
    """attention_pair with the target's attention output zeroed: the next token depends on the current one
    only and the head predicts exactly what the target will (head_noise 0), so greedy accepts everything.
    Blind to the KV cache, positions and rollback: only for tests that need a head agreeing everywhere."""
    return _layer_copying_pair(vocab_size, hidden_size, seed, head_noise, attention=False)


def _layer_copying_pair(vocab_size, hidden_size, seed, head_noise, attention):
    target = random_target(vocab_size, hidden_size, num_layers=1, seed=seed, logit_scale=3.0)
    head = random_eagle_head(target, seed=seed + 1)
    with torch.no_grad():
        if not attention:
            target.model.layers[0].self_attn.o_proj.weight.zero_()
        head.layers[0].load_state_dict(target.model.layers[0].state_dict())
        head.norm.load_state_dict(target.model.norm.state_dict())
        eye = torch.eye(hidden_size)
        head.fc.weight.copy_(torch.cat((eye + head_noise * torch.randn(hidden_size, hidden_size),
                                        torch.zeros(hidden_size, hidden_size)), dim=1))
    return target, head


def reference_eagle_drafts(target, head, committed, steps):
    """EAGLE drafts recomputed from scratch by the alignment's definition (greedy): head over
    (x_1..x_{m-1}, f_0..f_{m-2}) at positions 0..m-2, then (d_{i-1}, own hidden) at m+i-3."""
    m = len(committed)
    cache = target.make_cache(1, m + steps + 1)
    slots = torch.tensor([0])
    positions = torch.arange(m - 1).unsqueeze(0)
    features = target(torch.tensor([committed[:-1]]), positions, cache, slots).hidden  # f_0..f_{m-2}
    head_cache = head.make_cache(1, m + steps + 1)
    out = head(torch.tensor([committed[1:]]), features, positions, head_cache, slots)
    logits, hidden = out.logits[:, -1], out.hidden[:, -1:]
    drafts = []
    for i in range(steps):
        draft_id = int(logits.argmax())
        token = draft_id if head.token_map is None else int(head.token_map[draft_id])
        drafts.append(token)
        out = head(torch.tensor([[token]]), hidden, torch.tensor([[m - 1 + i]]), head_cache, slots)
        logits, hidden = out.logits[:, -1], out.hidden
    return drafts
