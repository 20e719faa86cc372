"""A static, per-layer KV cache indexed by (slot, position).

Every request owns one row (``slot``) of each layer's buffer; a token's key
and value live at its absolute position in that row. Attention only reads
keys at positions <= the query's position, so entries past a request's
current length are never read: rolling back rejected draft tokens is just
forgetting a length, with no copies. (A draft tree's nodes are stored side by
side past the root; its accepted path is moved into place, ``move``.)
"""

from __future__ import annotations

import torch


class KVCache:
    """One key and one value buffer per layer, preallocated at start-up.

    keys[i], values[i]: [max_batch_size, num_kv_heads, capacity, head_dim]
    """

    def __init__(self, num_layers: int, max_batch_size: int, num_kv_heads: int, capacity: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):
        for name, value in (("num_layers", num_layers), ("max_batch_size", max_batch_size),
                            ("num_kv_heads", num_kv_heads), ("capacity", capacity), ("head_dim", head_dim)):
            if value < 1:
                raise ValueError(f"KVCache {name}={value}; it must be >= 1")
        shape = (max_batch_size, num_kv_heads, capacity, head_dim)
        self.keys: list[torch.Tensor] = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values: list[torch.Tensor] = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.capacity = capacity
        self.max_batch_size = max_batch_size
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.device = torch.device(device)
        # key_positions: [capacity], reused by every forward to build the causal mask
        self.key_positions = torch.arange(capacity, device=device)

    @property
    def num_layers(self) -> int:
        return len(self.keys)

    def move(self, slots: torch.Tensor, sources: torch.Tensor, destinations: torch.Tensor) -> None:
        """Copy every layer's entries at positions ``sources`` to ``destinations`` in rows ``slots``.

        slots: [B]; sources, destinations: [B, N]. All sources are read before any destination is written, so
        the two may overlap (a draft tree's accepted path laid out as a chain).
        """
        rows = slots[:, None]
        for buffer in (*self.keys, *self.values):
            buffer[rows, :, destinations] = buffer[rows, :, sources]

    def memory_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))

    def __repr__(self) -> str:
        return (f"KVCache(layers={self.num_layers}, max_batch_size={self.max_batch_size}, "
                f"kv_heads={self.num_kv_heads}, capacity={self.capacity}, head_dim={self.head_dim}, "
                f"dtype={self.dtype}, {self.memory_bytes() / 2**20:.1f} MiB)")
