"""The scripted engine: deterministic replies (text and tool calls) from a script, for tutorials and tests.

Contract: the script maps the decoded prompt to the assistant message to answer with; the engine turns that
message into completion ids exactly as the model's renderer would emit it (so parsing it back gives the same
message) and reports logprob 0 for every token: a scripted policy is deterministic.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from rollout.contracts import Message
from rollout.engines.protocol import CheckpointRef, SampleRequest, SampleResult

if TYPE_CHECKING:
    from rollout.gateway.rendering import ModelRenderer

Script = Callable[[str], Message]


class ScriptedEngine:
    def __init__(self, renderer: ModelRenderer, script: Script, *, served_name: str = "base") -> None:
        self.name = "scripted"
        self.renderer = renderer
        self.script = script
        self.served_name = served_name
        self.loaded = {served_name}
        self.sleeping = False
        self.calls = 0

    def completion_ids(self, reply: Message) -> list[int]:
        """The ids a model would sample to say `reply`: its rendering after a generation prompt, to the stop."""
        probe = [Message.user("·")]
        prompt = self.renderer.prompt_ids(probe, [])
        full = self.renderer.renderer.render_ids(
            [*(self.renderer.renderer_message(m) for m in probe), self.renderer.renderer_message(reply)]
        )
        completion = full[len(prompt) :]
        stops = set(self.renderer.stop_token_ids)
        for index, token in enumerate(completion):
            if token in stops:
                return completion[: index + 1]
        return completion

    async def sample(self, request: SampleRequest) -> SampleResult:
        self.calls += 1
        reply = self.script(self.renderer.tokenizer.decode(list(request.prompt_ids)))
        ids = self.completion_ids(reply)[: request.max_tokens]
        finish = "stop" if ids and ids[-1] in self.renderer.stop_token_ids else "length"
        return SampleResult(tuple(ids), tuple(0.0 for _ in ids), finish, request.model)

    async def load(self, checkpoint: CheckpointRef) -> None:
        self.loaded.add(checkpoint.name)

    async def sleep(self) -> None:
        self.sleeping = True

    async def wake(self) -> None:
        self.sleeping = False

    async def health(self) -> bool:
        return True
