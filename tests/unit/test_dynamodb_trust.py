"""dynamodb/trust.py and scripts/cacert_dirs.py: a CA bundle trusted through the hashed certificate directory the
build made of it (capath) accepts and refuses exactly the chains the bundle file itself does (cafile).

Real TLS handshakes on 127.0.0.1 against servers in threads, each presenting one generated chain (leaf <-
intermediate <- root); the client contexts come from `trust.tls_context`, once with the directory shipped and
once without. Verdicts are compared including OpenSSL's verify code, not just accepted/refused.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from idempotency_layer.aws import trust
from scripts import cacert_dirs

HOST = "127.0.0.1"
NAME = "localhost"  # the name every client asks for (server_hostname)
NOW = datetime.datetime.now(datetime.timezone.utc)


class Issued(NamedTuple):
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @property
    def pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)


def issue(subject: str, issuer: Issued | None, *, ca: bool, host: str | None = None,
          expired: bool = False) -> Issued:
    """A certificate for `subject` signed by `issuer` (self-signed without one); P-256 keys, quick to make."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    start, end = NOW - datetime.timedelta(days=2), NOW + datetime.timedelta(days=2)
    if expired:
        end = NOW - datetime.timedelta(days=1)
    signer = issuer.key if issuer else key
    builder = (
        x509.CertificateBuilder().subject_name(name).issuer_name(issuer.cert.subject if issuer else name)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(start).not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    if issuer is not None:
        builder = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer.key.public_key()), critical=False)
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                          data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                          encipher_only=False, decipher_only=False), critical=True)
    else:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(host or NAME)]), critical=False)
    return Issued(builder.sign(signer, hashes.SHA256()), key)


class Server:
    """TLS on 127.0.0.1:<free port> presenting `leaf` and `chain`; completes handshakes until closed."""

    def __init__(self, folder: Path, leaf: Issued, chain: list[Issued]) -> None:
        folder.mkdir(parents=True)
        (folder / "chain.pem").write_bytes(leaf.pem + b"".join(c.pem for c in chain))
        (folder / "key.pem").write_bytes(leaf.key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
        self._context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._context.load_cert_chain(folder / "chain.pem", folder / "key.pem")
        self._listener = socket.create_server((HOST, 0))
        self._listener.settimeout(0.2)
        self.port = self._listener.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(5)
            try:
                with self._context.wrap_socket(conn, server_side=True) as tls:
                    tls.recv(1)  # until the client closes
            except (OSError, ssl.SSLError):
                pass  # the client refused the chain
            finally:
                conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._listener.close()


def verdict(context: ssl.SSLContext, port: int) -> str:
    """"ok", or OpenSSL's verify code and message for the refused chain."""
    with socket.create_connection((HOST, port), timeout=5) as sock:
        try:
            with context.wrap_socket(sock, server_hostname=NAME):
                return "ok"
        except ssl.SSLCertVerificationError as error:
            return f"{error.verify_code} {error.verify_message}"


class PKI(NamedTuple):
    roots: dict[str, Issued]  # the roots a bundle may hold
    outsider: Issued  # a root no bundle holds
    servers: dict[str, Server]  # chain name -> its server
    anchor: dict[str, str]  # chain name -> the root it leads to


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PKI]:
    folder = tmp_path_factory.mktemp("pki")
    roots = {name: issue(f"Test Root {name}", None, ca=True) for name in ("A", "B", "C")}
    # Same subject name, different keys: one subject hash, so the directory holds <hash>.0 and <hash>.1.
    roots["twin1"] = issue("Test Twin Root", None, ca=True)
    roots["twin2"] = issue("Test Twin Root", None, ca=True)
    outsider = issue("Test Root Outside", None, ca=True)
    chains: dict[str, tuple[str | None, Issued, list[Issued]]] = {}
    for name, root in [*roots.items(), ("outsider", outsider)]:
        intermediate = issue(f"Test Intermediate {name}", root, ca=True)
        chains[name] = (name, issue(NAME, intermediate, ca=False), [intermediate])
    intermediate = issue("Test Intermediate expired", roots["A"], ca=True, expired=True)
    chains["expired intermediate"] = ("A", issue(NAME, intermediate, ca=False), [intermediate])
    intermediate = issue("Test Intermediate other host", roots["A"], ca=True)
    chains["other host"] = ("A", issue("other.example", intermediate, ca=False, host="other.example"), [intermediate])
    servers: dict[str, Server] = {}
    try:
        for i, (name, (_, leaf, chain)) in enumerate(chains.items()):
            servers[name] = Server(folder / f"server{i}", leaf, chain)
        yield PKI(roots, outsider, servers, {name: anchor or "" for name, (anchor, _, _) in chains.items()})
    finally:
        for server in servers.values():
            server.close()


def write_bundle(path: Path, roots: list[Issued]) -> Path:
    # As certifi's: a comment block before each certificate.
    path.write_bytes(b"".join(b"# Issuer: " + r.cert.subject.rfc4514_string().encode() + b"\n" + r.pem
                              for r in roots))
    return path


def both_ways(bundle: Path, shipped: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """The context trusting `bundle` through its directory in `shipped`, and the one loading the file."""
    by_dir = trust.tls_context(str(bundle), shipped=str(shipped))
    assert trust.last_way == "capath"
    by_file = trust.tls_context(str(bundle), shipped=str(shipped.parent / "nothing shipped"))
    assert trust.last_way == "cafile"
    return by_dir, by_file


@pytest.fixture
def bundle(pki: PKI, tmp_path: Path) -> tuple[Path, Path]:
    """A bundle of roots A, B, C and both twins, and the folder holding its directory."""
    path = write_bundle(tmp_path / "bundle.pem", [pki.roots[n] for n in ("A", "B", "C", "twin1", "twin2")])
    cacert_dirs.make_dir(path, tmp_path / "shipped")
    return path, tmp_path / "shipped"


# ---- the same chains accepted and refused both ways ----


def test_chains_to_each_root_of_the_bundle_are_accepted_both_ways(pki: PKI, bundle: tuple[Path, Path]) -> None:
    by_dir, by_file = both_ways(*bundle)
    for name in ("A", "B", "C"):
        assert verdict(by_dir, pki.servers[name].port) == verdict(by_file, pki.servers[name].port) == "ok", name


def test_a_chain_to_a_root_outside_the_bundle_is_refused_both_ways(pki: PKI, bundle: tuple[Path, Path]) -> None:
    by_dir, by_file = both_ways(*bundle)
    port = pki.servers["outsider"].port
    assert verdict(by_dir, port) == verdict(by_file, port)
    assert verdict(by_dir, port).startswith("20 ")  # unable to get local issuer certificate


def test_an_expired_intermediate_is_refused_both_ways(pki: PKI, bundle: tuple[Path, Path]) -> None:
    by_dir, by_file = both_ways(*bundle)
    port = pki.servers["expired intermediate"].port
    assert verdict(by_dir, port) == verdict(by_file, port)
    assert verdict(by_dir, port).startswith("10 ")  # certificate has expired


def test_a_leaf_for_another_host_is_refused_both_ways(pki: PKI, bundle: tuple[Path, Path]) -> None:
    by_dir, by_file = both_ways(*bundle)
    port = pki.servers["other host"].port
    assert verdict(by_dir, port) == verdict(by_file, port)
    assert verdict(by_dir, port).startswith("62 ")  # hostname mismatch


def test_two_roots_with_one_subject_name_both_work_through_the_directory(pki: PKI, bundle: tuple[Path, Path]) -> None:
    path, shipped = bundle
    names = sorted(os.listdir(shipped / hashlib.sha256(path.read_bytes()).hexdigest()))
    stems = [n.rsplit(".", 1)[0] for n in names]
    twin_hash = next(s for s in stems if stems.count(s) == 2)
    assert f"{twin_hash}.0" in names and f"{twin_hash}.1" in names
    by_dir, by_file = both_ways(path, shipped)
    for name in ("twin1", "twin2"):
        assert verdict(by_dir, pki.servers[name].port) == verdict(by_file, pki.servers[name].port) == "ok", name


def test_a_bundle_changed_after_its_directory_was_made_is_loaded_as_a_file(pki: PKI, bundle: tuple[Path, Path]) -> None:
    path, shipped = bundle
    # Root A taken out after the directory was made: the directory still trusts it, the file no longer does.
    write_bundle(path, [pki.roots[n] for n in ("B", "C", "twin1", "twin2")])
    context = trust.tls_context(str(path), shipped=str(shipped))
    assert trust.last_way == "cafile"
    assert verdict(context, pki.servers["A"].port).startswith("20 ")
    assert verdict(context, pki.servers["B"].port) == "ok"
    # One byte more (a trailing newline) is another file too.
    write_bundle(path, [pki.roots[n] for n in ("A", "B", "C", "twin1", "twin2")])
    assert trust.shipped_dir(str(path), str(shipped)) is not None
    path.write_bytes(path.read_bytes() + b"\n")
    assert trust.shipped_dir(str(path), str(shipped)) is None


def test_the_directory_holds_what_openssl_reads_not_pem_blocks_picked_by_hand(pki: PKI, tmp_path: Path) -> None:
    # OpenSSL reads a block labelled X509 CERTIFICATE too, and no block whose lines are commented out.
    old_label = pki.roots["A"].pem.replace(b"CERTIFICATE", b"X509 CERTIFICATE")
    commented = b"".join(b"# " + line for line in pki.roots["C"].pem.splitlines(keepends=True))
    path = tmp_path / "bundle.pem"
    path.write_bytes(old_label + pki.roots["B"].pem + commented)
    cacert_dirs.make_dir(path, tmp_path / "shipped")
    by_dir, by_file = both_ways(path, tmp_path / "shipped")
    for name, expected in (("A", "ok"), ("B", "ok"), ("C", "20 ")):
        assert verdict(by_dir, pki.servers[name].port) == verdict(by_file, pki.servers[name].port), name
        assert verdict(by_file, pki.servers[name].port).startswith(expected), name


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(chosen=st.lists(st.sampled_from(["A", "B", "C", "twin1", "twin2"]), min_size=1, max_size=7))
def test_any_bundle_of_these_roots_gives_every_chain_the_same_verdict_both_ways(
        pki: PKI, tmp_path_factory: pytest.TempPathFactory, chosen: list[str]) -> None:
    # Any subset, order and repetition (OpenSSL drops duplicates) of the roots.
    folder = tmp_path_factory.mktemp("drawn")
    path = write_bundle(folder / "bundle.pem", [pki.roots[n] for n in chosen])
    cacert_dirs.make_dir(path, folder / "shipped")
    by_dir, by_file = both_ways(path, folder / "shipped")
    for name, server in pki.servers.items():
        expected = verdict(by_file, server.port)
        assert verdict(by_dir, server.port) == expected, name
        if name in ("A", "B", "C", "twin1", "twin2"):  # the file's verdict itself is the one expected
            assert (expected == "ok") == (name in chosen), (name, expected)


# ---- what the build writes ----


def read_dir(directory: Path) -> dict[str, bytes]:
    return {name: ssl.PEM_cert_to_DER_cert((directory / name).read_text()) for name in os.listdir(directory)}


def openssl_reading(bundle: Path) -> set[bytes]:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(cafile=str(bundle))
    return set(context.get_ca_certs(binary_form=True))


REAL_BUNDLES = cacert_dirs.default_bundles([])


@pytest.mark.skipif(not REAL_BUNDLES, reason="neither certifi nor botocore is installed here")
@pytest.mark.parametrize("bundle_file", REAL_BUNDLES, ids=lambda p: p.parent.name)
def test_a_real_bundles_directory_holds_exactly_what_openssl_reads_from_it(bundle_file: Path, tmp_path: Path) -> None:
    directory = cacert_dirs.make_dir(bundle_file, tmp_path)
    assert directory.name == hashlib.sha256(bundle_file.read_bytes()).hexdigest()
    found = read_dir(directory)
    assert set(found.values()) == openssl_reading(bundle_file)
    assert len(found) == len(set(found.values())) > 100
    # Names: OpenSSL's subject hash, suffixes .0, .1, ... without gaps.
    stems: dict[str, list[int]] = {}
    for name in found:
        stem, n = name.rsplit(".", 1)
        stems.setdefault(stem, []).append(int(n))
    assert all(sorted(ns) == list(range(len(ns))) for ns in stems.values())
    sample = sorted(found)[:: max(1, len(found) // 12)]  # `openssl x509 -hash` takes ~20 ms a run: a spread
    for name in sample:
        done = subprocess.run(["openssl", "x509", "-hash", "-noout", "-in", str(directory / name)],
                              capture_output=True, text=True, check=True)
        assert done.stdout.strip() == name.rsplit(".", 1)[0]
    assert trust.shipped_dir(str(bundle_file), str(tmp_path)) == str(directory)


def test_the_directory_depends_only_on_the_bundle(pki: PKI, tmp_path: Path) -> None:
    # The twins listed against the order of their DER bytes, so that no sort of the bytes gives the file's order.
    late, early = sorted((pki.roots["twin1"], pki.roots["twin2"]), key=der_of)
    path = write_bundle(tmp_path / "bundle.pem", [early, pki.roots["A"], late, pki.roots["C"]])
    first = read_dir(cacert_dirs.make_dir(path, tmp_path / "one"))
    second = read_dir(cacert_dirs.make_dir(path, tmp_path / "two"))
    assert first == second
    assert [n for n, _ in sorted(first.items())] == sorted(os.listdir(tmp_path / "two" / path_digest(path)))
    # Same subject hash: numbered in the order the file lists them.
    twins = sorted(n for n, der in first.items() if der in (der_of(pki.roots["twin1"]), der_of(pki.roots["twin2"])))
    assert [first[n] for n in twins] == [der_of(early), der_of(late)]
    for name in os.listdir(tmp_path / "one" / path_digest(path)):
        assert (tmp_path / "one" / path_digest(path) / name).read_bytes() == \
            (tmp_path / "two" / path_digest(path) / name).read_bytes()


def path_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def der_of(issued: Issued) -> bytes:
    return issued.cert.public_bytes(serialization.Encoding.DER)


def test_a_bundle_a_directory_cannot_reproduce_gets_none(pki: PKI, tmp_path: Path) -> None:
    leaf = issue("pinned.example", None, ca=False, host="pinned.example")  # trusted as is by a file, not a CA
    with_leaf = write_bundle(tmp_path / "leaf.pem", [pki.roots["A"], leaf])
    with pytest.raises(cacert_dirs.Unsuitable, match="not CAs"):
        cacert_dirs.make_dir(with_leaf, tmp_path / "shipped")
    trusted = tmp_path / "trusted.pem"
    trusted.write_bytes(pki.roots["A"].pem.replace(b"CERTIFICATE", b"TRUSTED CERTIFICATE"))
    with pytest.raises(cacert_dirs.Unsuitable, match="TRUSTED"):
        cacert_dirs.make_dir(trusted, tmp_path / "shipped")
    # The script goes on without them: the good bundle gets its directory, the others none.
    unreadable = tmp_path / "unreadable.pem"
    unreadable.write_bytes(pki.roots["C"].pem.replace(b"\n-----END", b"!!\n-----END"))
    good = write_bundle(tmp_path / "good.pem", [pki.roots["B"]])
    assert cacert_dirs.main([str(tmp_path / "out"), str(with_leaf), str(trusted), str(unreadable), str(good)]) == 0
    given_ = {path_digest(p) for p in (with_leaf, trusted, unreadable, good)}  # (the host's bundles are made too)
    assert set(os.listdir(tmp_path / "out")) & given_ == {path_digest(good)}


def test_the_build_scans_a_layer_folder_for_the_bundles_it_ships(pki: PKI, tmp_path: Path) -> None:
    stage = tmp_path / "python"
    (stage / "botocore").mkdir(parents=True)
    shipped = write_bundle(stage / "botocore" / "cacert.pem", [pki.roots["C"]])
    (stage / "other").mkdir()
    write_bundle(stage / "other" / "cacert.pem", [pki.roots["A"]])  # not a package botocore would take it from
    cacert_dirs.main([str(tmp_path / "out"), "--scan", str(stage)])
    assert path_digest(shipped) in os.listdir(tmp_path / "out")
    assert path_digest(stage / "other" / "cacert.pem") not in os.listdir(tmp_path / "out")


# ---- init: errors and what is read ----


def plain_error(cafile: str) -> type[BaseException]:
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=cafile)
    except (OSError, ssl.SSLError) as error:
        return type(error)
    raise AssertionError("loading it should fail")


def test_a_bundle_that_cannot_be_loaded_raises_as_it_always_did(bundle: tuple[Path, Path], tmp_path: Path) -> None:
    _, shipped = bundle  # something is shipped, so each is looked at before OpenSSL is
    garbage = tmp_path / "garbage.pem"
    garbage.write_bytes(b"no certificate here\n")
    for cafile in (str(tmp_path / "missing.pem"), str(tmp_path), str(garbage)):
        with pytest.raises(plain_error(cafile)):
            trust.tls_context(cafile, shipped=str(shipped))
        assert trust.shipped_dir(cafile, str(shipped)) is None


def test_a_fifo_is_not_read_before_openssl_reads_it(bundle: tuple[Path, Path], tmp_path: Path) -> None:
    _, shipped = bundle
    fifo = tmp_path / "bundle.fifo"
    os.mkfifo(fifo)
    found: list[str | None] = []
    worker = threading.Thread(target=lambda: found.append(trust.shipped_dir(str(fifo), str(shipped))), daemon=True)
    worker.start()
    worker.join(10)
    if worker.is_alive():  # blocked opening it: release it, then fail
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        worker.join(5)
        pytest.fail("shipped_dir blocked on a FIFO")
    assert found == [None]


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_bundle_that_is_a_pipe_or_a_device_is_refused_not_waited_on(tmp_path: Path, kind: str) -> None:
    # A hostile review's AWS_CA_BUNDLE FIFO hung init: OpenSSL waited for a writer that never came.
    if kind == "fifo":
        path = tmp_path / "bundle.fifo"
        os.mkfifo(path)
    else:
        path = Path("/dev/zero")  # read forever
    outcome: list[BaseException | None] = []

    def build() -> None:
        try:
            trust.tls_context(str(path))
            outcome.append(None)
        except BaseException as error:  # handed to the test below
            outcome.append(error)

    worker = threading.Thread(target=build, daemon=True)
    worker.start()
    worker.join(10)
    if worker.is_alive():
        if kind == "fifo":
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("tls_context waited on the bundle")
    assert isinstance(outcome[0], OSError) and "not a regular file" in str(outcome[0])


def test_no_bundle_trusts_the_systems_certificates() -> None:
    context = trust.tls_context(None)
    assert trust.last_way == "default"
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname


# -- the context's settings are botocore's -------------------------------------------------------------------

_COMPARE_TLS = """
import sys
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/lib/python%d.%d/site-packages" % sys.version_info[:2]]
from botocore.httpsession import create_urllib3_context
from idempotency_layer.aws import trust
ours = trust.tls_context(sys.argv[2])
theirs = create_urllib3_context()
theirs.load_verify_locations(cafile=sys.argv[2])
names = ("options", "verify_flags", "verify_mode", "minimum_version", "maximum_version", "protocol",
         "post_handshake_auth")
differ = [n for n in names if getattr(ours, n) != getattr(theirs, n)]
if ours.get_ca_certs() != theirs.get_ca_certs():
    differ.append("ca_certs")
if not (ours.check_hostname and trust.last_way == "cafile"):
    differ.append("check_hostname or way")
print(sys.version_info[:2], differ)
sys.exit(1 if differ else 0)
"""


def _own_ca_bundle(tmp_path: Path) -> str:
    """A bundle of one throwaway CA: no directory is shipped for it, so it is loaded as a file."""
    ca = issue("Own Root", None, ca=True)
    path = tmp_path / "own-ca.pem"
    path.write_bytes(ca.pem)
    return str(path)


def test_the_tls_context_is_botocores(tmp_path):
    from botocore.httpsession import create_urllib3_context

    bundle = _own_ca_bundle(tmp_path)
    ours = trust.tls_context(bundle)
    theirs = create_urllib3_context()
    theirs.load_verify_locations(cafile=bundle)
    for name in ("options", "verify_flags", "verify_mode", "minimum_version", "maximum_version", "protocol",
                 "post_handshake_auth"):
        assert getattr(ours, name) == getattr(theirs, name), name
    assert ours.get_ca_certs() == theirs.get_ca_certs()
    assert ours.verify_mode == ssl.CERT_REQUIRED and ours.check_hostname  # urllib3 checks the name itself


def test_the_tls_context_is_botocores_on_every_python(tmp_path):
    # Python 3.13 changed ssl.create_default_context's flags; the context must match botocore's on each runtime,
    # with the built layer as Lambda would load it.
    from tests.support import downloads
    from tests.support.rie import ensure_layer, unpack_layer

    runtimes = downloads.runtimes()
    assert runtimes, "no runtime venvs"
    opt = unpack_layer(ensure_layer(), tmp_path / "opt")
    bundle = _own_ca_bundle(tmp_path)
    for version, python in sorted(runtimes.items()):
        run = subprocess.run([str(python), "-I", "-c", _COMPARE_TLS, str(opt / "python"), bundle],
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, (version, run.stdout, run.stderr[-2000:])
