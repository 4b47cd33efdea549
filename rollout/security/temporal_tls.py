"""How a Temporal client proves itself to the server and checks the server: TLS, mutual where the server asks
for a client certificate, from `services.temporal`'s `tls_*` settings.

Contract:
- `temporal_tls(temporal)` is False where none of `tls_ca`, `tls_cert`, `tls_key` is set: plain gRPC, as the
  embedded dev server on loopback speaks (it has no TLS). Otherwise a `TLSConfig`: the server's certificate
  checked against `tls_ca` (a CA of your own; the system's roots when unset), under `tls_server_name` (the
  address's host when unset); and, with `tls_cert` and `tls_key`, the client's certificate, which a server set
  up for mutual TLS requires of every worker and client: then only holders of a certificate its CA signed
  can start workflows, complete activities or send signals.
- The files are read when a client connects. One that cannot be read is `TemporalTLSError`, naming the
  setting and the file and what to do.
- Every client rollout makes (workers, `rollout run`, the gateway's run control, the dashboard, `rollout
  status`) connects through this.
"""

from __future__ import annotations

from pathlib import Path

from temporalio.service import TLSConfig

from rollout.config import TemporalSettings


class TemporalTLSError(ValueError):
    """A TLS file the settings name cannot be read."""


def _read(setting: str, path: str | None) -> bytes | None:
    if not path:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as error:
        raise TemporalTLSError(
            f"services.temporal.{setting} names {path}, which cannot be read ({error.strerror}): point it at "
            "the PEM file your Temporal's administrator issued, or unset it"
        ) from None


def temporal_tls(temporal: TemporalSettings) -> TLSConfig | bool:
    if not (temporal.tls_ca or temporal.tls_cert or temporal.tls_key):
        return False
    return TLSConfig(
        server_root_ca_cert=_read("tls_ca", temporal.tls_ca),
        domain=temporal.tls_server_name or None,
        client_cert=_read("tls_cert", temporal.tls_cert),
        client_private_key=_read("tls_key", temporal.tls_key),
    )
