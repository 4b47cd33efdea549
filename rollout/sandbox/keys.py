"""Who may open and act in a sandbox: the holder of a claim, proven by the claim's secret.

Contract:
- The sandbox key (`SANDBOX_KEY_FILE` in the data directory, mode 600, made once; a cluster mounts one Secret
  into its runners and sandbox hosts) is shared by the runners that claim sandboxes and the servers that host
  them, and by nothing else: not the gateway, not an agent's jail.
- `claim_secret(key, kind, name, epoch, holder)` is the secret of one claim: an HMAC of the claim's identity,
  so the runner derives it again on any retry and the server checks it without asking the ledger. It is never
  stored: not in the ledger, not in Temporal's history (activities derive it), not in a log (`scrub` blanks
  the `rsc-` form).
- `lease_secret(key, resource, holder)` is the ledger secret of an episode's claim lease
  (rollout.ledger.store): derived, like the claim's secret, so the runner that retries the episode takes the
  sandbox again while the claim is live, and a writer that only knows the holder's name does not.
- `grant_signature(key, kind, name, address, epoch, holder)` signs a claimed sandbox as it crosses Temporal
  (rollout.workflows.episode_types.SandboxGrant): the runner that claimed it signs it, and a runner acts on a
  grant (plays in it, renews or releases its claim) only when the signature holds and the grant is its
  episode's, so a workflow started by someone else names no address the claim's secret is sent to.
- A secret of one epoch opens nothing under another: a zombie holder of an older claim, or a neighbour process
  that learned an epoch, cannot act.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from pathlib import Path

from rollout.keyfiles import secret_file

SANDBOX_KEY_FILE = "sandbox.key"
PREFIX = "rsc-"


class SandboxKeyMissing(RuntimeError):
    """A sandbox host that must share its key with runners found none to share."""


def load_sandbox_key(data_dir: Path, *, create: bool = True) -> bytes:
    """The sandbox key of this data directory, made once (mode 600) unless `create` is False."""
    path = data_dir / SANDBOX_KEY_FILE
    if not create and not path.is_file():
        raise SandboxKeyMissing(
            f"no sandbox key at {path}: a sandbox served beyond this machine must use the key its runners use. "
            f"Copy the runners' {SANDBOX_KEY_FILE} there (mode 600), or serve on 127.0.0.1 beside them."
        )
    return secret_file(path, lambda: secrets.token_bytes(32))


def claim_secret(key: bytes, kind: str, name: str, epoch: int, holder: str) -> str:
    identity = "\n".join((kind, name, str(epoch), holder)).encode()
    return PREFIX + hmac.new(key, identity, hashlib.sha256).hexdigest()[:40]


def same_secret(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode(), expected.encode())


def lease_secret(key: bytes, resource: str, holder: str) -> str:
    identity = "\n".join(("lease", resource, holder)).encode()
    return hmac.new(key, identity, hashlib.sha256).hexdigest()


def grant_signature(key: bytes, kind: str, name: str, address: str, epoch: int, holder: str) -> str:
    """What a runner signs a claimed sandbox with before it crosses Temporal, and checks before it acts on
    one: anyone who reaches Temporal can start a workflow naming any address, and the runner would send the
    claim's secret there."""
    identity = "\n".join(("grant", kind, name, address, str(epoch), holder)).encode()
    return hmac.new(key, identity, hashlib.sha256).hexdigest()
