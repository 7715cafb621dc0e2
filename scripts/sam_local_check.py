"""Run the "Run locally against DynamoDB Local" commands (docs/local.md, the README's local-run guide) and check what
they do (./build.sh sam-local).

Run by scripts/sam-local.sh inside its private namespaces, with its own dockerd and DynamoDB Local on port 8000,
`sam` and `aws` on PATH. The commands come from the README's code block itself, so the README cannot drift from
what is proven: setup lines (`aws`, `env.json`, `sam build`, `sam validate`) run as written; each `sam local` and
`curl` line must be the next step of the scenario below and is checked by it. `sam local` lines get
`--skip-pull-image` added (there is no registry here; the stand-in image is local). `sam local invoke` exits 0
even when the invocation failed, so every step checks output, never the exit code alone.

The examples write their side effect (one JSON line per order placed or message shipped) to the file their
`*_FILE` variable names; the README's env.json points those at /dev/stdout, so each execution shows in the
function's log. Executions are counted from those lines, never from the layer's word.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import boto3

SECTION = "## Run locally against DynamoDB Local"  # in docs/local.md, which the README links to
DOC = "docs/local.md"
INVOKE_TIMEOUT = 300  # the first invoke builds SAM's image on the stand-in
API_PORT = 3000


class CheckFailed(Exception):
    pass


def check(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


@dataclass
class Command:
    text: str  # as the README writes it, continuation lines joined
    background: bool = False
    heredoc: tuple[str, str] | None = None  # (file name, content) for `cat > FILE <<'END'`


def readme_block(readme: Path) -> str:
    """The text of the first bash block under SECTION."""
    text = readme.read_text(encoding="utf-8")
    start = text.find(SECTION)
    check(start >= 0, f"README: no section {SECTION!r}")
    block = re.search(r"```bash\n(.*?)```", text[start:], re.S)
    check(block is not None, f"README: no bash block under {SECTION!r}")
    return block.group(1)


def readme_commands(readme: Path) -> list[Command]:
    """The commands of the first bash block under SECTION, in order."""
    lines = readme_block(readme).splitlines()
    commands: list[Command] = []
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        i += 1
        if not line or line.startswith("#"):
            continue
        heredoc = re.fullmatch(r"cat > (\S+) <<'(\w+)'", line)
        if heredoc:
            body = []
            while i < len(lines) and lines[i] != heredoc.group(2):  # bash wants the terminator alone
                body.append(lines[i])
                i += 1
            check(i < len(lines), f"README: {line!r} has no closing {heredoc.group(2)}")
            i += 1
            commands.append(Command(line, heredoc=(heredoc.group(1), "\n".join(body) + "\n")))
            continue
        raw = lines[i - 1]
        while raw.endswith("\\"):
            check(i < len(lines), "README: the block ends in a line continuation")
            line = line[:-1].rstrip() + " " + lines[i].strip()
            raw = lines[i]
            i += 1
        check(not raw.rstrip().endswith("\\") or raw.endswith("\\"),
              f"README: a space after the line continuation in {raw.strip()!r}")
        background = line.endswith(" &")
        commands.append(Command(line[:-2].rstrip() if background else line, background=background))
    return commands


@dataclass
class Run:
    work: Path
    table: object
    first_order: dict | None = None
    api: subprocess.Popen | None = None
    api_log: Path | None = None
    api_log_seen: int = 0
    http: dict = field(default_factory=dict)


ENV: dict[str, str] = dict(os.environ)  # what the README's `export` lines set applies to every later command


def run(args: list[str], cwd: Path, timeout: float = INVOKE_TIMEOUT) -> subprocess.CompletedProcess:
    shown = " ".join(shlex.quote(a) for a in args)
    print(f"$ {shown}", flush=True)
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=ENV)


def shell_syntax_ok(block: str) -> None:
    """The block must parse as bash, as a user pastes it (a heredoc or a quote left open fails here)."""
    done = subprocess.run(["bash", "-n"], input=block, capture_output=True, text=True)
    # bash only warns about a heredoc left open, so a warning fails too.
    check(done.returncode == 0 and not done.stderr.strip(), f"README's block is not valid bash: {done.stderr.strip()}")


def json_lines(text: str, key: str) -> list[dict]:
    """Lines of text that are JSON objects holding key: the examples' side-effect lines."""
    found = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict) and key in value:
                found.append(value)
    return found


def invoke_result(done: subprocess.CompletedProcess) -> dict:
    """The function's answer: sam prints it as the last line of stdout."""
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    check(bool(lines), f"sam local invoke printed no result (exit {done.returncode}):\n{done.stderr[-3000:]}")
    try:
        result = json.loads(lines[-1])
    except ValueError as error:
        raise CheckFailed(f"sam local invoke's result is not JSON: {lines[-1][:200]!r}") from error
    check(isinstance(result, dict) and "errorType" not in result,
          f"the invocation failed: {lines[-1][:500]}\n{done.stderr[-3000:]}")
    return result


def records(run_: Run) -> list[dict]:
    return run_.table.scan(ConsistentRead=True)["Items"]


# --- scenario steps: each checks one README command's effect ------------------------------------------

def order_first(run_: Run, done: subprocess.CompletedProcess) -> None:
    result = invoke_result(done)
    placed = json_lines(done.stderr, "confirmation")
    check(len(placed) == 1, f"the first order invoke should place one order, it printed {len(placed)}")
    check(result.get("confirmation") == placed[0]["confirmation"], "the answer is not the order just placed")
    items = records(run_)
    check(len(items) == 1 and items[0]["status"] == "COMPLETED",
          f"after the first order: expected one COMPLETED record, the table holds {len(items)}")
    run_.first_order = result
    print(f"    order placed once, confirmation {result['confirmation']}; table: 1 record COMPLETED")


def order_replay(run_: Run, done: subprocess.CompletedProcess) -> None:
    result = invoke_result(done)
    placed = json_lines(done.stderr, "confirmation")
    check(not placed, f"the second order invoke ran the handler again ({len(placed)} placements)")
    check(result == run_.first_order, "the second answer differs from the first one's")
    items = records(run_)
    check(len(items) == 1, f"the replay changed the table: {len(items)} records")
    print("    replayed: same answer, same confirmation, handler not run, still 1 record")


def shipments_first(run_: Run, done: subprocess.CompletedProcess) -> None:
    result = invoke_result(done)
    shipped = json_lines(done.stderr, "parcel")
    check(result == {"batchItemFailures": []}, f"the batch reported failures: {result}")
    check(sorted(s["orderId"] for s in shipped) == ["A-1", "A-2", "A-3"],
          f"expected the 3 messages shipped once each, saw {len(shipped)} shipments")
    check(len(records(run_)) == 4, "expected one record per message beside the order's")
    print("    batch of 3: each message shipped once; table: 3 more records")


def shipments_redelivered(run_: Run, done: subprocess.CompletedProcess) -> None:
    result = invoke_result(done)
    shipped = json_lines(done.stderr, "parcel")
    check(result == {"batchItemFailures": []}, f"the redelivered batch reported failures: {result}")
    check(not shipped, f"the redelivered batch shipped {len(shipped)} messages again")
    print("    redelivered batch: nothing shipped again, no failures reported")


def api_start(run_: Run, command: Command) -> None:
    run_.api_log = run_.work / "start-api.log"
    args = [*shlex.split(command.text), "--skip-pull-image"]
    print(f"$ {' '.join(shlex.quote(a) for a in args)} &", flush=True)
    with open(run_.api_log, "w") as log:
        run_.api = subprocess.Popen(args, cwd=run_.work, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True, env=ENV)
    deadline = time.monotonic() + 120
    while True:
        check(run_.api.poll() is None, f"sam local start-api exited:\n{run_.api_log.read_text()[-3000:]}")
        try:
            socket.create_connection(("127.0.0.1", API_PORT), timeout=1).close()
            return
        except OSError:
            check(time.monotonic() < deadline, "sam local start-api did not listen within 120 s")
            time.sleep(0.2)


def api_invocation_log(run_: Run) -> str:
    """start-api's log of the next invocation: sam writes the container's output after the response, so wait
    (with a deadline) for the REPORT line that ends it. Every request is one invocation, replays included."""
    deadline = time.monotonic() + 30
    while True:
        text = run_.api_log.read_text(errors="replace")
        end = text.find("REPORT RequestId", run_.api_log_seen)
        if end >= 0:
            end = text.find("\n", end) + 1 or len(text)
            new, run_.api_log_seen = text[run_.api_log_seen:end], end
            return new
        check(time.monotonic() < deadline, "start-api logged no finished invocation within 30 s")
        time.sleep(0.1)


def api_placements(run_: Run) -> list[dict]:
    """Orders placed by the last request: the API handler's side-effect lines in its invocation's log."""
    return [line for line in json_lines(api_invocation_log(run_), "orderId") if line.get("status") == "placed"]


def curl_response(done: subprocess.CompletedProcess) -> tuple[int, dict[str, str], str]:
    check(done.returncode == 0, f"curl failed ({done.returncode}): {done.stderr[-500:]}")
    head, _, body = done.stdout.replace("\r\n", "\n").partition("\n\n")
    status_line, *header_lines = head.splitlines() or [""]
    check(status_line.startswith("HTTP/"), "curl printed no status line: the README's curl needs -i")
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(status_line.split()[1]), headers, body


def http_first(run_: Run, done: subprocess.CompletedProcess) -> None:
    status, headers, body = curl_response(done)
    placed = api_placements(run_)
    check(status == 201, f"the first POST /orders answered {status}: {body[:300]}")
    check("idempotent-replayed" not in headers, "the first response is marked as a replay")
    check(len(placed) == 1 and json.loads(body) == placed[0], f"expected one order placed, saw {len(placed)}")
    run_.http["first"] = body
    print(f"    201, order {placed[0]['orderId']} placed once")


def http_replay(run_: Run, done: subprocess.CompletedProcess) -> None:
    status, headers, body = curl_response(done)
    placed = api_placements(run_)
    check(status == 201 and body == run_.http["first"], f"the retry did not replay the first response: {status}")
    check(headers.get("idempotent-replayed") == "true", "the replay lacks Idempotent-Replayed: true")
    check(not placed, f"the retry placed {len(placed)} more orders")
    print("    201 replayed with Idempotent-Replayed: true, same body, nothing placed")


def http_mismatch(run_: Run, done: subprocess.CompletedProcess) -> None:
    status, headers, _ = curl_response(done)
    placed = api_placements(run_)
    check(status == 422, f"the same key with another body answered {status}, not 422")
    check(headers.get("content-type", "").startswith("application/problem+json"), "the 422 is not problem+json")
    check(not placed, f"the mismatched request placed {len(placed)} orders")
    print("    422 problem+json for the same key with another body, nothing placed")


@dataclass
class Step:
    pattern: str
    check: Callable


SCENARIO = [
    Step(r"sam local invoke OrderFunction ", order_first),
    Step(r"sam local invoke OrderFunction ", order_replay),
    Step(r"sam local invoke ShipmentFunction ", shipments_first),
    Step(r"sam local invoke ShipmentFunction ", shipments_redelivered),
    Step(r"sam local start-api ", api_start),
    Step(r"curl .*Idempotency-Key", http_first),
    Step(r"curl .*Idempotency-Key", http_replay),
    Step(r"curl .*Idempotency-Key", http_mismatch),
]


def plan(commands: list[Command]) -> list[tuple[Command, Step | None]]:
    """Pair each README command with its scenario step (None for setup); refuse unknown, missing or misordered
    commands, so the README and this check cannot drift apart."""
    steps = list(SCENARIO)
    paired: list[tuple[Command, Step | None]] = []
    for command in commands:
        text = command.text
        if command.heredoc:
            name, content = command.heredoc
            try:
                json.loads(content)
            except ValueError as error:
                raise CheckFailed(f"README's {name} is not JSON: {error}") from error
            paired.append((command, None))
        elif "DynamoDBLocal.jar" in text:
            # scripts/sam-local.sh starts DynamoDB Local itself (the jar lives in the test cache), with these
            # same settings, so the README's line is checked for them rather than run.
            for flag in ("-sharedDb", "-port 8000", "-disableTelemetry"):
                check(flag in text, f"README's DynamoDB Local line lacks {flag}")
            check(command.background, "README's DynamoDB Local line should run in the background (&)")
            paired.append((command, None))
        elif text.startswith(("export ", "until ", "aws ", "sam build", "sam validate")):
            check(not command.background, f"README command {text!r} should not run in the background")
            paired.append((command, None))
        else:
            check(bool(steps), f"README command the check does not know: {text!r}")
            step = steps.pop(0)
            check(re.match(step.pattern, text) is not None,
                  f"README command {text!r} is not the next step ({step.check.__name__})")
            check(command.background == (step.check is api_start),
                  f"README command {text!r}: only start-api runs in the background (&)")
            paired.append((command, step))
    check(not steps, f"README lacks steps: {', '.join(s.check.__name__ for s in steps)}")
    return paired


def stop_api(run_: Run) -> None:
    if run_.api and run_.api.poll() is None:
        # SIGINT is sam's own way to stop: it removes its containers.
        run_.api.send_signal(signal.SIGINT)
        try:
            run_.api.wait(timeout=60)
        except subprocess.TimeoutExpired:
            run_.api.kill()
            run_.api.wait()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repo", type=Path, required=True)
    parser.add_argument("--work", type=Path, required=True)
    options = parser.parse_args()
    repo, work = options.repo, options.work

    # A scratch copy holds what `sam build` reads, so .aws-sam/ and env.json never land in the checkout.
    work.mkdir(parents=True)
    shutil.copy2(repo / "template.yaml", work / "template.yaml")
    shutil.copytree(repo / "examples", work / "examples", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(repo / "dist", work / "dist")

    # The check's own reads of the table; -sharedDb takes any credentials.
    table = boto3.resource("dynamodb", endpoint_url="http://127.0.0.1:8000", region_name="us-east-1",
                           aws_access_key_id="check", aws_secret_access_key="check").Table("idempotency")
    state = Run(work=work, table=table)
    try:
        shell_syntax_ok(readme_block(repo / DOC))
        for command, step in plan(readme_commands(repo / DOC)):
            text = command.text
            if command.heredoc:
                name, content = command.heredoc
                (work / name).write_text(content, encoding="utf-8")
                print(f"$ {text} (written)")
            elif "DynamoDBLocal.jar" in text:
                continue  # scripts/sam-local.sh started it (plan() checked its settings)
            elif text.startswith("export "):
                print(f"$ {text}")
                for assignment in shlex.split(text)[1:]:
                    name, _, value = assignment.partition("=")
                    ENV[name] = value
            elif text.startswith("until "):
                done = run(["bash", "-c", text], work, timeout=120)
                check(done.returncode == 0, f"{text!r} did not end within 120 s")
            elif step is None:
                done = run(shlex.split(text), work)
                check(done.returncode == 0, f"{text!r} failed ({done.returncode}):\n{done.stdout[-2000:]}"
                      f"\n{done.stderr[-2000:]}")
            elif step.check is api_start:
                api_start(state, command)
            else:
                args = shlex.split(text)
                if args[:2] == ["sam", "local"]:
                    args.append("--skip-pull-image")
                step.check(state, run(args, work))
    except CheckFailed as failure:
        print(f"sam-local: FAILED: {failure}", file=sys.stderr)
        if state.api_log and state.api_log.exists():
            print(f"--- start-api log (tail) ---\n{state.api_log.read_text()[-3000:]}", file=sys.stderr)
        return 1
    finally:
        stop_api(state)
    print("sam-local: the README's SAM commands ran and every replay held")
    return 0


if __name__ == "__main__":
    sys.exit(main())
