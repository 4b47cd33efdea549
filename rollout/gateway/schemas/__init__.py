"""What the gateway accepts, per dialect, as pydantic models: the one source of both the request validation
and the OpenAPI document (`rollout.gateway.openapi`), so the two cannot drift.

Contract:
- Each dialect module holds the request model(s) of its published schema: the fields the gateway honours,
  typed and bounded as the provider documents them, and the structure of messages, content parts and tools.
  Fields the gateway does not use are accepted unchecked (real clients send many), as the providers' APIs
  accept them.
- `validation.check(model, body, max_context=...)` raises `BadRequest` for the first violation, naming the
  field as the client wrote it (`messages[2].content`, `input[0].content[1].type`).
"""
