"""Random EAGLE-3 heads written in SpecForge's layout (config.json + model.safetensors) for a built target."""

from pathlib import Path

import torch

from specswap.models.eagle3 import Eagle3Config, Eagle3Head, save_eagle3_head


def random_eagle3_config(target, draft_vocab_size=None, aux_layer_ids=None) -> Eagle3Config:
    c = target.config
    return Eagle3Config(hidden_size=c.hidden_size, intermediate_size=2 * c.hidden_size,
                        num_attention_heads=c.num_attention_heads, num_key_value_heads=c.num_key_value_heads,
                        head_dim=c.head_dim, target_vocab_size=c.vocab_size,
                        draft_vocab_size=draft_vocab_size or c.vocab_size, target_hidden_size=c.hidden_size,
                        rms_norm_eps=c.rms_norm_eps, rope=getattr(c, "rope_local", None) or c.rope,
                        aux_layer_ids=None if aux_layer_ids is None else tuple(aux_layer_ids))


def write_random_eagle3(target, directory, seed=1, token_map=None, aux_layer_ids=None, scale=1.0) -> Path:
    """A randomly initialised EAGLE-3 head for ``target`` saved as a checkpoint directory (norm weights random
    too, so a loader that left them at one would show). ``token_map``: draft id -> target id (d2t)."""
    torch.manual_seed(seed)
    config = random_eagle3_config(target, None if token_map is None else len(token_map), aux_layer_ids)
    head = Eagle3Head(config, target.embed_tokens, None if token_map is None else torch.tensor(token_map),
                      config.capture_points(target.config.num_hidden_layers))
    with torch.no_grad():
        for name, parameter in head.named_parameters():
            if name.endswith("norm.weight"):
                parameter.uniform_(0.5, 1.5)
            else:
                parameter.mul_(scale)
    save_eagle3_head(head, directory, dtype=torch.float32)
    return Path(directory)
