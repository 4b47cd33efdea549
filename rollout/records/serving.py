"""The serving records in the ledger: what the trainer asks engines to serve (`ServingTarget`, on
`serving/targets`), what each engine serves (`ServingAck`, on `serving/acks`) and what a holder needs served
beyond the newest checkpoints (`ServingRequest`, on `serving/requests`). Pure data; rollout.serving is what
they mean (signing keys, folding the streams) and holds the contract.

Contract: a target or an ack is believed only when signed (`SignedPayload`: the HMAC-SHA256 of its other
fields, sorted JSON, under a key its readers hold); a target whose checkpoint name, file names, format or
location could lead outside an engine's folders is refused where it is read.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass, field, replace
from typing import Any, Self, cast

from rollout.records import Payload
from rollout.records.checkpoints import CheckpointFile, checked_checkpoint_name, checked_file_names

BASE_CHECKPOINT = "base"  # the name an engine serves its base model under


class SignedPayload(Payload):
    """A record any ledger writer could append, believed only when signed: `signature` is the HMAC-SHA256 of
    its other fields (sorted JSON) under a key its readers hold."""

    signature: str

    def _signed_bytes(self) -> bytes:
        fields = {k: v for k, v in self.to_payload().items() if k != "signature"}
        return json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()

    def signed(self, key: bytes) -> Self:
        digest = hmac.new(key, self._signed_bytes(), hashlib.sha256).hexdigest()
        return replace(cast("Any", self), signature=digest)

    def signed_by(self, key: bytes) -> bool:
        expected = hmac.new(key, self._signed_bytes(), hashlib.sha256).hexdigest()
        return hmac.compare_digest(self.signature, expected)


FORMATS = ("lora", "full", "tinker")


@dataclass(frozen=True)
class ServingTarget(SignedPayload):
    policy: str
    checkpoint: str
    version: int
    run: str
    format: str
    files: dict[str, CheckpointFile] = field(default_factory=dict[str, CheckpointFile])
    location: str | None = None  # where the format is not files (a Tinker sampler path)
    # The base model its files apply to (a model spec: smollm2, tiny-qwen3, …): only engines serving that
    # model load it. "" for any engine (a run whose policies all share the stack's one model).
    model: str = ""
    signature: str = ""  # HMAC-SHA256 of the rest, under `load_serving_key` (`signed`): engines verify it

    OMITTED_AT_DEFAULT = ("signature",)

    def __post_init__(self) -> None:
        # Read from the ledger, then joined to an engine's cache folder: checked before any is used as a path.
        checked_checkpoint_name(self.checkpoint)
        checked_file_names(self.files)
        if self.format not in FORMATS:
            raise ValueError(f"a serving target's format {self.format!r} is not one of {', '.join(FORMATS)}")
        # An engine hands `location` to its loader as it is (vLLM would fetch a Hub repository it names): only
        # Tinker's own sampler paths, and only for the format that has no files.
        if self.location is not None and (
            self.format != "tinker" or not self.location.startswith("tinker://")
        ):
            raise ValueError(
                f"a serving target's location {self.location!r} does not fit its format {self.format!r}: only a "
                "tinker target has one, a tinker:// sampler path"
            )

    @property
    def key(self) -> str:
        return f"{self.policy}/{self.version}/{self.format}"


@dataclass(frozen=True)
class Served:
    """A checkpoint an engine serves: requests name it by `checkpoint`."""

    policy: str
    checkpoint: str
    version: int


@dataclass(frozen=True)
class ServingAck(SignedPayload):
    engine: str
    url: str
    incarnation: str
    n: int  # the ack's number within the incarnation
    base: str = BASE_CHECKPOINT  # the name the engine serves its base model under
    model: str = ""  # the base model it serves (a model spec); "" where its acks said none (the stack's own)
    serving: tuple[Served, ...] = ()
    sleeping: bool = False
    gpu: str | None = None  # the GPU lease this engine gives way to (one-GPU mode)
    failed: dict[str, str] | None = None  # {"checkpoint", "error"} of the last load that failed
    # The checkpoints it holds beyond each policy's newest (requested, or released and kept within budget).
    opponents: tuple[str, ...] = ()
    opponent_budget: int = 0  # how many it keeps loaded once released (services.engine.opponent_adapters)
    signature: str = ""  # HMAC-SHA256 of the rest, under the engines' and gateway's key (`signed`)

    @property
    def key(self) -> str:
        return f"{self.engine}/{self.incarnation}/{self.n}"

    def serves(self, checkpoint: str) -> bool:
        return any(s.checkpoint == checkpoint for s in self.serving)


@dataclass(frozen=True)
class ServingRequest(Payload):
    """`holder` (an eval's workflow id) needs `checkpoint` served until it releases it."""

    holder: str
    checkpoint: str

    @property
    def requested_key(self) -> str:
        return f"{self.holder}/{self.checkpoint}/requested"

    @property
    def released_key(self) -> str:
        return f"{self.holder}/{self.checkpoint}/released"
