"""How a tier's verified tokens are laid out: a chain, or a draft tree.

The round driver verifies [x_{m-1}, d_1..d_k] in one target forward and hands
the result to its tier's layout, which accepts and returns what the rest of
the round reads as a chain: accept lengths, the next tokens, the accepted
tokens' positions and target hidden states in path order.

- ``ChainLayout``: d_i follows d_{i-1} (every drafter's default). Acceptance is
  ``sampling.accept``; nothing is moved.
- ``TreeLayout``: node i's parent is ``parents[i]`` (a drafter's
  ``tree_parents``). The verify forward takes the tree's mask (a node sees its
  ancestors), node i's keys are stored at cache position m-1+i, its rotary
  position is m-1+depth. Acceptance follows the target's choice down the tree
  (greedy, or keyed draws for deterministic drafts); the accepted path is then
  laid out as a chain: its tokens into the tier's verify and draft buffers,
  its keys and values moved to positions m-1..m-1+a, its hidden states
  gathered. Drafts with a law (EAGLE, standalone) would need multi-draft
  acceptance; a tree tier refuses them.
"""

from __future__ import annotations

from typing import Sequence

import torch

from specswap.sampling import RoundSampling, Verifier, accept, accept_greedy_tree, keyed_draws


class ChainLayout:
    """k drafts verified as one chain."""

    tree_mask = None

    def __init__(self, steps: int, device: torch.device):
        self.offsets = torch.arange(steps + 1, device=device)  # [k+1] each token's position past m-1

    @property
    def num_draft_tokens(self) -> int:
        """Tokens the verify reads: x_{m-1} and the drafts (SGLang's speculative_num_draft_tokens)."""
        return len(self.offsets)

    def accept(self, verifier: Verifier, out, verify_ids: torch.Tensor, draft_tokens: torch.Tensor,
               positions: torch.Tensor, slot_index: torch.Tensor, sampling: RoundSampling | None):
        """-> (accept_lengths [B], next_tokens [B], positions [B, k+1], target hidden [B, k+1, H]) in path order."""
        accept_lengths, next_tokens = accept(verifier, out.logits, draft_tokens, sampling)
        return accept_lengths, next_tokens, positions, out.hidden


class TreeLayout:
    """k draft nodes verified as one tree; ``parents[i] < i`` is node i's parent (``parents[0]`` is -1: the root,
    x_{m-1})."""

    def __init__(self, parents: Sequence[int], cache, device: torch.device, keyed_sampling: bool):
        parents = list(parents)
        if not parents or parents[0] != -1 or any(not 0 <= p < i for i, p in enumerate(parents) if i):
            raise ValueError(f"tree parents {parents} must start with -1 (the root) and give every other node an "
                             f"earlier node as parent")
        if not keyed_sampling:
            raise ValueError("a tree tier accepts greedy rounds and keyed draws of deterministic drafts; drafts "
                             "drawn from a law need multi-draft acceptance, which is not built")
        nodes = len(parents)
        depths = [0] * nodes
        for i in range(1, nodes):
            depths[i] = depths[parents[i]] + 1
        self.depths = depths
        self.children = [[c for c in range(nodes) if parents[c] == i] for i in range(nodes)]
        # ancestors-or-self of each node, root first
        lineage = [[0]]
        for i in range(1, nodes):
            lineage.append(lineage[parents[i]] + [i])
        self.cache = cache
        self.offsets = torch.tensor(depths, device=device)                     # [T] rotary position past m-1
        self.chain = torch.arange(nodes, device=device)                        # [T] a chain's offsets
        mask = torch.zeros(nodes, nodes, dtype=torch.bool)
        for i, line in enumerate(lineage):
            mask[i, line] = True
        self.tree_mask = mask.to(device)                                       # [T, T] node i sees node j
        self.parents = torch.tensor([max(p, 0) for p in parents], device=device)
        self.ancestors = mask.float().to(device)
        self.ancestors[:, 0] = 0                                               # the root is never a miss
        self.depth_rank = torch.tensor([d * nodes + nodes - 1 - i for i, d in enumerate(depths)], device=device)
        # paths[t]: the nodes from the root to t, then t again up to T entries (past the accepted length they
        # are written past the committed length, where nothing reads them)
        self.paths = torch.tensor([line + [line[-1]] * (nodes - len(line)) for line in lineage], device=device)

    num_draft_tokens = ChainLayout.num_draft_tokens

    def accept(self, verifier: Verifier, out, verify_ids: torch.Tensor, draft_tokens: torch.Tensor,
               positions: torch.Tensor, slot_index: torch.Tensor, sampling: RoundSampling | None):
        """ChainLayout.accept over the tree, then the accepted path laid out as a chain."""
        if sampling is None:
            last, next_tokens = accept_greedy_tree(out.logits, verify_ids, self.parents, self.ancestors,
                                                   self.depth_rank)                     # [B], [B]
            paths = self.paths[last]                                                     # [B, T]
        else:
            paths, next_tokens = self._accept_keyed(verifier, out.logits, verify_ids, sampling)
        accept_lengths = self.offsets[paths[:, -1]]                                      # [B] depth of the last
        verify_ids.copy_(verify_ids.gather(1, paths))
        draft_tokens.copy_(verify_ids[:, 1:])
        root = positions[:, :1]                                                          # [B, 1] m-1
        chain_positions = root + self.chain
        self.cache.move(slot_index, root + paths, chain_positions)
        hidden = out.hidden.gather(1, paths.unsqueeze(-1).expand(-1, -1, out.hidden.shape[-1]))
        return accept_lengths, next_tokens, chain_positions, hidden

    def _accept_keyed(self, verifier: Verifier, logits: torch.Tensor, verify_ids: torch.Tensor,
                      sampling: RoundSampling) -> tuple[torch.Tensor, torch.Tensor]:
        if sampling.keyed is None:
            raise ValueError("a tree tier's sampled rounds need keyed draws (deterministic drafts)")
        node_tokens = verify_ids.tolist()
        paths, tokens = [], []
        for row, draw in enumerate(keyed_draws(logits, sampling, self.depths)):
            path, token = verifier.keyed_tree(draw, node_tokens[row], self.children)
            paths.append(path + [path[-1]] * (len(self.depths) - len(path)))
            tokens.append(token)
        device = logits.device
        return torch.tensor(paths, device=device), torch.tensor(tokens, device=device)
