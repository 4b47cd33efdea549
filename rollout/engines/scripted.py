"""The scripted engine: deterministic replies (text and tool calls) from a script, for tutorials and tests.

Contract: the script maps the decoded prompt to the assistant message to answer with; the engine turns that
message into completion ids exactly as the model's renderer would emit it (so parsing it back gives the same
message) and reports logprob 0 for every token: a scripted policy is deterministic. `think_s` makes every
reply take that long (a stand-in for a model's sampling time, in chaos tests and benchmarks); `stream` spreads
it evenly over the reply's tokens, one chunk per token, so a streaming client sees the first token long before
the last. `finished` counts the samples and streams that ran to their end and `cancelled` the streams closed
early (what tests observe of the engine's side). `load_script` finds a script by reference (`rollout engine
serve --kind scripted --script package.module:function`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable
from typing import TYPE_CHECKING, Literal, Protocol, cast

from rollout.contracts import Message, ToolSpec
from rollout.engines.protocol import CheckpointRef, SampleChunk, SampleRequest, SampleResult

if TYPE_CHECKING:
    from rollout.engines.vllm_server import Tokenizer

Script = Callable[[str], Message]


class ReplyRenderer(Protocol):
    """What the scripted engine needs of a chat template (the gateway's `ModelRenderer` is one)."""

    @property
    def tokenizer(self) -> Tokenizer: ...

    @property
    def stop_token_ids(self) -> tuple[int, ...]: ...

    def prompt_ids(self, messages: list[Message], tools: list[ToolSpec]) -> list[int]: ...

    def conversation_ids(self, messages: list[Message]) -> list[int]: ...


class ScriptedEngine:
    def __init__(
        self, renderer: ReplyRenderer, script: Script, *, served_name: str = "base", think_s: float = 0.0
    ) -> None:
        self.name = "scripted"
        self.think_s = think_s
        self.renderer = renderer
        self.script = script
        self.served_name = served_name
        self.loaded = {served_name}
        self.sleeping = False
        self.calls = 0
        self.finished = 0
        self.cancelled = 0
        self.model_path = "scripted"

    @property
    def tokenizer(self) -> Tokenizer:
        return self.renderer.tokenizer

    @property
    def models(self) -> list[str]:
        return sorted(self.loaded)

    async def unload(self, name: str) -> None:
        self.loaded.discard(name)

    def completion_ids(self, reply: Message) -> list[int]:
        """The ids a model would sample to say `reply`: its rendering after a generation prompt, to the
        stop."""
        probe = [Message.user("·")]
        prompt = self.renderer.prompt_ids(probe, [])
        full = self.renderer.conversation_ids([*probe, reply])
        completion = full[len(prompt) :]
        stops = set(self.renderer.stop_token_ids)
        for index, token in enumerate(completion):
            if token in stops:
                return completion[: index + 1]
        return completion

    def _reply_ids(self, request: SampleRequest) -> list[int]:
        reply = self.script(self.renderer.tokenizer.decode(list(request.prompt_ids)))
        return self.completion_ids(reply)[: request.max_tokens]

    def _finish(self, ids: list[int]) -> Literal["stop", "length"]:
        return "stop" if ids and ids[-1] in self.renderer.stop_token_ids else "length"

    async def sample(self, request: SampleRequest) -> SampleResult:
        self.calls += 1
        if self.think_s:
            await asyncio.sleep(self.think_s)
        ids = self._reply_ids(request)
        self.finished += 1
        return SampleResult(
            completion_ids=tuple(ids),
            logprobs=tuple(0.0 for _ in ids),
            finish_reason=self._finish(ids),
            model=request.model,
        )

    async def stream(self, request: SampleRequest) -> AsyncGenerator[SampleChunk]:
        self.calls += 1
        ids = self._reply_ids(request)
        pause = self.think_s / max(1, len(ids))
        done = False
        try:
            for index, token in enumerate(ids):
                if pause:
                    await asyncio.sleep(pause)
                last = index == len(ids) - 1
                if last:
                    done = True
                    self.finished += 1
                yield SampleChunk(
                    ids=(token,),
                    logprobs=(0.0,),
                    finish_reason=self._finish(ids) if last else None,
                    model=request.model if last else None,
                )
            if not ids:
                done = True
                self.finished += 1
                yield SampleChunk(ids=(), logprobs=(), finish_reason="length", model=request.model)
        finally:
            if not done:
                self.cancelled += 1

    async def load(self, checkpoint: CheckpointRef) -> None:
        self.loaded.add(checkpoint.name)

    async def sleep(self) -> None:
        self.sleeping = True

    async def wake(self) -> None:
        self.sleeping = False

    async def health(self) -> bool:
        return True


def load_script(reference: str) -> Script:
    """The function at `package.module:function` (prompt text -> reply); ValueError naming what is wrong."""
    from rollout.references import import_reference

    script = import_reference(reference, "script reference")  # a ReferenceLoadError is a ValueError
    if not callable(script):
        raise ValueError(f"script {reference!r} is not a function (prompt text -> Message)")
    return cast(Script, script)
