"""The keys of serving: the engine key that signs acks, the serving key that signs targets, and the engine API
key every engine route asks for, each derived one way from the engine key.

Contract:
- Any writer of the ledger can append a target, so engines load only signed ones: the trainer signs each
  (`ServingTarget.signed`) with `load_serving_key` (a key derived one way from the engine key, or a
  `serving.key` a cluster mounts), and a follower that holds the engine key loads a target only when
  `signed_by` that derived key holds: a forged target names no adapter, version or files an engine takes.
- Any writer of the ledger can append an ack, so an ack names where prompts go only when it is signed: an
  engine's follower signs each ack (`ServingAck.signed`) with the key of `load_engine_key`, and the gateway
  folds in (and routes by) an ack only when `signed_by` that key holds (rollout.gateway.routing): a newer
  unsigned ack for an engine's URL never hides its signed state.
- Every engine route but `/health` needs the engine API key (`Authorization: Bearer re-…`), which
  `engine_api_key` derives one way from that same key (HMAC-SHA256 under a fixed label): whoever holds
  `engine.key` (the gateway, an engine, its follower) holds the API key with nothing more to provision, and
  the API key, which travels on every request to an engine, does not give away the key acks are signed with.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from pathlib import Path

from rollout.security.keyfiles import secret_file

ENGINE_KEY_FILE = "engine.key"
ENGINE_API_KEY_PREFIX = "re-"  # + 64 hex digits; rollout.security.redaction blanks it out wherever it appears
_ENGINE_API_KEY_LABEL = b"rollout engine API key, v1"


def load_engine_key(data_dir: Path) -> bytes:
    """The key engines sign their acks with and the gateway checks them by (`engine.key` in the data
    directory, made once, mode 600; a cluster mounts one Secret into each)."""
    return secret_file(data_dir / ENGINE_KEY_FILE, lambda: secrets.token_hex(32).encode()).strip()


def engine_api_key(engine_key: bytes) -> str:
    """The bearer key of every engine route (`re-` + 64 hex digits), derived one way from `engine_key`
    (`load_engine_key`): vLLM gets it as `VLLM_API_KEY`, our engine server checks it, and every client of an
    engine sends it; knowing it does not give away `engine_key`, which signs the acks."""
    return ENGINE_API_KEY_PREFIX + hmac.new(engine_key, _ENGINE_API_KEY_LABEL, hashlib.sha256).hexdigest()


def load_engine_api_key(data_dir: Path) -> str:
    """`engine_api_key` of the data directory's `engine.key` (made once, like `load_engine_key`)."""
    return engine_api_key(load_engine_key(data_dir))


def known_engine_api_key(data_dir: Path) -> str | None:
    """`load_engine_api_key` for a probe, which makes nothing: None when there is no `engine.key` (then no
    engine of this data directory has started) or it cannot be read."""
    try:
        engine_key = (data_dir / ENGINE_KEY_FILE).read_bytes().strip()
    except OSError:
        return None
    return engine_api_key(engine_key) if engine_key else None


SERVING_KEY_FILE = "serving.key"
_SERVING_KEY_LABEL = b"rollout serving targets, v1:"


def serving_target_key(engine_key: bytes) -> bytes:
    """The key serving targets are signed with, derived one way from `engine_key`: the SHA-256 of a fixed
    label and the key, in hex (a chart derives the same with Helm's `sha256sum`), so whoever publishes targets
    (the trainer) needs no key that would let it sign an engine's acks."""
    return hashlib.sha256(_SERVING_KEY_LABEL + engine_key).hexdigest().encode()


def load_serving_key(data_dir: Path) -> bytes:
    """The key a publisher signs serving targets with: `serving.key` in the data directory where a cluster
    mounts one (the trainer's pod holds no engine key), else `serving_target_key` of `engine.key`."""
    try:
        mounted = (data_dir / SERVING_KEY_FILE).read_bytes().strip()
    except FileNotFoundError:
        mounted = b""
    return mounted or serving_target_key(load_engine_key(data_dir))
