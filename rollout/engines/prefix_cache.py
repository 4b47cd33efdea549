"""Key/value states kept across requests, so a conversation's next turn prefills only its new tokens.

Contract:
- An entry holds, for a run of token ids, every layer's keys and values (`[heads, tokens, head_dim]` each),
  computed by one model: `key` names what computed them (a served name and the load that made it), and a
  lookup never answers with another key's entry, so a prefix is never reused across checkpoints.
- `longest(key, ids)` is the entry sharing the longest prefix with `ids` and that length; the first `length`
  positions of its states are exactly what a fresh forward pass over `ids[:length]` computes (attention is
  causal), so they may stand in for it.
- The states held never exceed `budget_bytes`: `put` evicts the least recently used entries first (a lookup
  that answers counts as a use); an entry bigger than the whole budget is not kept. An entry whose ids are a
  prefix of a newer one's (same key) is dropped when the newer arrives: the newer answers every lookup the
  older would, at least as long.
- `drop(key)` forgets a key's entries (its checkpoint was unloaded); `clear()` forgets all (the engine
  sleeps). Counters: `queried` prompt tokens looked up, `reused` tokens answered from the cache.
- Safe to call from several threads (the sampling thread puts and looks up, the event loop drops).
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from dataclasses import dataclass

import torch

States = tuple[tuple[torch.Tensor, torch.Tensor], ...]  # per layer: keys, values, [heads, tokens, dim]


@dataclass(frozen=True)
class Entry:
    key: str
    ids: torch.Tensor  # int64, on the CPU
    states: States
    nbytes: int

    def __len__(self) -> int:
        return int(self.ids.numel())

    def shared_with(self, ids: torch.Tensor) -> int:
        """How many leading ids this entry shares with `ids`."""
        n = min(len(self), int(ids.numel()))
        if n == 0:
            return 0
        differs = (self.ids[:n] != ids[:n]).nonzero()
        return int(differs[0, 0]) if differs.numel() else n


def entry(key: str, ids: tuple[int, ...] | list[int], states: States) -> Entry:
    nbytes = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in states)
    return Entry(key, torch.tensor(ids, dtype=torch.long), states, nbytes)


class PrefixCache:
    def __init__(self, budget_bytes: int) -> None:
        if budget_bytes < 0:
            raise ValueError(f"a prefix cache's budget is a number of bytes ≥ 0, not {budget_bytes}")
        self.budget_bytes = budget_bytes
        self._entries: OrderedDict[int, Entry] = OrderedDict()  # least recently used first
        self._numbers = itertools.count()
        self._lock = threading.Lock()
        self.held_bytes = 0
        self.queried = 0
        self.reused = 0

    def __len__(self) -> int:
        return len(self._entries)

    def longest(self, key: str, ids: tuple[int, ...] | list[int]) -> tuple[Entry | None, int]:
        """The entry of `key` sharing the longest prefix with `ids`, and that length (None, 0: none shares
        any)."""
        wanted = torch.tensor(ids, dtype=torch.long)
        with self._lock:
            best, best_number, length = None, None, 0
            for number, candidate in self._entries.items():
                if candidate.key != key:
                    continue
                shared = candidate.shared_with(wanted)
                if shared > length:
                    best, best_number, length = candidate, number, shared
            if best_number is not None:
                self._entries.move_to_end(best_number)
            return best, length

    def record(self, queried: int, reused: int) -> None:
        """Count a batch's prompt tokens and those of them answered from the cache."""
        with self._lock:
            self.queried += queried
            self.reused += reused

    def put(self, new: Entry) -> bool:
        """Keep `new` (evicting what the budget needs); False when it is bigger than the whole budget."""
        if new.nbytes > self.budget_bytes or len(new) == 0:
            return False
        with self._lock:
            for number, old in list(self._entries.items()):
                if old.key == new.key and len(old) <= len(new) and old.shared_with(new.ids) == len(old):
                    self._forget(number)
            while self._entries and self.held_bytes + new.nbytes > self.budget_bytes:
                self._forget(next(iter(self._entries)))
            self._entries[next(self._numbers)] = new
            self.held_bytes += new.nbytes
            return True

    def drop(self, key: str) -> None:
        with self._lock:
            for number in [n for n, e in self._entries.items() if e.key == key]:
                self._forget(number)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.held_bytes = 0

    def _forget(self, number: int) -> None:
        self.held_bytes -= self._entries.pop(number).nbytes
