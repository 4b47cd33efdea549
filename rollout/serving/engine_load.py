"""What an engine says of its load and its prefix cache, read from its Prometheus `/metrics` (vLLM's, and
rollout's engine server's, which uses vLLM's names).

Contract:
- `parse_metrics(text)` sums each metric over its label sets: `vllm:prefix_cache_queries_total` and
  `vllm:prefix_cache_hits_total` (prompt tokens looked up in the prefix cache, and found: counters since the
  engine started), `vllm:num_requests_running` and `vllm:num_requests_waiting`, and the reason of
  `rollout:prefix_cache_off{reason=...}` when the engine keeps no prefix cache. Lines it does not know are
  skipped; a malformed value is none.
- `fetch_engine_load(url, api_key)` asks the engine (with the engine API key) and never raises: None when the
  engine does not answer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import httpx

_SAMPLE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)")
_REASON = re.compile(r'reason="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class EngineLoad:
    running: int = 0  # requests being generated
    waiting: int = 0  # requests queued behind them
    queried: int = 0  # prompt tokens looked up in the prefix cache since the engine started
    hits: int = 0  # of those, found
    cache_off: str | None = None  # why the engine keeps no prefix cache, when it says

    @property
    def in_flight(self) -> int:
        return self.running + self.waiting

    @property
    def hit_rate(self) -> float | None:
        return self.hits / self.queried if self.queried else None

    def describe(self) -> str:
        """`prefix cache 87% of 12,345 prompt tokens · 3 in flight`, as status lines show it."""
        if self.cache_off is not None:
            cache = f"no prefix cache ({self.cache_off})"
        elif self.hit_rate is None:
            cache = "prefix cache: no prompt yet"
        else:
            cache = f"prefix cache {self.hit_rate:.0%} of {self.queried:,} prompt tokens"
        return f"{cache} · {self.in_flight} in flight"


def parse_metrics(text: str) -> EngineLoad:
    totals: dict[str, float] = {}
    cache_off: str | None = None
    for line in text.splitlines():
        if line.startswith("#") or not (found := _SAMPLE.match(line.strip())):
            continue
        name, labels = found["name"], found["labels"] or ""
        try:
            value = float(found["value"])
        except ValueError:
            continue
        if value != value or value in (float("inf"), float("-inf")):
            continue
        if name == "rollout:prefix_cache_off" and value and (reason := _REASON.search(labels)):
            cache_off = reason[1].replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
        totals[name] = totals.get(name, 0.0) + value
    return EngineLoad(
        running=int(totals.get("vllm:num_requests_running", 0)),
        waiting=int(totals.get("vllm:num_requests_waiting", 0)),
        queried=int(totals.get("vllm:prefix_cache_queries_total", 0)),
        hits=int(totals.get("vllm:prefix_cache_hits_total", 0)),
        cache_off=cache_off,
    )


def fetch_engine_load(url: str, api_key: str | None, timeout_s: float = 3.0) -> EngineLoad | None:
    headers = {"authorization": f"Bearer {api_key}"} if api_key else None
    try:
        answer = httpx.get(f"{url.rstrip('/')}/metrics", headers=headers, timeout=timeout_s)
    except httpx.HTTPError:
        return None
    return parse_metrics(answer.text) if answer.status_code == 200 else None
