"""The gateway as a service: everything `rollout gateway` wires together, from a model and engine URLs.

Contract:
- `parse_externals` reads `POLICY=MODEL[@API_BASE]` specs into the LiteLLM models seats of POLICY use; a
  malformed spec raises `ValueError` saying how to write it.
- `serve_gateway` connects to the ledger, routes to the configured engines (serving `model`, whose turns
  `renderer` renders) and to every engine whose ack `ack_key` signed (at its acked URL), sending each the
  engine API key `engine_api_key`; a seat whose policy is on another base model a signed engine serves is
  rendered by `renderers(MODEL)`, built once per model. It serves the three
  dialects and the operator routes on host:port until cancelled, refusing request bodies over
  `max_request_bytes`, on a loopback host any request whose Host is not loopback's (rollout.gateway.app), and
  giving a turn that names no token budget `default_max_tokens` (unless its run sets one) and a seat's turns
  past `max_turns_in_flight_per_seat` a 429; the operator routes need the operator key. A run's external
  models may name only the API bases of `externals` and `external_api_bases`. Asked to stop (SIGTERM,
  SIGINT), it answers the turns held at admission at once (503: rollout.gateway.admission), gives those
  sampling up to `SHUTDOWN_GRACE_S`, and closes the ledger connection.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from types import FrameType

from rollout.config import RoutingSettings
from rollout.engines.external import ExternalModel
from rollout.engines.vllm_client import VLLMEngine
from rollout.gateway.admission import Admission, EngineSlot
from rollout.gateway.app import MAX_REQUEST_BYTES, build_app
from rollout.gateway.operator import Operator, RunControl
from rollout.gateway.routing import Routes
from rollout.gateway.seatstate import MAX_TURNS_IN_FLIGHT_PER_SEAT
from rollout.gateway.service import DEFAULT_MAX_TOKENS, Gateway
from rollout.ledger import Ledger
from rollout.net import SHUTDOWN_GRACE_S
from rollout.rendering import ModelRenderer


def parse_externals(specs: Sequence[str]) -> dict[str, ExternalModel]:
    externals: dict[str, ExternalModel] = {}
    for spec in specs:
        policy, _, target = spec.partition("=")
        if not policy or not target.partition("@")[0]:
            raise ValueError(
                f"--external {spec!r}: write POLICY=MODEL or POLICY=MODEL@API_BASE "
                "(e.g. judge=anthropic/claude-sonnet-4-5)"
            )
        externals[policy] = ExternalModel.from_spec(target)
    return externals


async def serve_gateway(
    *,
    ledger_url: str,
    renderer: ModelRenderer,
    model: str = "",
    renderers: Callable[[str], ModelRenderer] | None = None,
    engine_urls: Sequence[str],
    host: str,
    port: int,
    max_context: int,
    externals: dict[str, ExternalModel],
    operator_key: str,
    external_api_bases: Sequence[str] = (),
    ack_key: bytes | None = None,
    engine_api_key: str,
    seat_secret: bytes,
    runs: RunControl | None = None,
    max_request_bytes: int = MAX_REQUEST_BYTES,
    default_max_tokens: int = DEFAULT_MAX_TOKENS,
    max_turns_in_flight_per_seat: int = MAX_TURNS_IN_FLIGHT_PER_SEAT,
    routing: RoutingSettings | None = None,
) -> None:
    import uvicorn

    ledger = await Ledger.connect(ledger_url)
    slots = [
        EngineSlot(VLLMEngine(url, api_key=engine_api_key, name=f"engine{i}"))
        for i, url in enumerate(engine_urls)
    ]
    # Engines whose signed acks say what they serve are routed to at their acked URL, configured or not.
    routes = Routes(
        ledger,
        slots,
        connect=lambda url, name: VLLMEngine(url, api_key=engine_api_key, name=name),
        ack_key=ack_key,
        model=model,
    )
    admission = Admission(ledger, routes, routing=routing)
    core = Gateway(
        ledger,
        renderer,
        admission,
        model=model,
        renderers=renderers,
        max_context=max_context,
        default_max_tokens=default_max_tokens,
        max_turns_in_flight_per_seat=max_turns_in_flight_per_seat,
        externals=externals,
        external_api_bases=external_api_bases,
    )
    operator = Operator(key=operator_key, seat_secret=seat_secret, runs=runs)
    app = build_app(
        core, model_names=["base"], max_request_bytes=max_request_bytes, operator=operator, host=host
    )
    # No access log: a seat's base URL holds its token.
    # What start-up made (the tokenizer, the libraries) lives as long as the gateway: out of the collector's
    # sight, a full collection walks only what turns make, not hundreds of milliseconds of heap with every
    # other seat's turn stalled meanwhile.
    gc.freeze()
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=SHUTDOWN_GRACE_S,  # a turn sampling when it stops gets this long
    )

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            admission.close()  # turns held at admission are answered now, not when they time out
            super().handle_exit(sig, frame)

    try:
        await Server(config).serve()
    finally:
        await ledger.close()
