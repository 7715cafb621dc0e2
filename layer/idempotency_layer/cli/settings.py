"""The CLI's settings: the layer's own environment variables, validated by `config.load` exactly as at init,
with command-line options taking precedence. The handler setting is not needed to derive keys or read records,
so a placeholder stands in for it when it is unset: the CLI never loads a handler."""

from __future__ import annotations

import os

from .. import config as _config
from ..errors import IdempotencyConfigurationError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from argparse import ArgumentParser, Namespace
    from collections.abc import Mapping
    from typing import Any

PLACEHOLDER_HANDLER = "idempotency-cli.placeholder"
PLACEHOLDER_TABLE = "unset-table"  # `key` needs no table; every other command requires one
PLACEHOLDER_VALKEY = "redis://unset-valkey-url.invalid"  # ... nor a Valkey server
PLACEHOLDER_PREFIX = "idempotency-cli-placeholder"  # `show KEY`, `purge KEY`: the key carries its prefix

# option -> the environment variable it sets
OPTIONS = (
    ("--table", "IDEMPOTENCY_TABLE", "the table's name or ARN"),
    ("--key-prefix", "IDEMPOTENCY_KEY_PREFIX", "the key prefix (default: the function name)"),
    ("--function-name", "AWS_LAMBDA_FUNCTION_NAME", "the function's name, the default key prefix"),
    ("--key-jmespath", "IDEMPOTENCY_KEY_JMESPATH", "the key expression"),
    ("--payload-jmespath", "IDEMPOTENCY_PAYLOAD_JMESPATH", "the payload fingerprint expression"),
    ("--scope", "IDEMPOTENCY_SCOPE", "auto, event or record"),
    ("--http", "IDEMPOTENCY_HTTP", "auto or off"),
    ("--key-header", "IDEMPOTENCY_KEY_HEADER", "the HTTP key header"),
    ("--caller-headers", "IDEMPOTENCY_CALLER_HEADERS", "headers that name an HTTP caller"),
    ("--require-key", "IDEMPOTENCY_REQUIRE_KEY", "true or false"),
    ("--key-attr", "IDEMPOTENCY_KEY_ATTR", "the table's partition key attribute"),
    ("--sort-key-attr", "IDEMPOTENCY_SORT_KEY_ATTR", "the table's sort key attribute, when the key goes there"),
    ("--partition-value", "IDEMPOTENCY_PARTITION_VALUE", "the static partition key value with a sort key"),
    ("--transport", "IDEMPOTENCY_TRANSPORT", "lean or boto3"),
    ("--endpoint-url", "AWS_ENDPOINT_URL_DYNAMODB", "DynamoDB's endpoint"),
    ("--store", "IDEMPOTENCY_STORE", "dynamodb or valkey"),
    ("--valkey-url", "IDEMPOTENCY_VALKEY_URL", "the Valkey server, rediss://[user:password@]host[:port][/db]"),
)


def add_options(parser: ArgumentParser) -> None:
    group = parser.add_argument_group("settings (each overrides the environment variable it names)")
    for flag, variable, what in OPTIONS:
        group.add_argument(flag, metavar="VALUE", help=f"{what} [{variable}]")
    group.add_argument("--region", metavar="REGION", help="the AWS Region [AWS_REGION]")
    group.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                       help="any other IDEMPOTENCY_* setting, e.g. --set IDEMPOTENCY_STATUS_ATTR=state")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of text")


def environment(args: Namespace, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment the layer would see: `base` (os.environ) with the options applied."""
    env = dict(os.environ if base is None else base)
    for item in args.set:
        name, equals, value = item.partition("=")
        if not equals or not name.upper().startswith("IDEMPOTENCY_"):  # a wrong case is init's to name
            raise IdempotencyConfigurationError(f"--set {name + equals + '...'!r} is not accepted; expected "
                                                "IDEMPOTENCY_<NAME>=<value>")
        env[name] = value
    for flag, variable, _ in OPTIONS:
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is not None:
            env[variable] = value
    if args.region:
        env["AWS_REGION"] = env["AWS_DEFAULT_REGION"] = args.region
    return env


def load(env: dict[str, str], need_table: bool = True, need_prefix: bool = True) -> _config.Config:
    """The layer's configuration from `env`; raises IdempotencyConfigurationError with init's message (and, for
    a missing key prefix, the options that give one). `need_prefix`: False for a command given a whole key."""
    env = dict(env)
    named = any((env.get(name) or "").strip() for name in ("IDEMPOTENCY_KEY_PREFIX", "AWS_LAMBDA_FUNCTION_NAME"))
    # A stored key carries its prefix; but under a sort key the partition value derives from it, unless set.
    derived = (env.get("IDEMPOTENCY_SORT_KEY_ATTR") or "").strip() and not (
        env.get("IDEMPOTENCY_PARTITION_VALUE") or "").strip()
    if not named and not need_prefix and not derived:
        env["IDEMPOTENCY_KEY_PREFIX"] = PLACEHOLDER_PREFIX
    if not (env.get("IDEMPOTENCY_ORIGINAL_HANDLER") or "").strip():
        env["IDEMPOTENCY_ORIGINAL_HANDLER"] = PLACEHOLDER_HANDLER
    valkey = (env.get("IDEMPOTENCY_STORE") or "").strip().lower() == "valkey"
    if not need_table and not valkey and not (env.get("IDEMPOTENCY_TABLE") or "").strip():
        env["IDEMPOTENCY_TABLE"] = PLACEHOLDER_TABLE
    if not need_table and valkey and not (env.get("IDEMPOTENCY_VALKEY_URL") or "").strip():
        env["IDEMPOTENCY_VALKEY_URL"] = PLACEHOLDER_VALKEY  # `key` reads no record
    try:
        return _config.load(env)
    except IdempotencyConfigurationError as error:
        if not named and str(error).startswith("IDEMPOTENCY_KEY_PREFIX is not set"):
            raise IdempotencyConfigurationError(f"{error} (here: --function-name NAME, or --key-prefix)") from None
        raise


def transport(config: _config.Config, env: Mapping[str, str]) -> Any:
    """The layer's own DynamoDB client for `config`, its target (Region, endpoint, credentials) from `env`."""
    from ..stores import open_transport

    # The client reads its target from the process environment: the options' values must be there.
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL_DYNAMODB"):
        if env.get(name):
            os.environ[name] = env[name]
    return open_transport(config)


def store(config: _config.Config, env: Mapping[str, str]) -> Any:
    """The store `config` names, opened as the function opens it (`stores.open_store`)."""
    from ..stores import open_store

    return open_store(config, None if config.store == "valkey" else transport(config, env))


def bucket(config: _config.Config) -> Any:
    """The large-results bucket the function writes (IDEMPOTENCY_LARGE_RESULTS_BUCKET), or None."""
    from ..stores import open_bucket

    return open_bucket(config)


def client_problem(error: BaseException, env: Mapping[str, str]) -> str | None:
    """The one-line fix for a DynamoDB client that could not be set up because of a setting (exit 2), or None."""
    if isinstance(error, ModuleNotFoundError):
        return missing_module(error)
    if type(error).__name__ == "NoRegionError":  # botocore's, named so that nothing imports botocore for it
        return "no AWS Region is set: set AWS_REGION, or pass --region"
    if type(error).__name__ == "InvalidRegionError":
        return (f"the Region {env.get('AWS_REGION') or env.get('AWS_DEFAULT_REGION') or ''!r} is not a Region "
                "name: set AWS_REGION (or --region) to one, e.g. eu-west-1")
    if isinstance(error, ValueError) and str(error).startswith(("Invalid endpoint", "the endpoint must be")):
        endpoint = env.get("AWS_ENDPOINT_URL_DYNAMODB") or env.get("AWS_ENDPOINT_URL") or ""
        return (f"the DynamoDB endpoint {endpoint!r} is not an http:// or https:// URL: give it with its scheme "
                "(--endpoint-url http://localhost:8000, https://dynamodb.eu-west-1.amazonaws.com)")
    if isinstance(error, ValueError) and str(error).startswith("the endpoint URL"):
        return f"the DynamoDB endpoint: {error}"
    return None


def missing_module(error: ModuleNotFoundError) -> str:
    """The one-line fix for a module the CLI needs and cannot import."""
    name = error.name or "?"
    if name.split(".")[0] == "jmespath":
        return ("the module 'jmespath' is missing: install it (pip install jmespath; boto3 brings it), or run the "
                "CLI where boto3 is installed")
    if name.split(".")[0] in ("boto3", "botocore"):
        return (f"the module {name.split('.')[0]!r} is missing: outside Lambda the CLI finds its Region, endpoint "
                "and credentials with botocore; pip install boto3")
    if name.split(".")[0] == "orjson":
        return ("the module 'orjson' is missing: from an unzipped layer, put opt/python/lib/python3.X/site-packages "
                "on PYTHONPATH with the python3.X it was built for (3.10 to 3.14), or pip install orjson")
    return f"the module {name!r} is missing: install it, or put the package that holds it on PYTHONPATH"
