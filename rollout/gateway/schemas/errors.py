"""The error bodies each dialect answers with, as their providers publish them: the gateway builds its errors
from these models, and the OpenAPI document describes them with the same models.

Contract: OpenAI's routes (Chat, Responses) answer `{"error": {"message", "type", "param", "code"}}`, where
`param` names the offending field of a 400; Anthropic's routes answer `{"type": "error", "error": {"type",
"message"}}`, where the message names it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel


class OpenAIErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class OpenAIError(BaseModel):
    error: OpenAIErrorDetail


class AnthropicErrorDetail(BaseModel):
    type: str
    message: str


class AnthropicError(BaseModel):
    type: Literal["error"] = "error"
    error: AnthropicErrorDetail
