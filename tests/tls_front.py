"""A mutual-TLS front for the test stack's Temporal, for tests/test_temporal_tls.py: the embedded dev server
speaks no TLS, so this stands where a Temporal cluster's TLS listener would. It terminates TLS (offering h2,
as gRPC asks), requires a client certificate signed by its CA, and pipes the bytes to the dev server.

- `make_pki(folder)` writes a CA, a server certificate for 127.0.0.1 and `localhost`, a client certificate
  the CA signed, and a client certificate of another CA (a stranger's), as PEM files.
- `tls_front(pki, upstream)` serves on a free loopback port in a thread of its own while the block runs and
  yields its `host:port`.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from rollout.net import free_port


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    stranger_cert: Path
    stranger_key: Path


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _issue(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey] | None,
    *,
    ca: bool = False,
    names: list[x509.GeneralName] | None = None,
) -> x509.Certificate:
    """A certificate with the extensions strict verifiers (Python's, rustls's) ask for: key identifiers, key
    usage, and the purpose (a server's, a client's, or a CA's)."""
    now = datetime.datetime.now(datetime.UTC)
    issuer_name, signer = issuer if issuer else (_name(subject), key)
    purpose = [ExtendedKeyUsageOID.SERVER_AUTH] if names else [ExtendedKeyUsageOID.CLIENT_AUTH]
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(signer.public_key()), critical=False
        )
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=ca,
                crl_sign=ca,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    )
    if not ca:
        builder = builder.add_extension(x509.ExtendedKeyUsage(purpose), critical=False)
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(signer, hashes.SHA256())


def _write(
    folder: Path, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey
) -> tuple[Path, Path]:
    cert_path, key_path = folder / f"{stem}.crt", folder / f"{stem}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_path, key_path


def make_pki(folder: Path) -> Pki:
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _issue("rollout test CA", ca_key, None, ca=True)
    ca_path, _ = _write(folder, "ca", ca, ca_key)
    names: list[x509.GeneralName] = [
        x509.DNSName("localhost"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
    ]
    server_key = ec.generate_private_key(ec.SECP256R1())
    server = _write(
        folder, "server", _issue("temporal", server_key, (ca.subject, ca_key), names=names), server_key
    )
    client_key = ec.generate_private_key(ec.SECP256R1())
    client = _write(folder, "client", _issue("rollout worker", client_key, (ca.subject, ca_key)), client_key)
    stranger_key = ec.generate_private_key(ec.SECP256R1())
    stranger = _write(folder, "stranger", _issue("stranger", stranger_key, None), stranger_key)
    return Pki(ca_path, *server, *client, *stranger)


@dataclass
class TlsFront:
    address: str
    _loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.new_event_loop)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, OSError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    with contextlib.suppress(ConnectionError, OSError):
        writer.close()


@contextlib.contextmanager
def tls_front(pki: Pki, upstream: tuple[str, int]) -> Iterator[TlsFront]:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(pki.ca))
    context.load_cert_chain(pki.server_cert, pki.server_key)
    context.verify_mode = ssl.CERT_REQUIRED
    context.set_alpn_protocols(["h2"])
    port = free_port()
    front = TlsFront(f"127.0.0.1:{port}")
    ready = threading.Event()

    async def serve() -> None:
        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                up_reader, up_writer = await asyncio.open_connection(*upstream)
            except OSError:
                writer.close()
                return
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

        server = await asyncio.start_server(accept, "127.0.0.1", port, ssl=context)
        ready.set()
        await stop.wait()
        server.close()
        server.abort_clients()  # a client still connected would keep wait_closed waiting
        await server.wait_closed()
        pipes = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in pipes:
            task.cancel()
        await asyncio.gather(*pipes, return_exceptions=True)

    def run() -> None:
        front._loop.run_until_complete(serve())

    stop = asyncio.Event()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    ready.wait(10)
    try:
        yield front
    finally:
        front._loop.call_soon_threadsafe(stop.set)
        thread.join(10)
        front._loop.close()
