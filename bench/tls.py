"""An https endpoint on loopback for the init rows: a throwaway CA and server certificate made at run time, and
a TLS-terminating forwarder in front of DynamoDB Local.

`certificates(folder)` writes a self-signed CA (RSA 2048, as Amazon's roots and DynamoDB's certificates are) and
a server certificate it signs for 127.0.0.1, with the `cryptography` package when it imports, else the
`openssl` command. `TLSForwarder(upstream, cert, key)` listens on a free port of 127.0.0.1 only, completes TLS
with each client (asyncio, on a thread of its own) and pipes the plaintext to `upstream`; `close()` stops it.
Clients trust the CA through AWS_CA_BUNDLE.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import shutil
import ssl
import subprocess
import threading
from pathlib import Path
from typing import NamedTuple

HOST = "127.0.0.1"


class Certificates(NamedTuple):
    ca: Path  # the CA's certificate: what a client trusts
    cert: Path  # the server's certificate, signed by the CA
    key: Path  # the server's private key
    made_by: str  # "cryptography" or "openssl"


def certificates(folder: Path) -> Certificates:
    folder.mkdir(parents=True, exist_ok=True)
    try:
        import cryptography  # noqa: F401
    except ImportError:
        if shutil.which("openssl") is None:
            raise RuntimeError("neither the cryptography package nor the openssl command is available") from None
        return _with_openssl(folder)
    return _with_cryptography(folder)


def _with_cryptography(folder: Path) -> Certificates:
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = now - datetime.timedelta(hours=1), now + datetime.timedelta(days=1)
    ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "idempotency-layer bench throwaway CA")])
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(start).not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                     crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, HOST)])).issuer_name(ca_name)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(start).not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(HOST)),
                                                    x509.DNSName("localhost")]), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    found = Certificates(folder / "ca.pem", folder / "server.pem", folder / "server.key", "cryptography")
    found.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    found.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    found.key.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                            serialization.NoEncryption()))
    return found


def _with_openssl(folder: Path) -> Certificates:
    found = Certificates(folder / "ca.pem", folder / "server.pem", folder / "server.key", "openssl")
    ca_key = folder / "ca.key"
    run = [shutil.which("openssl") or "openssl"]
    subprocess.run([*run, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-keyout", str(ca_key),
                    "-out", str(found.ca), "-subj", "/CN=idempotency-layer bench throwaway CA",
                    "-addext", "basicConstraints=critical,CA:TRUE,pathlen:0",
                    "-addext", "keyUsage=critical,keyCertSign,cRLSign"], check=True, capture_output=True)
    subprocess.run([*run, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-keyout", str(found.key),
                    "-out", str(found.cert), "-subj", f"/CN={HOST}", "-CA", str(found.ca), "-CAkey", str(ca_key),
                    "-addext", "basicConstraints=critical,CA:FALSE",
                    "-addext", f"subjectAltName=IP:{HOST},DNS:localhost",
                    "-addext", "extendedKeyUsage=serverAuth"], check=True, capture_output=True)
    return found


class TLSForwarder:
    """TLS on 127.0.0.1:<free port>, plaintext to `upstream`; one asyncio loop on a daemon thread."""

    def __init__(self, upstream: tuple[str, int], cert: Path, key: Path) -> None:
        self.upstream = upstream
        self._context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._context.load_cert_chain(cert, key)
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._failed: BaseException | None = None
        self.connections = 0
        self.port = 0
        self._thread = threading.Thread(target=self._run, name="tls-forwarder", daemon=True)
        self._thread.start()
        self._ready.wait(10)
        if self._failed is not None or not self.port:
            raise RuntimeError(f"the TLS forwarder did not start: {self._failed!r}")

    @property
    def endpoint(self) -> str:
        return f"https://{HOST}:{self.port}"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            server = self._loop.run_until_complete(
                asyncio.start_server(self._serve, HOST, 0, ssl=self._context, ssl_handshake_timeout=10))
            self.port = server.sockets[0].getsockname()[1]
        except BaseException as error:  # reported by the constructor
            self._failed = error
            self._ready.set()
            return
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            server.close()
            tasks = asyncio.all_tasks(self._loop)
            for task in tasks:
                task.cancel()
            self._loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            self._loop.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.close()
            return
        try:
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        except asyncio.CancelledError:  # close(): end quietly (a cancelled stream task is reported as an error)
            for each in (writer, up_writer):
                with contextlib.suppress(OSError, RuntimeError):
                    each.close()

    @staticmethod
    async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        # asyncio sets TCP_NODELAY on its TCP sockets, so nothing waits out a delayed ACK here.
        try:
            while data := await source.read(65536):
                sink.write(data)
                await sink.drain()
        except (OSError, ssl.SSLError):
            pass
        finally:
            with contextlib.suppress(OSError, RuntimeError):
                sink.close()

    def close(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
