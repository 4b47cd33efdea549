"""A streamed turn while it is sampled: the engine's tokens in, the reply's text out as soon as it is settled.

Contract:
- `SettledText` turns the ids sampled so far into reasoning and text deltas. It parses the prefix with the
  model's renderer (the same parse the whole reply gets) and sends only what more tokens cannot change: it
  holds back trailing whitespace (the parse strips it at the end of the reply and before a tool call), a
  character still being decoded, a tag being written (from a trailing `<` with no `>` or space after it: the
  renderer's tool-call and reasoning markers are tags) and the start of a stop string. Once a tool call has
  begun nothing more is sent until the end (tool calls are parsed from the whole reply). Reasoning is sent
  before text, never after it.
- At the end `SettledText.finish` compares the whole reply's parse with what was sent: the rest is sent, and
  the reply recorded is exactly what the client was sent (without leading whitespace it was not sent). If the
  parse of the whole reply does not extend what was sent (a renderer whose markers are not tags), the recorded
  reply keeps what was sent and the record names the divergence among its parse failures.
- `LiveTurn.deltas` yields those deltas as the engine's chunks arrive (chunks that arrive together are parsed
  once) and ends when the engine finishes or a stop string is completed (the engine's generation is then
  stopped; each batch of chunks is scanned for one only where it could have been completed:
  rollout.gateway.stops). `LiveTurn.sampled` is then the turn to record. `LiveTurn.abort` stops the engine's
  generation and gives the turn sampled so far, to record as aborted. `on_end` is called once the engine's
  generation is over, however it ends (a live turn dropped unstreamed ends when it is collected).
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import replace
from typing import Literal

from rollout.contracts import Message, ToolSpec
from rollout.engines.protocol import SampleChunk, SampleResult, collected
from rollout.gateway.sampled import Sampled
from rollout.gateway.stops import StopScanner, partial_stop
from rollout.ledger.payloads import SampledTurn
from rollout.rendering import ModelRenderer

Delta = tuple[Literal["reasoning", "text"], str]
MAX_TAG = 32  # characters: longer than any renderer's marker, short enough not to hold back a `<` in prose


def _settled(text: str, stops: tuple[str, ...]) -> str:
    """The part of `text` that the tokens still to come cannot change (leading whitespace is left out too:
    parses strip it, an open reasoning block's before its close does)."""
    text = text.lstrip()
    while True:
        before = text
        text = text.rstrip().rstrip("\ufffd")
        tag = text.rfind("<")
        if tag >= 0 and len(text) - tag <= MAX_TAG and not any(c == ">" or c.isspace() for c in text[tag:]):
            text = text[:tag]
        if held := partial_stop(text, stops):
            text = text[:-held]
        if text == before:
            return text


class SettledText:
    def __init__(
        self, renderer: ModelRenderer, tools: list[ToolSpec], prompt: list[int], stops: tuple[str, ...]
    ) -> None:
        self.renderer, self.tools, self.prompt, self.stops = renderer, tools, prompt, stops
        self.reasoning = ""  # sent so far
        self.text = ""
        self.tool_started = False

    def feed(self, ids: list[int]) -> list[Delta]:
        if self.tool_started:
            return []
        parsed = self.renderer.parse_prefix(ids, self.tools, self.prompt)
        deltas: list[Delta] = []
        reasoning = parsed.reasoning
        if not self.text:
            # Open reasoning may still grow; closed reasoning is whole (and is sent before any text).
            settled = _settled(reasoning, ()) if parsed.reasoning_open else reasoning
            if settled.startswith(self.reasoning) and len(settled) > len(self.reasoning):
                deltas.append(("reasoning", settled[len(self.reasoning) :]))
                self.reasoning = settled
        self.tool_started = parsed.tool_started
        if not parsed.reasoning_open and not self.tool_started and reasoning == self.reasoning:
            settled = _settled(parsed.text, self.stops)
            if settled.startswith(self.text) and len(settled) > len(self.text):
                deltas.append(("text", settled[len(self.text) :]))
                self.text = settled
        return deltas

    def finish(self, reply: Message) -> tuple[list[Delta], Message, str | None]:
        """The deltas still to send, the reply as the client will have received it, and any divergence."""
        deltas: list[Delta] = []
        reasoning, text = (
            _unless_sent(reply.reasoning or "", self.reasoning),
            _unless_sent(reply.text, self.text),
        )
        divergence = None
        if reasoning.startswith(self.reasoning) and (not self.text or reasoning == self.reasoning):
            if len(reasoning) > len(self.reasoning):
                deltas.append(("reasoning", reasoning[len(self.reasoning) :]))
        else:
            divergence = f"stream_divergence: reasoning sent {self.reasoning!r}, parsed {reasoning!r}"
            reasoning = self.reasoning
        if text.startswith(self.text):
            if len(text) > len(self.text):
                deltas.append(("text", text[len(self.text) :]))
        else:
            divergence = f"stream_divergence: text sent {self.text!r}, parsed {text!r}"
            text = self.text
        streamed = reply.model_copy(update={"text": text, "reasoning": reasoning or None})
        return deltas, streamed, divergence


class LiveTurn:
    def __init__(
        self,
        *,
        first: SampleChunk,
        chunks: AsyncGenerator[SampleChunk],
        text: SettledText,
        model: str,
        prompt_tokens: int,
        build: Callable[[SampleResult], Sampled],
        on_end: Callable[[], None] = lambda: None,
    ) -> None:
        self.model, self.prompt_tokens = model, prompt_tokens
        self._text, self._build, self._chunks = text, build, chunks
        self._stops = StopScanner(text.stops)
        # Called once the engine's generation is over: streamed to its end, stopped, or the turn dropped.
        self._on_end = on_end
        weakref.finalize(self, on_end)
        self._received: list[SampleChunk] = [first]
        self._queue: asyncio.Queue[SampleChunk | BaseException | None] = asyncio.Queue()
        self._queue.put_nowait(first)
        self._pump: asyncio.Task[None] | None = None
        self.sampled: Sampled | None = None
        self._started = False

    async def _read(self) -> None:
        try:
            async for chunk in self._chunks:
                self._queue.put_nowait(chunk)
                if chunk.finish_reason is not None:
                    break
            self._queue.put_nowait(None)
            await self._chunks.aclose()
        except Exception as error:  # handed to the reader, which fails the stream with it
            self._queue.put_nowait(error)
        finally:
            self._on_end()

    def _ids(self) -> list[int]:
        return [t for c in self._received for t in c.ids]

    async def deltas(self) -> AsyncIterator[Delta]:
        if self._started:
            raise RuntimeError("a live turn streams once")
        self._started = True
        self._pump = asyncio.create_task(self._read())
        self._received.clear()
        finished = False
        while not finished:
            batch = [await self._queue.get()]
            while not self._queue.empty():  # parse what arrived together once
                batch.append(self._queue.get_nowait())
            for item in batch:
                if isinstance(item, BaseException):
                    raise item
                if item is None or item.finish_reason is not None:
                    finished = True
                if item is not None:
                    self._received.append(item)
            ids = self._ids()
            decode = self._text.renderer.tokenizer.decode
            if self._stops.stops and not finished and self._stops.find(decode(ids)) is not None:
                finished = True  # a stop string is complete: the rest would be cut anyway
                await self._stop_engine()
            if not finished:
                for delta in self._text.feed(ids):
                    yield delta
        sampled = self._build(collected(self._received, self.model))
        rest, reply, divergence = self._text.finish(sampled.turn.reply)
        self.sampled = _with_reply(sampled, reply, divergence) if reply != sampled.turn.reply else sampled
        for delta in rest:
            yield delta

    async def _stop_engine(self) -> None:
        if self._pump is not None and not self._pump.done():
            self._pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pump
        await self._chunks.aclose()
        self._on_end()

    async def abort(self) -> Sampled:
        """Stop the engine's generation; the turn as sampled so far (or whole, if it had finished)."""
        await self._stop_engine()
        if self.sampled is not None:
            return self.sampled
        while not self._queue.empty():
            item = self._queue.get_nowait()
            if isinstance(item, SampleChunk):
                self._received.append(item)
        result = collected(self._received, self.model)
        return self._build(replace(result, finish_reason="length"))


def _unless_sent(whole: str, sent: str) -> str:
    """`whole` without the leading whitespace the client was not sent (held back while it led the text)."""
    return (
        whole.lstrip() if sent and not whole.startswith(sent) and whole.lstrip().startswith(sent) else whole
    )


def _with_reply(sampled: Sampled, reply: Message, divergence: str | None) -> Sampled:
    assert isinstance(sampled.record, SampledTurn)  # a live turn is sampled by an engine
    failures = (*sampled.record.parse_failures, divergence) if divergence else sampled.record.parse_failures
    record = replace(sampled.record, reply=reply.model_dump(mode="json"), parse_failures=failures)
    head = replace(sampled.head, reply=reply) if sampled.head is not None else None
    return replace(sampled, turn=replace(sampled.turn, reply=reply), record=record, head=head)
