"""How a tier's verified tokens are laid out: a chain, or a draft tree.

The round driver verifies [x_{m-1}, d_1..d_k] in one target forward and hands
the result to its tier's layout, which accepts and returns what the rest of
the round reads as a chain: accept lengths, the next tokens, the accepted
tokens' positions and target hidden states in path order.

- ``ChainLayout``: d_i follows d_{i-1} (every drafter's default). Acceptance is
  ``sampling.accept``; nothing is moved.
- ``TreeLayout``: node i's parent is ``parents[b, i]`` (< i), per request and
  per round: a tree drafter writes each round's tree (EAGLE-2's dynamic trees,
  a trie of lookups), or a fixed tree (a drafter's ``tree_parents``) is
  written once. ``prepare`` derives the rest on tensors: each node's depth,
  its ancestors, the verify's mask (a node sees its ancestors). Node i's keys
  are stored at cache position m-1+i, its rotary position is m-1+depth.
  Acceptance follows the target down the tree: greedy (the deepest node whose
  path is the target's argmax), keyed draws for deterministic drafts, or
  multi-draft recursive rejection (``sampling.accept_tree_law``: each child
  in turn, the target law replaced by its residual after a rejection). The
  accepted path is then laid out as a chain: its tokens into the tier's
  verify and draft buffers, its keys and values moved to positions
  m-1..m-1+a, its hidden states gathered. A tree also tells what its chain
  would have accepted: every tree drafter writes a node's children best
  first, so the path of first children from the root is the chain of the
  tree's depth (cut where the tree stopped expanding it), and the accepted
  path's leading nodes on it are that chain's accepted drafts (greedy, or
  keyed draws: the chain's tokens meet the same draws).
"""

from __future__ import annotations

from typing import Sequence

import torch

from specswap._core import tier_key, tier_shape  # noqa: F401  (a tier's key: re-exported for the engine and flags)
from specswap.sampling import RoundSampling, Verifier, accept, accept_greedy_tree, keyed_draws, logits_to_probs


def max_tree_nodes(steps: int, topk: int) -> int:
    """The most tokens a tree of this depth and branching can verify, the root included: every candidate its
    expansion makes (topk at depth 1, topk * topk past it)."""
    return 1 + topk + (steps - 1) * topk * topk


def tree_shape(steps: int, topk: int = 1, num_draft_tokens: int | None = None) -> tuple[int, int, int]:
    """A tier's shape as SGLang names it, checked: (speculative_num_steps: the depth, speculative_eagle_topk: the
    children each expanded node keeps, speculative_num_draft_tokens: the tokens verified, the root included).
    A chain is topk 1 with steps + 1 tokens; a tree defaults to steps * topk nodes (every depth's frontier),
    and holds at most the candidates its expansion makes (topk at depth 1, topk * topk past it)."""
    for name, value in (("speculative_num_steps", steps), ("speculative_eagle_topk", topk)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name} must be an int; got {value!r}")
    if topk < 1:
        raise ValueError(f"speculative_eagle_topk must be >= 1; got {topk}")
    if topk == 1:
        if num_draft_tokens not in (None, steps + 1):
            raise ValueError(f"speculative_num_draft_tokens {num_draft_tokens} with speculative_eagle_topk 1: a "
                             f"chain of {steps} steps verifies {steps + 1} tokens")
        return steps, 1, steps + 1
    if steps < 1:
        raise ValueError(f"a draft tree (speculative_eagle_topk {topk}) needs speculative_num_steps >= 1; got {steps}")
    most = max_tree_nodes(steps, topk)
    nodes = min(1 + steps * topk, most) if num_draft_tokens is None else num_draft_tokens
    if isinstance(nodes, bool) or not isinstance(nodes, int) or not steps + 1 <= nodes <= most:
        raise ValueError(f"speculative_num_draft_tokens {num_draft_tokens!r} does not fit the tree of "
                         f"speculative_num_steps {steps}, speculative_eagle_topk {topk}: it needs "
                         f"{steps + 1}..{most} (the root, a path to the full depth, at most every candidate)")
    return steps, topk, nodes


class ChainLayout:
    """k drafts verified as one chain."""

    tree_mask = None
    dynamic = False

    def __init__(self, steps: int, device: torch.device):
        self.offsets = torch.arange(steps + 1, device=device)  # [k+1] each token's position past m-1

    def prepare(self, batch: int) -> None:
        """Nothing to derive: a chain is the same every round."""

    def offsets_for(self, batch: int) -> torch.Tensor:
        return self.offsets

    def mask_for(self, batch: int) -> None:
        return None

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
    """``nodes`` tokens verified as one tree per request: the root x_{m-1} and nodes - 1 drafts, ``depth`` at
    most deep. ``parents`` (a fixed tree: [-1, parent of node 1, ...], each parent an earlier node) is written
    into every row once; without it the drafter writes ``self.parents[:B]`` each round (the root's entry is 0)
    and the round calls ``prepare(B)``."""

    def __init__(self, nodes: int, depth: int, cache, device: torch.device, rows: int,
                 parents: Sequence[int] | None = None):
        if parents is not None:
            parents = list(parents)
            if not parents or parents[0] != -1 or any(not 0 <= p < i for i, p in enumerate(parents) if i):
                raise ValueError(f"tree parents {parents} must start with -1 (the root) and give every other node an "
                                 f"earlier node as parent")
            nodes = len(parents)
            depths = [0] * nodes
            for i in range(1, nodes):
                depths[i] = depths[parents[i]] + 1
            depth = max(depths)
        if nodes < 2 or depth < 1 or depth > nodes - 1:
            raise ValueError(f"a draft tree of {nodes} nodes (the root included) and depth {depth} is impossible")
        self.nodes, self.depth, self.cache, self.device = nodes, depth, cache, device
        self.dynamic = parents is None
        long = dict(dtype=torch.long, device=device)
        self.parents = torch.zeros(rows, nodes, **long)                        # [S, T] node i's parent (root: 0)
        self.depths = torch.zeros(rows, nodes, **long)                         # [S, T] rotary position past m-1
        self.tree_mask = torch.zeros(rows, nodes, nodes, dtype=torch.bool, device=device)  # [S, T, T] i sees j
        self.tree_mask[:, 0, 0] = True
        self.ancestors = torch.zeros(rows, nodes, nodes, device=device)        # [S, T, T] non-root ancestor-or-self
        self.depth_rank = torch.zeros(rows, nodes, **long)                     # [S, T] orders nodes by depth
        self.on_chain = torch.zeros(rows, nodes, dtype=torch.bool, device=device)  # [S, T] on the first-child path
        self.chain_depth = torch.zeros(rows, **long)                           # [S] that path's depth
        self.chain_accepted = torch.zeros(rows, **long)                        # [S] its nodes the last round accepted
        self._index = torch.arange(nodes, **long)
        self._rows = torch.arange(rows, **long)
        self._eye = torch.eye(nodes, dtype=torch.bool, device=device)
        # [T, T] j is a draft node before i: an earlier sibling of i where they share a parent
        self._before = torch.ones(nodes, nodes, dtype=torch.bool, device=device).tril(-1)
        self._before[:, 0] = False
        self.chain = self._index                                               # [T] a chain's offsets
        self.extend_width = depth + 1                                          # the accepted path's room
        self.children: list[list[int]] | None = None
        if parents is not None:
            self.parents[:] = torch.tensor([max(p, 0) for p in parents], **long)
            self.children = [[c for c in range(nodes) if parents[c] == i] for i in range(nodes)]
            self._derive(rows)

    @classmethod
    def fixed(cls, parents: Sequence[int], cache, device: torch.device, rows: int = 1) -> "TreeLayout":
        """The same tree for every request and round."""
        return cls(0, 0, cache, device, rows, parents)

    @property
    def num_draft_tokens(self) -> int:
        """Tokens the verify reads: the root and the draft nodes (SGLang's speculative_num_draft_tokens)."""
        return self.nodes

    def prepare(self, batch: int) -> None:
        """Depths, ancestors and the verify mask of rows 0..batch-1 from their parents, on tensors (no host
        sync: a round graph records it)."""
        if self.dynamic:  # a fixed tree was derived once, for every row
            self._derive(batch)

    def _derive(self, batch: int) -> None:
        parents, mask, depths = self.parents[:batch], self.tree_mask[:batch], self.depths[:batch]
        for i in range(1, self.nodes):  # parents come first: their rows are final when a child reads them
            parent = parents[:, i]                                             # [B]
            mask[:, i] = mask[self._rows[:batch], parent] | self._eye[i]
            depths[:, i] = depths.gather(1, parent.unsqueeze(-1)).squeeze(-1) + 1
        ancestors = self.ancestors[:batch]
        ancestors.copy_(mask)
        ancestors[:, :, 0] = 0                                                 # the root is never a miss
        self.depth_rank[:batch] = depths * self.nodes + (self.nodes - 1 - self._index)
        # the chain's path: nodes whose every non-root ancestor-or-self is its parent's first child
        later_child = ((parents.unsqueeze(-1) == parents.unsqueeze(1)) & self._before).any(-1)   # [B, T]
        on_chain = self.on_chain[:batch]
        on_chain.copy_((ancestors * later_child.unsqueeze(1)).sum(-1) == 0)
        self.chain_depth[:batch] = torch.where(on_chain, depths, 0).amax(-1)

    def offsets_for(self, batch: int) -> torch.Tensor:
        return self.depths[:batch]

    def mask_for(self, batch: int) -> torch.Tensor:
        return self.tree_mask[:batch]

    def accept(self, verifier: Verifier, out, verify_ids: torch.Tensor, draft_tokens: torch.Tensor,
               positions: torch.Tensor, slot_index: torch.Tensor, sampling: RoundSampling | None):
        """ChainLayout.accept over the tree, then the accepted path laid out as a chain (its first depth + 1
        positions and hidden states: the accepted length is at most the depth)."""
        batch = verify_ids.shape[0]
        if sampling is None:
            last, next_tokens = accept_greedy_tree(out.logits, verify_ids, self.parents[:batch],
                                                   self.ancestors[:batch], self.depth_rank[:batch])  # [B], [B]
            paths = self._paths(batch, last)                                             # [B, T]
        else:
            paths, next_tokens = self._accept_sampled(verifier, out.logits, verify_ids, sampling)
        accept_lengths = self.depths[:batch].gather(1, paths[:, -1:]).squeeze(-1)      # [B] depth of the last
        accepted = (self._index >= 1) & (self._index <= accept_lengths.unsqueeze(-1))   # [B, T] path entries 1..a
        self.chain_accepted[:batch] = (self.on_chain[:batch].gather(1, paths) & accepted).sum(-1)
        verify_ids.copy_(verify_ids.gather(1, paths))
        draft_tokens.copy_(verify_ids[:, 1:])
        root = positions[:, :1]                                                          # [B, 1] m-1
        chain_positions = root + self.chain
        self.cache.move(slot_index, root + paths, chain_positions)
        self.last_paths = paths
        width = self.extend_width
        hidden = out.hidden.gather(1, paths[:, :width].unsqueeze(-1).expand(-1, -1, out.hidden.shape[-1]))
        return accept_lengths, next_tokens, chain_positions[:, :width], hidden

    def _paths(self, batch: int, last: torch.Tensor) -> torch.Tensor:
        """[B, T]: the nodes from the root to ``last`` (ancestors have smaller indices), then ``last`` repeated
        (past the accepted length they are written past the committed length, where nothing reads them)."""
        line = self.tree_mask[:batch].gather(1, last.view(-1, 1, 1).expand(-1, 1, self.nodes)).squeeze(1)  # [B, T]
        order = torch.where(line, self._index, self._index + self.nodes).argsort(dim=-1)                 # [B, T]
        count = self.depths[:batch].gather(1, last.unsqueeze(-1)) + 1                                    # [B, 1]
        return torch.where(self._index < count, order, last.unsqueeze(-1))

    def _children(self, batch: int) -> list[list[list[int]]]:
        if self.children is not None:
            return [self.children] * batch
        rows = []
        for parents in self.parents[:batch].tolist():
            children = [[] for _ in parents]
            for node in range(1, len(parents)):
                children[parents[node]].append(node)
            rows.append(children)
        return rows

    def _accept_sampled(self, verifier: Verifier, logits: torch.Tensor, verify_ids: torch.Tensor,
                        sampling: RoundSampling) -> tuple[torch.Tensor, torch.Tensor]:
        """Keyed draws for deterministic drafts (NGRAM), else multi-draft recursive rejection against the drafts'
        laws: a tree drafter's children are its top-k tokens, so each child's law is a point mass there (None).
        Host-side per request (a sampled round syncs anyway)."""
        batch = verify_ids.shape[0]
        node_tokens = verify_ids.tolist()
        children = self._children(batch)
        depths = self.depths[:batch].tolist()
        paths, tokens = [], []
        if sampling.keyed is not None:
            for row, draw in enumerate(keyed_draws(logits, sampling, depths)):
                path, token = verifier.keyed_tree(draw, node_tokens[row], children[row])
                paths.append(path)
                tokens.append(token)
        else:
            uniforms = sampling.uniforms.tolist()
            residual = sampling.residual_uniforms.tolist()
            for row in range(batch):
                def target_law(node: int, row: int = row) -> torch.Tensor:
                    return logits_to_probs(logits[row, node:node + 1], sampling.temperature[row:row + 1],
                                           sampling.top_k[row:row + 1], sampling.top_p[row:row + 1],
                                           sampling.apply_filters)[0]
                path, token = verifier.tree_law(target_law, node_tokens[row], children[row], lambda node: None,
                                                uniforms[row], residual[row])
                paths.append(path)
                tokens.append(token)
        paths = [path + [path[-1]] * (self.nodes - len(path)) for path in paths]
        device = logits.device
        return torch.tensor(paths, device=device), torch.tensor(tokens, device=device)
