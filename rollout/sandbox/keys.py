"""Who may open and act in a sandbox: the holder of a claim, proven by the claim's secret.

Contract:
- The sandbox key (`SANDBOX_KEY_FILE` in the data directory, mode 600, made once; a cluster mounts one Secret
  into its runners and sandbox hosts) is shared by the runners that claim sandboxes and the servers that host
  them, and by nothing else: not the gateway, not an agent's jail.
- Each kind of sandbox has a key of its own, derived one way from the sandbox key (`kind_key`): a host holds
  its kind's (`load_host_key`: a mounted `kind_key_file`, or derived from the data directory's sandbox key),
  so a host of one kind (a `shell` host the policy took over) can neither act in another kind's sandboxes nor
  join another kind's pool (a `command` pool, whose hosts receive seat tokens): a host proves its place in
  the pool with `host_proof`, which runners check (rollout.sandbox.claims).
- `claim_secret(key, kind, name, epoch, holder)` is the secret of one claim: an HMAC of the claim's identity
  under its kind's key (`kind_claim_secret`, as a host computes it), so the runner derives it again on any
  retry and the server checks it without asking the ledger. It is never
  stored: not in the ledger, not in Temporal's history (activities derive it), not in a log (`scrub` blanks
  the `rsc-` form).
- `lease_secret(key, resource, holder)` is the ledger secret of an episode's claim lease
  (rollout.ledger.store): derived, like the claim's secret, so the runner that retries the episode takes the
  sandbox again while the claim is live, and a writer that only knows the holder's name does not.
- `grant_signature(key, kind, name, address, epoch, holder, workflow_id)` signs a claimed sandbox as it
  crosses Temporal (rollout.workflows.episode_types.SandboxGrant): the runner that claimed it signs it, with
  the claiming workflow's id, and a runner acts on a grant (plays in it, from that workflow or its agents';
  renews or releases its claim, from that workflow) only when the signature holds and the grant is its
  episode's, so a workflow started by someone else names no address the claim's secret is sent to, and ends
  no claim of another.
- A secret of one epoch opens nothing under another: a zombie holder of an older claim, or a neighbour process
  that learned an epoch, cannot act.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from pathlib import Path

from rollout.security.keyfiles import secret_file

SANDBOX_KEY_FILE = "sandbox.key"
PREFIX = "rsc-"
_KIND_KEY_LABEL = b"rollout sandbox kind, v1:"


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


def kind_key(key: bytes, kind: str) -> bytes:
    """The key of one sandbox kind, derived one way from the sandbox key: the SHA-256 of a fixed label, the
    kind and the key, in hex (a chart derives the same with Helm's `sha256sum`)."""
    return hashlib.sha256(_KIND_KEY_LABEL + kind.encode() + b":" + key).hexdigest().encode()


def kind_key_file(kind: str) -> str:
    """Where a host of `kind` finds its kind's key when it is given that alone (a chart's command hosts)."""
    return f"sandbox-{re.sub(r'[^a-z0-9-]', '-', kind.lower())}.key"


def load_host_key(data_dir: Path, kind: str, *, create: bool = True) -> bytes:
    """A sandbox host's key: its kind's own key file where one is mounted (then it holds no other kind's key,
    nor the runners' sandbox key), else `kind_key` of the data directory's sandbox key."""
    path = data_dir / kind_key_file(kind)
    if path.is_file():
        return path.read_bytes().strip()
    return kind_key(load_sandbox_key(data_dir, create=create), kind)


def claim_secret(key: bytes, kind: str, name: str, epoch: int, holder: str) -> str:
    """A claim's secret, from the sandbox key (a runner's) through its kind's key."""
    return kind_claim_secret(kind_key(key, kind), kind, name, epoch, holder)


def kind_claim_secret(kind_secret: bytes, kind: str, name: str, epoch: int, holder: str) -> str:
    """A claim's secret from its kind's key (a host's: `load_host_key`)."""
    identity = "\n".join((kind, name, str(epoch), holder)).encode()
    return PREFIX + hmac.new(kind_secret, identity, hashlib.sha256).hexdigest()[:40]


def host_proof(kind_secret: bytes, kind: str, name: str, seats: int, address: str) -> str:
    """What a host of `kind` proves its place in the pool with (in its host lease): only a holder of the
    kind's key can make it, and runners, holding the sandbox key, check it."""
    identity = "\n".join(("host", kind, name, str(seats), address)).encode()
    return hmac.new(kind_secret, identity, hashlib.sha256).hexdigest()[:32]


def same_secret(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode(), expected.encode())


def lease_secret(key: bytes, resource: str, holder: str) -> str:
    identity = "\n".join(("lease", resource, holder)).encode()
    return hmac.new(key, identity, hashlib.sha256).hexdigest()


def grant_signature(
    key: bytes, kind: str, name: str, address: str, epoch: int, holder: str, workflow_id: str = ""
) -> str:
    """What a runner signs a claimed sandbox with before it crosses Temporal, and checks before it acts on
    one: anyone who reaches Temporal can start a workflow naming any address, and the runner would send the
    claim's secret there. `workflow_id`: the claiming workflow's, which alone may renew or release it."""
    identity = "\n".join(("grant", kind, name, address, str(epoch), holder, workflow_id)).encode()
    return hmac.new(key, identity, hashlib.sha256).hexdigest()
