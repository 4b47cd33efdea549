"""Segments laid out as a prefix tree: every token prefix that several segments share is computed once.

A group's answers repeat its prompt; a conversation's segments (a rewrite, a compaction, a sub-agent) repeat
its opening; seats repeat a system prompt. The gateway recorded every segment's exact ids, so shared prefixes
are found by comparing ids, never by retokenising.

Contract:
- `PrefixForest.add(tokens)` inserts one segment and returns the node of each of its tokens. A node is one
  token at one depth under one parent: two segments share the nodes of their longest common token prefix and
  nothing after it (a segment whose ids another already holds adds no node at all). `cost(tokens)` is how many
  nodes `add` would create: the tokens the forward pass computes for it.
- Nodes are laid out in one row in creation order (a parent before its children); `tokens` and `positions`
  (each node's depth: the position it has in every segment through it) are the row's input ids and position
  ids.
- `visible()` is the row's attention pattern, a bool [L, L]: node i sees node j when j is i or one of i's
  ancestors. Each segment's tokens therefore see exactly its own earlier tokens, at its own positions, as if
  it were alone: its logits, and the gradient flowing back into the shared prefix (summed over the
  continuations that read it), equal the unshared computation's up to float rounding.
- Only layers that mix positions through full causal attention honour such a pattern (a sliding window or a
  recurrent state would see across branches); rollout.training.logprobs decides which models get a tree.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class _Run:
    """Nodes [start, stop) created by one `add`: a chain, each the child of the one before, the first the
    child of `parent` (-1: a root). `seen` lists the ancestors' spans, [start, stop) each."""

    start: int
    stop: int
    seen: tuple[tuple[int, int], ...]


class PrefixForest:
    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.positions: list[int] = []
        self._children: dict[tuple[int, int], int] = {}  # (parent node or -1, token) → node
        self._runs: list[_Run] = []
        self._run_of: list[int] = []  # node → index of the run that created it

    def __len__(self) -> int:
        return len(self.tokens)

    def _shared(self, tokens: Sequence[int]) -> list[int]:
        """The nodes of the longest prefix of `tokens` already in the forest."""
        nodes, parent = [], -1
        for token in tokens:
            node = self._children.get((parent, token))
            if node is None:
                break
            nodes.append(node)
            parent = node
        return nodes

    def cost(self, tokens: Sequence[int]) -> int:
        return len(tokens) - len(self._shared(tokens))

    def add(self, tokens: Sequence[int]) -> list[int]:
        nodes = self._shared(tokens)
        if len(nodes) == len(tokens):
            return nodes
        parent = nodes[-1] if nodes else -1
        if parent < 0:
            seen: tuple[tuple[int, int], ...] = ()
        else:
            above = self._runs[self._run_of[parent]]
            seen = (*above.seen, (above.start, parent + 1))
        start = len(self.tokens)
        for depth in range(len(nodes), len(tokens)):
            node = len(self.tokens)
            self._children[(parent, tokens[depth])] = node
            self.tokens.append(tokens[depth])
            self.positions.append(depth)
            self._run_of.append(len(self._runs))
            nodes.append(node)
            parent = node
        self._runs.append(_Run(start, len(self.tokens), seen))
        return nodes

    def visible(self) -> torch.Tensor:
        """[L, L] bool: True where the row's node i (query) may attend to node j (key)."""
        size = len(self.tokens)
        visible = torch.zeros((size, size), dtype=torch.bool)
        for run in self._runs:
            length = run.stop - run.start
            visible[run.start : run.stop, run.start : run.stop] = torch.ones(
                (length, length), dtype=torch.bool
            ).tril()
            for start, stop in run.seen:
                visible[run.start : run.stop, start:stop] = True
        return visible
