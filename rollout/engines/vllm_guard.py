"""What vLLM's own API key leaves open, closed: the ASGI middleware `vllm serve` loads by `--middleware`.

Contract:
- vLLM checks its key (`VLLM_API_KEY`) on `/v1` and a few other prefixes only: `/sleep`, `/wake_up`, `/pause`,
  `/collective_rpc` and the rest answer anyone who reaches the port, a web page's plain cross-site POST
  included. `EngineKeyGuard`, which the launcher (rollout.engines.vllm_launcher) names with
  `--middleware rollout.engines.vllm_guard.EngineKeyGuard`, refuses every path but `/health` without that key
  as `Authorization: Bearer <key>`: 401, `WWW-Authenticate: Bearer`, in vLLM's error shape. A page cannot send
  the header cross-site without the key, and a process without the data directory does not have it.
- It reads the key from vLLM's environment when vLLM builds its app, and refuses to be built without one
  (`ValueError`): a guard with no key would leave everything open.
"""

from __future__ import annotations

import os

from starlette.responses import JSONResponse
from starlette.types import ASGIApp

from rollout.security.http_guard import BearerKey

KEY_VARIABLE = "VLLM_API_KEY"
MIDDLEWARE = f"{__name__}.EngineKeyGuard"


def _refused(path: str, status: int, message: str) -> JSONResponse:
    # Exactly vLLM's own refusal, so a client sees one shape whichever check refused it.
    return JSONResponse({"error": "Unauthorized"}, status_code=status)


class EngineKeyGuard(BearerKey):
    def __init__(self, app: ASGIApp) -> None:
        super().__init__(
            app, key=os.environ.get(KEY_VARIABLE, ""), error=_refused, named="the engine API key"
        )
