"""What TLS connections to DynamoDB trust: the CA bundle botocore would load.

Loading a whole CA bundle (`cafile`) makes OpenSSL parse every certificate in it at init, about 15 ms for
certifi's 117. The build (scripts/cacert_dirs.py) ships, for each bundle the layer trusts by default on Lambda
(botocore's and certifi's cacert.pem), a hashed certificate directory `cacerts/<sha256 of the bundle file>/`
holding exactly the certificates OpenSSL reads from that file, each under its subject-hash name. When the bundle
asked for is byte-identical to one of those (its SHA-256), OpenSSL is pointed at the directory (`capath`) and
reads only the certificates a chain needs, at the handshake; any other bundle is loaded as a file, as before.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # typing costs ~2 ms of init: imported only by type checkers
if TYPE_CHECKING:
    from typing import Any

# Where the build puts the directories; absent in a source checkout (every bundle is then loaded as a file).
SHIPPED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cacerts")
# Larger than any CA bundle (certifi's is about 300 KB): a bigger file is not read twice to find it is unknown.
_MAX_BUNDLE_BYTES = 4 * 1024 * 1024

# How the last context tls_context built trusts its bundle: "capath" (a shipped directory), "cafile" (the file),
# "default" (no bundle: the system's), or None before any. Read by the bench's probe and the tests.
last_way: str | None = None


def shipped_dir(cafile: str, shipped: str = SHIPPED) -> str | None:
    """The directory shipped for `cafile`'s exact bytes, or None (then the file itself must be loaded).

    Only a regular file of bounded size is read: reading a FIFO or a device here would consume or block on
    what OpenSSL is to read after. A file that cannot be read is left to OpenSSL, which raises as it always did.
    """
    import stat

    try:
        known = os.listdir(shipped)
    except OSError:
        return None  # nothing shipped (a source checkout, a build without bundles)
    if not known:
        return None
    try:
        # O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer (no effect on a regular file).
        fd = os.open(cafile, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        with open(fd, "rb") as f:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_size > _MAX_BUNDLE_BYTES:
                return None
            data = f.read(_MAX_BUNDLE_BYTES + 1)
    except OSError:
        return None
    import hashlib

    digest = hashlib.sha256(data).hexdigest()
    if digest not in known:
        return None
    return os.path.join(shipped, digest)


def _refuse_special(cafile: str) -> None:
    """A FIFO, socket or device as the bundle: OpenSSL would wait on it (a FIFO with no writer) or read it
    forever (/dev/zero), and init would hang. Refused as a bundle that cannot be loaded; anything else (a missing
    file, a directory) is left to OpenSSL, which raises as it always did."""
    import stat

    try:
        mode = os.stat(cafile).st_mode
    except (OSError, ValueError):
        return
    if stat.S_ISFIFO(mode) or stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISSOCK(mode):
        raise OSError(f"the CA bundle {cafile} is not a regular file (a pipe, socket or device)")


def tls_context(cafile: str | None, *, shipped: str = SHIPPED) -> Any:
    """The TLS context botocore's lean path verifies with: `botocore.httpsession.create_urllib3_context`'s
    settings (not `ssl.create_default_context`, which on Python 3.13 adds VERIFY_X509_STRICT and
    VERIFY_X509_PARTIAL_CHAIN), then only `cafile`, as urllib3 loads `ca_certs`: SSL_CERT_FILE / SSL_CERT_DIR and
    the system's default paths are not consulted. The host name is checked by OpenSSL, as urllib3 2 has it.

    `cafile` byte-identical to a bundle the build made a directory of (in `shipped`): that directory, which
    trusts the same certificates (tests/unit/test_dynamodb_trust.py); any other: the file, as botocore loads it.
    An unreadable bundle raises OSError or ssl.SSLError, as OpenSSL reports it."""
    import ssl

    global last_way
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.options |= ssl.OP_NO_SSLv2 | ssl.OP_NO_SSLv3 | ssl.OP_NO_COMPRESSION | ssl.OP_NO_TICKET
    if getattr(context, "post_handshake_auth", None) is not None:
        context.post_handshake_auth = True
    context.verify_mode = ssl.CERT_REQUIRED
    context.check_hostname = True
    keylog = os.environ.get("SSLKEYLOGFILE")
    if keylog and not sys.flags.ignore_environment and hasattr(context, "keylog_filename"):
        context.keylog_filename = keylog
    if cafile is None:
        context.load_default_certs()
        last_way = "default"
        return context
    _refuse_special(cafile)
    directory = shipped_dir(cafile, shipped)
    if directory is not None:
        context.load_verify_locations(capath=directory)
        last_way = "capath"
    else:
        context.load_verify_locations(cafile=cafile)
        last_way = "cafile"
    return context
