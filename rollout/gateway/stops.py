"""Stop strings: clients stop on text, engines on ids; this finds where a reply's text meets a stop string.

Contract:
- The schemas bound a request's stop strings (rollout.gateway.schemas): at most `MAX_STOPS_OPENAI` (OpenAI
  Chat's own cap) or `MAX_STOPS_ANTHROPIC` of them, each non-empty and at most `MAX_STOP_CHARS` characters,
  so matching them costs a bounded amount per token.
- `StopScanner.find(text)` is the first stop string the growing text holds; each call scans only what was
  added since the last one, with the tail before it that a stop string could straddle (and any character
  still being decoded), so a streamed reply costs its length, not its length squared.
- `partial_stop(text, stops)` is the length of the longest end of `text` that begins a stop string (held back
  from a stream: the next tokens may complete it).
- `cut_at_stop(decode, ids, stops)` is the shortest prefix of `ids` whose text holds a stop string, and that
  string, or None; it decodes O(log n) prefixes, not n.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

MAX_STOP_CHARS = 256
MAX_STOPS_OPENAI = 4
MAX_STOPS_ANTHROPIC = 16
UNDECODED = "\ufffd"  # what a tokenizer decodes a character still missing bytes to


class StopScanner:
    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(stop for stop in stops if stop)
        self.overlap = max((len(stop) for stop in self.stops), default=1) - 1
        self.scanned = 0  # characters of the text seen settled by the last call

    def find(self, text: str) -> str | None:
        window = text[max(0, self.scanned - self.overlap) :]
        self.scanned = len(text.rstrip(UNDECODED))
        hits = [(at, stop) for stop in self.stops if (at := window.find(stop)) >= 0]
        return min(hits)[1] if hits else None


def partial_stop(text: str, stops: Sequence[str]) -> int:
    if not text:
        return 0
    last, best = text[-1], 0
    for stop in stops:
        # Only a prefix of the stop ending in `last` can end the text: try those, longest first.
        limit = min(len(stop) - 1, len(text))
        while limit > best:
            end = stop.rfind(last, 0, limit) + 1
            if end <= best:
                break
            if text.endswith(stop[:end]):
                best = end
                break
            limit = end - 1
    return best


def cut_at_stop(
    decode: Callable[[list[int]], str], ids: Sequence[int], stops: Sequence[str]
) -> tuple[int, str] | None:
    stops = [stop for stop in stops if stop]

    def hit(k: int) -> str | None:
        text = decode(list(ids[:k]))
        return next((stop for stop in stops if stop in text), None)

    if not stops or hit(len(ids)) is None:
        return None
    low, high = 1, len(ids)  # the text of ids[:high] holds a stop string; find the least such high
    while low < high:
        middle = (low + high) // 2
        if hit(middle) is None:
            low = middle + 1
        else:
            high = middle
    found = hit(high)
    assert found is not None
    return high, found
