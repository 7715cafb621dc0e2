"""./build.sh invoke: your own function under the built layer, locally, in one command (issue 29).

    ./build.sh invoke --code DIR --handler MODULE.FUNCTION --event FILE [--event FILE2 ...] [--times N]
                      [--env NAME=VALUE ...]

Runs the code in DIR (copied, as Lambda unpacks a zip into /var/task) under AWS's Runtime Interface Emulator and
`awslambdaric`, with the layer built in dist/ attached through AWS_LAMBDA_EXEC_WRAPPER, against a table in
DynamoDB Local; sends each event, in order, N times (default 2) to one execution environment (so retries that
differ, a timestamp say, are events of their own) and prints, for each, the answer, what the function wrote and
the layer's line about the invocation (first run, replay, ...); then each event's record as `idempotency-layer
show` prints it. No Docker, no SAM CLI, no AWS account. Ports are chosen free; everything it starts is stopped
when it ends, Ctrl-C included. Exit 0 when every invocation succeeded, 1 when one failed (its error is printed) or
the environment could not run, 2 for a bad option or event file, 130 when interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "layer")]

from tests.support import downloads  # noqa: E402 (needs the repository root on the path)
from tests.support.dynamodb_local import DynamoDBLocal, create_table  # noqa: E402
from tests.support.rie import LambdaEnvironment, ensure_layer, layer_is_stale, unpack_layer  # noqa: E402

TABLE = "idempotency-local"
FUNCTION = "local-function"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local", "AWS_REGION": "us-east-1"}
# What the emulator writes of its own, not the function's.
_EMULATOR = ("START RequestId:", "END RequestId:", "REPORT RequestId:", "(rapid)", "--- starting RIE")


class Usage(Exception):
    """A bad option or event file (exit 2)."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="./build.sh invoke", description=__doc__.split("\n\n")[0])
    parser.add_argument("--code", required=True, help="the directory holding your function's code (its zip's "
                        "contents: modules and vendored packages)")
    parser.add_argument("--handler", required=True, help="MODULE.FUNCTION, as the function's Handler setting")
    parser.add_argument("--event", required=True, action="append", help="a file holding the event as JSON; "
                        "repeatable: the events are sent in order, each --times times")
    parser.add_argument("--times", type=int, default=2, help="how many times to send it (default 2)")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="a variable of the function (IDEMPOTENCY_* settings, your own); repeatable")
    parser.add_argument("--python", help="the runtime's Python version, e.g. 3.12 (default: 3.12 if found)")
    parser.add_argument("--timeout", type=int, default=30, help="the function's timeout in seconds (default 30)")
    return parser


def _settings(args: argparse.Namespace) -> dict[str, str]:
    code = Path(args.code)
    if not code.is_dir():
        raise Usage(f"--code {args.code!r} is not a directory")
    module, dot, function = args.handler.rpartition(".")
    if not dot or not module or not function:
        raise Usage(f"--handler {args.handler!r} is not MODULE.FUNCTION")
    for event in args.event:
        try:
            json.loads(Path(event).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as error:
            raise Usage(f"--event {event!r} cannot be read as JSON: {error}") from None
    if not 1 <= args.times <= 100:
        raise Usage(f"--times {args.times} is not from 1 to 100")
    if not 1 <= args.timeout <= 900:
        raise Usage(f"--timeout {args.timeout} is not from 1 to 900 seconds (Lambda's range)")
    variables = {}
    for item in args.env:
        name, equals, value = item.partition("=")
        if not equals or not name:
            raise Usage(f"--env {item!r} is not NAME=VALUE")
        variables[name] = value
    return variables


def _python(wanted: str | None) -> tuple[str, Path]:
    found = downloads.runtimes()
    if wanted is not None:
        if wanted not in found:
            raise Usage(f"--python {wanted}: no such Python here (found {', '.join(sorted(found))})")
        return wanted, found[wanted]
    version = "3.12" if "3.12" in found else max(found, key=lambda v: tuple(map(int, v.split("."))))
    return version, found[version]


def _split(new: str) -> tuple[list[str], list[dict[str, Any]]]:
    """The handler's own lines and the layer's JSON lines among what the runtime wrote for one invocation."""
    own, layer = [], []
    for line in new.splitlines():
        if not line.strip() or any(mark in line for mark in _EMULATOR):
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            entry = None
        if isinstance(entry, dict) and entry.get("logger") == "idempotency_layer":
            layer.append(entry)
        else:
            own.append(line)
    return own, layer


def _printable(text: str) -> str:
    """`text` with control characters shown as escapes: a handler's bytes never drive the terminal."""
    return "".join(c if c.isprintable() or c == "\t" else f"\\x{ord(c):02x}" for c in text)


def _say_answer(label: str, answer: Any, new_logs: str) -> bool:
    """Print one invocation; whether it succeeded."""
    body = answer.body.decode("utf-8", "replace")
    failed = answer.status != 200 or answer.error_type is not None  # Lambda's error shape
    print(f"\n{label}: HTTP {answer.status} from the emulator{', the function failed' if failed else ''}")
    shown = body if len(body) <= 2000 else body[:2000] + f"... ({len(body)} characters)"
    print(f"  answer: {_printable(shown)}")
    own, layer = _split(new_logs)
    print("  the function wrote:" if own else "  the function wrote nothing")
    for line in own:
        print(f"    {_printable(line)}")
    for entry in layer:
        outcome = entry.get("idempotency_outcome")
        print(f"  layer: {entry.get('level')} {entry.get('message')}" + (f" [{outcome}]" if outcome else ""))
    if not layer:
        print("  layer: no line" + ("" if failed else " (IDEMPOTENCY_LOG_LEVEL=DEBUG says more)"))
    return not failed


def _valkey(variables: dict[str, str]) -> bool:
    return variables.get("IDEMPOTENCY_STORE", "").strip().lower() == "valkey"


def _store_env(variables: dict[str, str], endpoint: str) -> dict[str, str]:
    """Where the records go: the DynamoDB Local table, unless the function's settings choose the Valkey store."""
    if _valkey(variables):
        return {**CREDENTIALS}
    return {**CREDENTIALS, "IDEMPOTENCY_TABLE": TABLE, "AWS_ENDPOINT_URL_DYNAMODB": endpoint}


def _show(events: list[str], variables: dict[str, str], endpoint: str) -> None:
    """The record(s) of the event's key(s), as the operator CLI's `show` prints them, with the function's settings."""
    from idempotency_layer.cli import main as cli

    saved = dict(os.environ)
    try:
        # The function's own settings win, as they did for the function (a table or endpoint of its own included).
        os.environ.update({**_store_env(variables, endpoint), "AWS_LAMBDA_FUNCTION_NAME": FUNCTION, **variables})
        for event in dict.fromkeys(events):
            print(f"\nthe record, as `idempotency-layer show --event {event}` prints it:")
            sys.stdout.flush()
            cli(["show", "--event", event])
            sys.stdout.flush()
    finally:
        os.environ.clear()
        os.environ.update(saved)


def run(args: argparse.Namespace) -> int:
    variables = _settings(args)
    if layer_is_stale(ROOT):
        print("building the layer (./build.sh build): its sources are newer than the zip", flush=True)
    try:
        zip_path = ensure_layer(ROOT)
    except RuntimeError as error:
        print(f"./build.sh invoke: {error}", file=sys.stderr)
        return 1
    version, python = _python(args.python)
    work = Path(tempfile.mkdtemp(prefix="idempotency-invoke-"))
    print(f"logs and the copied code: {work}")
    task, opt = work / "task", work / "opt"
    shutil.copytree(args.code, task, ignore=shutil.ignore_patterns("__pycache__", ".git"))
    unpack_layer(zip_path, opt)
    ddb, env, server = DynamoDBLocal(work / "dynamodb.log"), None, None
    try:
        if _valkey(variables) and not variables.get("IDEMPOTENCY_VALKEY_URL", "").strip():
            from tests.support.valkey_server import Server

            server = Server("valkey9").start()  # IDEMPOTENCY_STORE=valkey without a URL: a local server
            variables["IDEMPOTENCY_VALKEY_URL"] = server.url
            print(f"Valkey at {server.url} (pid {server.process.pid if server.process else '?'})")
        if not _valkey(variables):
            ddb.start()
            print(f"DynamoDB Local at {ddb.endpoint} (pid {ddb.process.pid if ddb.process else '?'}), table {TABLE}")
            _table(ddb.endpoint)
        function_env = {**_store_env(variables, ddb.endpoint), "IDEMPOTENCY_LOG_LEVEL": "INFO",
                        "AWS_LAMBDA_LOG_FORMAT": "JSON", **variables}
        env = LambdaEnvironment(python=python, task_root=task, opt_dir=opt, handler=args.handler,
                                env=function_env, timeout=args.timeout, function_name=FUNCTION,
                                log_path=work / "function.log")
        env.start()  # `env` is set first: an interrupt during the start still stops what it started
        print(f"the emulator at {env.endpoint} (pid {env.process.pid if env.process else '?'}), Python {version}, "
              f"handler {args.handler}, the layer {zip_path.relative_to(ROOT)} as /opt")
        sys.stdout.flush()
        succeeded = True
        for path in args.event:
            event = Path(path).read_bytes()
            for n in range(1, args.times + 1):
                seen = len(env.logs())
                answer = env.invoke(event)
                label = f"{path}, invocation {n} of {args.times}"
                succeeded = _say_answer(label, answer, env.logs()[seen:]) and succeeded
                sys.stdout.flush()
        _show(args.event, {**variables, "IDEMPOTENCY_LOG_LEVEL": "WARNING"}, ddb.endpoint)
        return 0 if succeeded else 1
    finally:
        if env is not None:
            env.stop()
        ddb.stop()
        if server is not None:
            server.close()


def _table(endpoint: str) -> None:
    import boto3

    client = boto3.client("dynamodb", endpoint_url=endpoint, region_name=CREDENTIALS["AWS_REGION"],
                          aws_access_key_id="local", aws_secret_access_key="local")
    create_table(client, TABLE)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # Ctrl-C and SIGTERM interrupt, so the finally clauses stop what was started: SIGINT's handler is set even when
    # it was inherited ignored (a background job of a non-interactive shell, as CI starts it), which Python keeps.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        return run(args)
    except Usage as error:
        print(f"./build.sh invoke: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\n./build.sh invoke: interrupted; everything it started is stopped", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
