"""Publish the built layer zips as Lambda layer versions, one layer per architecture, in each region asked for.

Usage: publish.py --regions us-east-1,eu-west-1 [--public | --principal ACCOUNT] [--layer-name NAME] [--dist DIR]
                  [-- VERIFY_LAYER_OPTIONS...]

`./build.sh publish` runs this with the options `./build.sh build` verifies its zips with, after `--`. Every zip
must pass scripts/verify_layer.py with them before anything is uploaded: a zip that fails is refused and nothing
is published. Then, per region and architecture: PublishLayerVersion of `dist/idempotency-layer-<arch>.zip` as
layer `<NAME>-<arch>` (one ARN per architecture, as template.yaml names them; CompatibleArchitectures that one,
CompatibleRuntimes the build's Pythons), and with `--public` or `--principal` an AddLayerVersionPermission that
lets everyone, or that account, use the version (lambda:GetLayerVersion). The ARNs are printed as a table and
written to `DIST/published.json`. Credentials, region endpoints (AWS_ENDPOINT_URL, AWS_ENDPOINT_URL_LAMBDA) and
proxies come from boto3's usual chain. Every expected failure is one line on stderr and a non-zero exit.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))  # verify_layer, run from anywhere

ARCHES = ("x86_64", "arm64")
DEFAULT_NAME = "idempotency-layer"
DEFAULT_PYTHONS = "3.10 3.11 3.12 3.13 3.14"  # verify_layer.py's default --pythons
# PublishLayerVersion's direct upload limit (Content.ZipFile); a larger zip would have to go through S3.
MAX_UPLOAD_BYTES = 50 * 1024 * 1024
# Lambda's layer name pattern, less the room the "-<arch>" suffix takes of its 140 characters.
_NAME = re.compile(r"[a-zA-Z0-9_-]{1,131}")
_REGION = re.compile(r"[a-z]{2}(-[a-z]+)+-[0-9]{1,2}")
_ACCOUNT = re.compile(r"[0-9]{12}")


class Refused(Exception):
    """An expected failure: its message is the one line printed."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, not argparse's usage block
        raise Refused(f"{message} (--help for usage)")


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The publish options and, after `--`, the verify_layer options."""
    verify: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, verify = argv[:at], argv[at + 1 :]
    ap = _Parser(prog="publish", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--regions", required=True, help="comma-separated, e.g. us-east-1,eu-west-1")
    grant = ap.add_mutually_exclusive_group()
    grant.add_argument("--public", action="store_true", help="every AWS account may use the versions")
    grant.add_argument("--principal", metavar="ACCOUNT", help="this 12-digit account id may use the versions")
    ap.add_argument("--layer-name", default=DEFAULT_NAME,
                    help=f"layers are NAME-x86_64 and NAME-arm64 ({DEFAULT_NAME})")
    ap.add_argument("--dist", type=Path, default=ROOT / "dist", help="where the zips are and published.json goes")
    args = ap.parse_args(argv)
    regions = [r.strip() for r in args.regions.split(",") if r.strip()]
    if not regions:
        raise Refused("--regions names no region (e.g. --regions us-east-1,eu-west-1)")
    for region in regions:
        if not _REGION.fullmatch(region):
            raise Refused(f"--regions: {region!r} is not a region name like us-east-1")
    args.regions = list(dict.fromkeys(regions))
    if args.principal is not None and not _ACCOUNT.fullmatch(args.principal):
        raise Refused(f"--principal {args.principal!r} is not an AWS account id (12 digits)")
    if not _NAME.fullmatch(args.layer_name):
        raise Refused(f"--layer-name {args.layer_name!r}: letters, digits, - and _ only, at most 131 characters")
    return args, verify


def runtimes(verify: list[str]) -> list[str]:
    """The runtimes the zips are built for: verify_layer's --pythons (build.sh's PYTHONS), else its default."""
    pythons = verify[verify.index("--pythons") + 1] if "--pythons" in verify[:-1] else DEFAULT_PYTHONS
    return [f"python{py}" for py in pythons.split()]


def project_version() -> str:
    text = (ROOT / "pyproject.toml").read_text()
    match = re.search(r'^version\s*=\s*"([^"]+)"', text, re.M)
    if match is None:
        raise Refused("pyproject.toml has no version")
    return match.group(1)


def shown(path: Path) -> str:
    """`path` as the user would type it: relative to the working directory when it is under it."""
    path = path.absolute()
    return str(path.relative_to(Path.cwd())) if path.is_relative_to(Path.cwd()) else str(path)


def check_zips(dist: Path, verify: list[str]) -> dict[str, bytes]:
    """Each architecture's zip, read once, after scripts/verify_layer.py passed it; refuse on the first failure."""
    import verify_layer

    zips: dict[str, bytes] = {}
    for arch in ARCHES:
        path = Path(shown(dist / f"idempotency-layer-{arch}.zip"))
        if not path.is_file():
            raise Refused(f"{path} is missing: run ./build.sh first; nothing was published")
        size = path.stat().st_size
        if size > MAX_UPLOAD_BYTES:
            raise Refused(f"{path} is {size} bytes, over the {MAX_UPLOAD_BYTES}-byte direct upload limit; "
                          "nothing was published")
        data = path.read_bytes()  # what is checked is what is uploaded
        try:
            failed = verify_layer.main([*verify, "--arch", arch, str(path)]) != 0
        except Exception as error:  # not a zip at all, say: verify_layer cannot even open it
            print(f"  FAIL: {type(error).__name__}: {error}", file=sys.stderr)
            failed = True
        if failed or path.read_bytes() != data:
            raise Refused(f"{path} does not pass scripts/verify_layer.py (above); nothing was published")
        zips[arch] = data
    return zips


def _aws_error(error: Exception) -> str:
    """One line for a boto3/botocore error: the service's code and message, or botocore's own sentence."""
    response = getattr(error, "response", None)
    if isinstance(response, dict) and "Error" in response:
        err = response["Error"]
        text = f"{err.get('Code', 'Error')}: {err.get('Message', '')}".strip().rstrip(":")
    else:
        text = f"{type(error).__name__}: {error}"
    return " ".join(text.split())  # one line, whatever the answer held


def publish(args: argparse.Namespace, zips: dict[str, bytes], compatible: list[str],
            rows: list[dict[str, object]]) -> None:
    """Publish every zip to every region, appending one row per layer version published to `rows` (so a failure
    part way leaves the caller what was published before it)."""
    import boto3
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        session = boto3.Session()
        credentials = session.get_credentials()
    except BotoCoreError as error:  # a profile that does not exist, a broken config file
        raise Refused(f"{_aws_error(error)}; nothing was published") from None
    if credentials is None:
        raise Refused("no AWS credentials found (environment, profile, SSO or instance role); nothing was published")
    version = project_version()
    grant = "*" if args.public else args.principal
    config = Config(retries={"mode": "standard", "max_attempts": 3}, connect_timeout=10, read_timeout=120)
    for region in args.regions:
        client = session.client("lambda", region_name=region, config=config)
        for arch, data in zips.items():
            name = f"{args.layer_name}-{arch}"
            try:
                published = client.publish_layer_version(
                    LayerName=name,
                    Description=f"idempotency-layer {version}: exactly-once Python handlers "
                    "(AWS_LAMBDA_EXEC_WRAPPER=/opt/idempotency-wrapper)",
                    Content={"ZipFile": data},
                    CompatibleRuntimes=compatible,
                    CompatibleArchitectures=[arch],
                    LicenseInfo="Apache-2.0",
                )
            except (ClientError, BotoCoreError) as error:
                raise Refused(f"{region} {name}: {_aws_error(error)}") from None
            row: dict[str, object] = {
                "region": region,
                "architecture": arch,
                "layer_name": name,
                "version": published["Version"],
                "arn": published["LayerVersionArn"],
                "layer_arn": published["LayerArn"],
                "compatible_runtimes": compatible,
                "code_sha256": published.get("Content", {}).get("CodeSha256"),
                "grant": None,  # set once the grant exists: a version whose grant failed is recorded without
            }
            rows.append(row)
            if grant is None:
                continue
            try:
                client.add_layer_version_permission(
                    LayerName=name,
                    VersionNumber=published["Version"],
                    StatementId="public" if grant == "*" else f"account-{grant}",
                    Action="lambda:GetLayerVersion",
                    Principal=grant,
                )
            except (ClientError, BotoCoreError) as error:
                raise Refused(f"{region} {name}: granting use of version {published['Version']}: "
                              f"{_aws_error(error)}") from None
            row["grant"] = "public" if grant == "*" else grant


def table(rows: list[dict[str, object]]) -> str:
    heads = ("region", "arch", "version", "arn")
    cells = [[str(r["region"]), str(r["architecture"]), str(r["version"]), str(r["arn"])] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(heads)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(heads, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(cell, widths, strict=True)).rstrip() for cell in cells]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    rows: list[dict[str, object]] = []
    try:
        args, verify = parse(sys.argv[1:] if argv is None else argv)
        compatible = runtimes(verify)
        zips = check_zips(args.dist, verify)
        publish(args, zips, compatible, rows)
    except Refused as why:
        if rows:  # published part way: what exists now is recorded and shown before the error
            write(args, rows, incomplete=f"publish: {why}")
        print(f"publish: {why}" + ("; the versions above were published" if rows else ""), file=sys.stderr)
        return 1
    write(args, rows)
    if not (args.public or args.principal):
        print("no grant: only this account can use these versions (--public or --principal ACCOUNT shares them)")
    return 0


def write(args: argparse.Namespace, rows: list[dict[str, object]], incomplete: str | None = None) -> None:
    """Print the table and write DIST/published.json; `incomplete`: the error that stopped the publish."""
    document: dict[str, object] = {"layer_name": args.layer_name, "package_version": project_version()}
    if incomplete is not None:
        document["incomplete"] = incomplete
    document["layers"] = rows
    out = args.dist / "published.json"
    out.write_text(json.dumps(document, indent=2) + "\n")
    print(table(rows))
    print(f"wrote {shown(out)}")


if __name__ == "__main__":
    sys.exit(main())
