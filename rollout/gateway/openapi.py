"""The OpenAPI 3.1 document of what the gateway accepts, served at `GET /openapi.json`.

Contract:
- `ROUTES` lists every dialect route (each a POST, also under `/s/{token}`): the request model that validates
  its body and the error model its failures answer with. `document(max_context=...)` describes each with those
  same models (`rollout.gateway.schemas`), so the document and the validation cannot drift; every token budget
  (`x-token-budget`) gets `maximum: max_context`.
- Every dialect route lists its error statuses: 400 (a field the schema refuses, a prompt over the context),
  401, 410, 413 (a body over the byte limit), 415 (a body not declared `application/json`), 429 (a seat's
  turns in flight at their limit) and 503, each in
  its dialect's shape. The GET routes (`/v1/models`, `/health`, this document) are listed too.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import version
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from rollout.gateway.schemas.anthropic_messages import CountTokensRequest, MessagesRequest
from rollout.gateway.schemas.errors import AnthropicError, OpenAIError
from rollout.gateway.schemas.openai_chat import ChatCompletionRequest
from rollout.gateway.schemas.openai_responses import ResponsesRequest
from rollout.gateway.schemas.validation import TOKEN_BUDGET

SEAT_PREFIX = "/s/{token}"
ERRORS = {
    "400": "a field the schema refuses (named), or a prompt over the model's context",
    "401": "no seat token, or an unknown one",
    "410": "the seat is finished",
    "413": "the body is over the gateway's byte limit",
    "415": "the body is not declared `application/json`",
    "429": "the seat has as many turns in flight as it may (see Retry-After)",
    "503": "no engine may take the turn now (see Retry-After)",
}


_TOKEN = {"name": "token", "in": "path", "required": True, "schema": {"type": "string"}}


@dataclass(frozen=True)
class Route:
    path: str  # under /v1, and under /s/{token}/v1
    summary: str
    request: type[BaseModel]
    error: type[BaseModel]


ROUTES = (
    Route("/v1/chat/completions", "OpenAI Chat Completions", ChatCompletionRequest, OpenAIError),
    Route("/v1/responses", "OpenAI Responses", ResponsesRequest, OpenAIError),
    Route("/v1/messages", "Anthropic Messages", MessagesRequest, AnthropicError),
    Route("/v1/messages/count_tokens", "Anthropic token count", CountTokensRequest, AnthropicError),
)


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def _bound_budgets(schema: Any, max_context: int) -> None:
    """Give every token budget its maximum: the model's context."""
    if isinstance(schema, dict):
        if schema.pop(TOKEN_BUDGET, False):
            schema["maximum"] = max_context
        for value in schema.values():
            _bound_budgets(value, max_context)
    elif isinstance(schema, list):
        for value in schema:
            _bound_budgets(value, max_context)


def _operation(route: Route, seat_in_path: bool) -> dict[str, Any]:
    errors = {
        status: {"description": text, "content": {"application/json": {"schema": _ref(route.error)}}}
        for status, text in ERRORS.items()
    }
    operation: dict[str, Any] = {
        "summary": route.summary,
        "requestBody": {"required": True, "content": {"application/json": {"schema": _ref(route.request)}}},
        "responses": {
            "200": {
                "description": "the turn (JSON), or its events (text/event-stream) when `stream` is true",
                "content": {"application/json": {"schema": {"type": "object"}}, "text/event-stream": {}},
            },
            **errors,
        },
    }
    if seat_in_path:
        operation["parameters"] = [_TOKEN]
        operation["security"] = []
    return operation


def document(*, max_context: int) -> dict[str, Any]:
    models = [model for route in ROUTES for model in (route.request, route.error)]
    _, schemas = models_json_schema(
        [(model, "validation") for model in dict.fromkeys(models)],
        ref_template="#/components/schemas/{model}",
    )
    paths: dict[str, Any] = {}
    for route in ROUTES:
        paths[route.path] = {"post": _operation(route, seat_in_path=False)}
        paths[SEAT_PREFIX + route.path] = {"post": _operation(route, seat_in_path=True)}
    for path, summary in (
        ("/v1/models", "the served models (in Anthropic's shape when `anthropic-version` is sent)"),
        (SEAT_PREFIX + "/v1/models", "the served models, as /v1/models"),
        ("/health", "whether the gateway is up"),
        ("/openapi.json", "this document"),
    ):
        ok = {"description": summary, "content": {"application/json": {"schema": {"type": "object"}}}}
        paths[path] = {"get": {"summary": summary, "security": [], "responses": {"200": ok}}}
        if path.startswith(SEAT_PREFIX):
            paths[path]["get"]["parameters"] = [_TOKEN]
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {
            "title": "rollout gateway",
            "version": version("rollout"),
            "description": "OpenAI Chat, OpenAI Responses and Anthropic Messages, each recorded turn by turn. "
            "A seat's token is its base URL (/s/TOKEN/v1) or its API key.",
        },
        "paths": paths,
        "components": {
            "schemas": schemas.get("$defs", {}),
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"},
            },
        },
        "security": [{"bearer": []}, {"apiKey": []}],
    }
    _bound_budgets(doc, max_context)
    return doc
