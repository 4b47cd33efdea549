"""How a Task reaches its sandbox: `run.sandbox` (a `SandboxSeat`) and a `SandboxClient` over HTTP.

Contract:
- A `SandboxSeat` is everything a Task needs: the server's address, the claim's epoch, holder and secret, and
  the agent's seat. The runner makes it for the Task (the secret is derived there, never sent through
  Temporal); it is the same on every retry of the claim's episode. The client proves the claim with its
  secret.
- `SandboxClient.act(action)` sends one action under the seat's epoch. When the claim was superseded (the
  episode lost its sandbox, e.g. after its claim expired) the server refuses and `act` raises
  `SandboxSuperseded`; an action the world rejects raises `SandboxActionError` with the world's message; a
  world lost for this claim (its server died) raises `SandboxLost`: the episode cannot go on in it.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any, Self

import httpx

from rollout.harness import SandboxSeat
from rollout.sandbox.world import JsonObject

# The author API: what an environment's author imports (kept stable across releases).
__all__ = [
    "SandboxActionError",
    "SandboxClient",
    "SandboxLost",
    "SandboxRefused",
    "SandboxSeat",
    "SandboxSuperseded",
]


class SandboxSuperseded(RuntimeError):
    """The claim this seat was granted under is no longer the sandbox's current one."""


class SandboxRefused(PermissionError):
    """The server refused the request: the seat's secret is not its claim's (or none was sent)."""


class SandboxActionError(ValueError):
    """The world rejected the action."""


class SandboxLost(RuntimeError):
    """The sandbox's world is gone for this claim (its server died): nothing more can be done in it."""


class SandboxClient:
    def __init__(
        self, seat: SandboxSeat, *, timeout_s: float = 180, transport: httpx.AsyncBaseTransport | None = None
    ) -> None:
        self.seat = seat
        headers = {"authorization": f"Bearer {seat.secret}"} if seat.secret else {}
        self._http = httpx.AsyncClient(
            base_url=seat.address, timeout=timeout_s, transport=transport, headers=headers
        )

    async def open(
        self, *, limits: dict[str, int] | None = None, network: list[str] | None = None
    ) -> JsonObject:
        """Start the claim on the server (resets the world for a new epoch); idempotent for the same epoch.
        `limits` and `network` (an environment's `SandboxSpec`, as JSON) configure a kind that runs agents'
        commands for this claim; the server refuses (`SandboxActionError`) what it will not give."""
        body: dict[str, Any] = {"epoch": self.seat.epoch, "holder": self.seat.holder}
        if limits is not None:
            body["limits"] = limits
        if network:
            body["network"] = network
        return await self._post("/open", body)

    async def act(self, action: JsonObject) -> JsonObject:
        body = {
            "epoch": self.seat.epoch,
            "holder": self.seat.holder,
            "seat": self.seat.seat,
            "action": action,
        }
        if self.seat.gateway_url:
            body["gateway"] = self.seat.gateway_url  # for a claim whose network names `gateway`
        return await self._post("/act", body)

    async def _post(self, path: str, body: dict[str, Any]) -> JsonObject:
        response = await self._http.post(path, json=body)
        if response.status_code == 409:
            raise SandboxSuperseded(response.json().get("error", response.text))
        if response.status_code in (401, 403):
            raise SandboxRefused(response.json().get("error", response.text))
        if response.status_code == 400:
            raise SandboxActionError(response.json().get("error", response.text))
        if response.status_code == 503:
            raise SandboxLost(response.json().get("error", response.text))
        response.raise_for_status()
        return response.json()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        await self.aclose()
