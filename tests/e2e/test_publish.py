"""`./build.sh publish` against moto's server: layer versions in two regions, one layer per architecture, the
grant, published.json, the refusal of a zip verify_layer.py fails, and one-line errors.

moto 5.2.5 implements every Lambda call publish makes (PublishLayerVersion, AddLayerVersionPermission) and every
one this test reads back with (ListLayers, ListLayerVersions, GetLayerVersion, GetLayerVersionPolicy): no call
goes uncovered. What moto does not model is said in docs/container-and-publish.md (IAM: an AccessDenied answer
comes from a stand-in endpoint here; the account a grant names is not checked to exist).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.client
import json
import os
import shutil
import subprocess
import threading
import uuid
import zipfile
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import boto3
import pytest
from botocore.exceptions import ClientError

from tests.support.rie import ensure_layer
from tests.support.sqs_server import SQSServer

ROOT = Path(__file__).resolve().parents[2]
ARCHES = ("x86_64", "arm64")
REGIONS = ("us-east-1", "eu-west-1")
RUNTIMES = ["python3.10", "python3.11", "python3.12", "python3.13", "python3.14"]


@pytest.fixture(scope="module")
def built() -> Path:
    """The zips `./build.sh build` made (built first when stale)."""
    return ensure_layer().parent


@pytest.fixture
def dist(built: Path, tmp_path: Path) -> Path:
    """A dist/ of this test's own: copies of the built zips, and where published.json goes."""
    folder = tmp_path / "dist"
    folder.mkdir()
    for arch in ARCHES:
        shutil.copyfile(built / f"idempotency-layer-{arch}.zip", folder / f"idempotency-layer-{arch}.zip")
    return folder


def aws_env(endpoint: str | None, credentials: bool = True) -> dict[str, str]:
    """The environment a publish runs in: nothing of this machine's AWS setup, only what the test gives."""
    env = {name: os.environ[name] for name in ("PATH", "HOME", "LANG", "TMPDIR") if name in os.environ}
    env.update({"AWS_CONFIG_FILE": "/dev/null", "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
                "AWS_EC2_METADATA_DISABLED": "true"})
    if credentials:
        env.update({"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"})
    if endpoint:
        env["AWS_ENDPOINT_URL"] = endpoint
    return env


def publish(*args: str, endpoint: str | None, credentials: bool = True,
            extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`./build.sh publish ARGS`: the dispatcher, the shared verify options and scripts/publish.py."""
    return subprocess.run(["bash", str(ROOT / "build.sh"), "publish", *args], cwd=ROOT, capture_output=True,
                          text=True, env={**aws_env(endpoint, credentials), **(extra or {})}, timeout=300)


def lambda_client(endpoint: str, region: str) -> Any:
    return boto3.client("lambda", region_name=region, endpoint_url=endpoint, aws_access_key_id="test",
                        aws_secret_access_key="test")


def layer_names(endpoint: str, region: str) -> set[str]:
    return {layer["LayerName"] for layer in lambda_client(endpoint, region).list_layers()["Layers"]}


def one_line_error(done: subprocess.CompletedProcess[str], fragment: str) -> str:
    """The run failed with exactly one `publish: ...` line on stderr, containing `fragment`, and no traceback."""
    assert done.returncode != 0, done.stdout
    assert "Traceback" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("publish:")]
    assert len(lines) == 1 and fragment in lines[0], done.stderr
    return lines[0]


def test_publishes_each_architecture_to_each_region_with_the_grant(moto: SQSServer, dist: Path) -> None:
    name = f"t-{uuid.uuid4().hex[:8]}"
    done = publish("--dist", str(dist), "--regions", ",".join(REGIONS), "--principal", "111122223333",
                   "--layer-name", name, endpoint=moto.endpoint)
    assert done.returncode == 0, done.stderr
    document = json.loads((dist / "published.json").read_text())
    rows = document["layers"]
    assert document["layer_name"] == name
    assert [(r["region"], r["architecture"]) for r in rows] == [(g, a) for g in REGIONS for a in ARCHES]

    table = done.stdout.splitlines()
    for row in rows:
        # What moto holds is what the row says, and what was uploaded is the zip, byte for byte.
        client = lambda_client(moto.endpoint, row["region"])
        layer = f"{name}-{row['architecture']}"
        assert row["layer_name"] == layer
        versions = client.list_layer_versions(LayerName=layer)["LayerVersions"]
        assert [v["LayerVersionArn"] for v in versions] == [row["arn"]]
        got = client.get_layer_version(LayerName=layer, VersionNumber=row["version"])
        assert got["CompatibleRuntimes"] == RUNTIMES
        assert got["CompatibleArchitectures"] == [row["architecture"]]
        assert got["LicenseInfo"] == "Apache-2.0"
        assert got["Description"].startswith("idempotency-layer 0.1.0")
        data = (dist / f"idempotency-layer-{row['architecture']}.zip").read_bytes()
        assert got["Content"]["CodeSha256"] == base64.b64encode(hashlib.sha256(data).digest()).decode()
        assert got["Content"]["CodeSize"] == len(data)
        assert row["arn"].startswith(f"arn:aws:lambda:{row['region']}:") and row["arn"].endswith(f":{layer}:1")
        policy = json.loads(client.get_layer_version_policy(LayerName=layer, VersionNumber=1)["Policy"])
        assert [(s["Principal"], s["Action"], s["Effect"]) for s in policy["Statement"]] == [
            ("111122223333", "lambda:GetLayerVersion", "Allow")]
        # The table on stdout: one line per version with its region, arch, version and ARN.
        assert [row["region"], row["architecture"], "1", row["arn"]] in [line.split() for line in table]


def test_public_grant_and_a_second_publish_is_a_new_version(moto: SQSServer, dist: Path) -> None:
    name = f"t-{uuid.uuid4().hex[:8]}"
    for _ in range(2):
        done = publish("--dist", str(dist), "--regions", "eu-west-1", "--public", "--layer-name", name,
                       endpoint=moto.endpoint)
        assert done.returncode == 0, done.stderr
    rows = json.loads((dist / "published.json").read_text())["layers"]
    assert [(r["architecture"], r["version"], r["grant"]) for r in rows] == [(a, 2, "public") for a in ARCHES]
    client = lambda_client(moto.endpoint, "eu-west-1")
    for arch in ARCHES:
        policy = json.loads(client.get_layer_version_policy(LayerName=f"{name}-{arch}", VersionNumber=2)["Policy"])
        assert [s["Principal"] for s in policy["Statement"]] == ["*"]


def test_without_a_grant_nothing_is_shared_and_it_says_so(moto: SQSServer, dist: Path) -> None:
    name = f"t-{uuid.uuid4().hex[:8]}"
    done = publish("--dist", str(dist), "--regions", "us-east-1", "--layer-name", name, endpoint=moto.endpoint)
    assert done.returncode == 0, done.stderr
    assert "no grant" in done.stdout
    client = lambda_client(moto.endpoint, "us-east-1")
    for arch in ARCHES:
        with pytest.raises(ClientError) as raised:
            client.get_layer_version_policy(LayerName=f"{name}-{arch}", VersionNumber=1)
        assert raised.value.response["Error"]["Code"] == "ResourceNotFoundException"


def _without_wrapper(path: Path) -> None:
    """Rewrite the zip without the wrapper at its root: a layout verify_layer.py refuses."""
    with zipfile.ZipFile(path) as source:
        entries = [(info, source.read(info)) for info in source.infolist() if info.filename != "idempotency-wrapper"]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as target:
        for info, data in entries:
            target.writestr(info, data)


def _truncated(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize("damage", [_without_wrapper, _truncated], ids=["no-wrapper", "truncated"])
def test_a_zip_failing_verify_layer_is_refused_and_nothing_is_published(moto: SQSServer, dist: Path,
                                                                       damage: Any) -> None:
    name = f"t-{uuid.uuid4().hex[:8]}"
    damage(dist / "idempotency-layer-arm64.zip")  # the second zip checked: the good first one is not sent either
    done = publish("--dist", str(dist), "--regions", ",".join(REGIONS), "--public", "--layer-name", name,
                   endpoint=moto.endpoint)
    one_line_error(done, "idempotency-layer-arm64.zip does not pass scripts/verify_layer.py")
    assert "nothing was published" in done.stderr
    for region in REGIONS:
        assert not {f"{name}-{arch}" for arch in ARCHES} & layer_names(moto.endpoint, region)
    assert not (dist / "published.json").exists()


@pytest.mark.parametrize(("args", "fragment"), [
    ([], "required: --regions"),
    (["--regions", " , "], "--regions names no region"),
    (["--regions", "us-east-1,moon"], "'moon' is not a region name"),
    (["--regions", "us-east-1", "--principal", "12345"], "'12345' is not an AWS account id (12 digits)"),
    (["--regions", "us-east-1", "--principal", "1234567890123"], "is not an AWS account id"),
    (["--regions", "us-east-1", "--public", "--principal", "111122223333"], "not allowed with argument --public"),
    (["--regions", "us-east-1", "--layer-name", "a/b"], "--layer-name 'a/b'"),
    (["--regions", "us-east-1", "--bogus"], "unrecognized arguments: --bogus"),
], ids=["no-regions", "empty-regions", "bad-region", "short-account", "long-account", "both-grants",
        "bad-name", "unknown-option"])
def test_bad_arguments_are_one_line_errors(moto: SQSServer, dist: Path, args: list[str], fragment: str) -> None:
    done = publish("--dist", str(dist), *args, endpoint=moto.endpoint)
    one_line_error(done, fragment)
    assert not (dist / "published.json").exists()


def test_a_missing_zip_is_one_line(moto: SQSServer, dist: Path) -> None:
    (dist / "idempotency-layer-x86_64.zip").unlink()
    one_line_error(publish("--dist", str(dist), "--regions", "us-east-1", endpoint=moto.endpoint),
                   "idempotency-layer-x86_64.zip is missing: run ./build.sh first")


def test_no_credentials_is_one_line(moto: SQSServer, dist: Path) -> None:
    done = publish("--dist", str(dist), "--regions", "us-east-1", endpoint=moto.endpoint, credentials=False)
    one_line_error(done, "no AWS credentials found")
    done = publish("--dist", str(dist), "--regions", "us-east-1", endpoint=moto.endpoint, credentials=False,
                   extra={"AWS_PROFILE": "no-such-profile"})
    one_line_error(done, "ProfileNotFound: The config profile (no-such-profile) could not be found")
    assert not (dist / "published.json").exists()


class _Denied(BaseHTTPRequestHandler):
    """Answers every request as Lambda answers a role without lambda:PublishLayerVersion."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = json.dumps({"Type": "User", "Message": "User: arn:aws:iam::123456789012:user/ci is not authorized "
                           "to perform: lambda:PublishLayerVersion"}).encode()
        self.send_response(403)
        self.send_header("x-amzn-ErrorType", "AccessDeniedException")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@contextlib.contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """`handler` served on a free loopback port, for the block; its endpoint URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def denying_endpoint() -> contextlib.AbstractContextManager[str]:
    return serving(_Denied)


def test_access_denied_is_one_line(dist: Path) -> None:
    with denying_endpoint() as endpoint:
        done = publish("--dist", str(dist), "--regions", "us-east-1", endpoint=endpoint)
    line = one_line_error(done, "AccessDeniedException")
    assert line.startswith("publish: us-east-1 idempotency-layer-x86_64: AccessDeniedException: User:")
    assert not (dist / "published.json").exists()


def _region_of(authorization: str) -> str:
    """The region of a SigV4 request's credential scope (`Credential=AKID/20261205/eu-west-1/lambda/aws4_request`)."""
    return authorization.split("Credential=", 1)[1].split("/")[2]


@contextlib.contextmanager
def gate(upstream: str, denied: Callable[[str, str], bool]) -> Iterator[str]:
    """A loopback proxy in front of moto answering AccessDeniedException to the requests `denied(region, path)`
    picks, as Lambda answers a role that lacks the permission there, and forwarding the rest."""
    target = urlparse(upstream)

    class Gate(_Denied):
        def do_POST(self) -> None:
            path = self.path
            if denied(_region_of(self.headers.get("Authorization", "")), path):
                super().do_POST()
                return
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            conn = http.client.HTTPConnection(target.hostname, target.port, timeout=60)
            try:
                conn.request("POST", path, body=body, headers=dict(self.headers.items()))
                answer = conn.getresponse()
                data = answer.read()
            finally:
                conn.close()
            self.send_response(answer.status)
            for name, value in answer.getheaders():
                if name.lower() not in ("content-length", "connection", "transfer-encoding", "server", "date"):
                    self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    with serving(Gate) as endpoint:
        yield endpoint


def test_a_failure_part_way_records_what_was_published(moto: SQSServer, dist: Path) -> None:
    name = f"t-{uuid.uuid4().hex[:8]}"
    with gate(moto.endpoint, lambda region, path: region == "eu-west-1") as endpoint:
        done = publish("--dist", str(dist), "--regions", ",".join(REGIONS), "--public", "--layer-name", name,
                       endpoint=endpoint)
    one_line_error(done, f"eu-west-1 {name}-x86_64: AccessDeniedException: User:")
    assert "the versions above were published" in done.stderr
    document = json.loads((dist / "published.json").read_text())
    assert document["incomplete"].startswith(f"publish: eu-west-1 {name}-x86_64: AccessDeniedException")
    rows = document["layers"]
    assert [(r["region"], r["architecture"], r["grant"]) for r in rows] == [
        ("us-east-1", arch, "public") for arch in ARCHES]
    assert {f"{name}-{arch}" for arch in ARCHES} <= layer_names(moto.endpoint, "us-east-1")
    assert not {f"{name}-{arch}" for arch in ARCHES} & layer_names(moto.endpoint, "eu-west-1")
    for row in rows:
        assert row["arn"] in done.stdout


def test_a_grant_that_fails_leaves_the_version_recorded_without_it(moto: SQSServer, dist: Path) -> None:
    name = f"t-{uuid.uuid4().hex[:8]}"
    with gate(moto.endpoint, lambda region, path: path.endswith("/policy")) as endpoint:
        done = publish("--dist", str(dist), "--regions", "us-east-1", "--principal", "111122223333",
                       "--layer-name", name, endpoint=endpoint)
    one_line_error(done, f"us-east-1 {name}-x86_64: granting use of version 1: AccessDeniedException")
    rows = json.loads((dist / "published.json").read_text())["layers"]
    assert [(r["architecture"], r["version"], r["grant"]) for r in rows] == [("x86_64", 1, None)]
    versions = lambda_client(moto.endpoint, "us-east-1").list_layer_versions(LayerName=f"{name}-x86_64")
    assert [v["LayerVersionArn"] for v in versions["LayerVersions"]] == [rows[0]["arn"]]
