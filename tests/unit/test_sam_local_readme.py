"""The local-testing block (docs/local.md, the README's guide to running locally) and ./build.sh sam-local's
scenario agree, without Docker.

`./build.sh sam-local` runs that block's commands (scripts/sam_local_check.py); these tests catch a README edit
that the scenario no longer matches, and an env.json variable that SAM would silently drop, in every test run.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from cfnlint.decode import cfn_yaml

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("sam_local_check", ROOT / "scripts" / "sam_local_check.py")
sam = importlib.util.module_from_spec(_spec)
sys.modules["sam_local_check"] = sam  # dataclasses look their module up there
_spec.loader.exec_module(sam)


def _readme_block(body: str) -> str:
    return f"{sam.SECTION}\n\n```bash\n{body}```\n"


def test_every_readme_command_is_setup_or_the_next_scenario_step() -> None:
    paired = sam.plan(sam.readme_commands(ROOT / "docs" / "local.md"))
    steps = [step for _, step in paired if step is not None]
    assert steps == sam.SCENARIO
    setup = [command.text.split()[0] for command, step in paired if step is None]
    assert setup == ["export", "(cd", "until", "aws", "aws", "cat", "sam", "sam", "until"]


def test_the_block_parses_as_bash_as_pasted() -> None:
    sam.shell_syntax_ok(sam.readme_block(ROOT / "docs" / "local.md"))
    for broken in ("cat > env.json <<'JSON'\n{}\n  JSON\n", "echo 'open\n"):
        with pytest.raises(sam.CheckFailed, match="not valid bash"):
            sam.shell_syntax_ok(broken)


def test_env_json_sets_only_variables_the_functions_declare() -> None:
    # SAM drops an --env-vars value the template does not declare, and the layer would then reach real DynamoDB.
    (env,) = [c.heredoc for c in sam.readme_commands(ROOT / "docs" / "local.md") if c.heredoc]
    assert env[0] == "env.json"
    values = json.loads(env[1])["Parameters"]
    functions = {name: r["Properties"]["Environment"]["Variables"]
                 for name, r in cfn_yaml.load(str(ROOT / "template.yaml"))["Resources"].items()
                 if r["Type"] == "AWS::Serverless::Function"}
    for name, declared in functions.items():
        assert "AWS_ENDPOINT_URL_DYNAMODB" in declared and "IDEMPOTENCY_TABLE" in declared, name
    for variable in values:
        assert any(variable in declared for declared in functions.values()), variable
    assert values["AWS_ENDPOINT_URL_DYNAMODB"] == "http://host.docker.internal:8000"


def test_parser_joins_continuations_reads_heredocs_and_marks_background(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(_readme_block("# comment\naws a \\\n  b\ncat > env.json <<'JSON'\n{\"x\": 1}\nJSON\nsam x &\n"))
    commands = sam.readme_commands(readme)
    assert [c.text for c in commands] == ["aws a b", "cat > env.json <<'JSON'", "sam x"]
    assert commands[1].heredoc == ("env.json", '{"x": 1}\n')
    assert [c.background for c in commands] == [False, False, True]


@pytest.mark.parametrize("body, problem", [
    ("sam local invoke ShipmentFunction x\n", "is not the next step"),
    ("rm -rf /\n", "is not the next step"),
    ("sam build\n", "README lacks steps"),
    ("java -jar DynamoDBLocal.jar -port 8000 -disableTelemetry &\n", "lacks -sharedDb"),
    ("java -jar DynamoDBLocal.jar -sharedDb -port 8000 &\n", "lacks -disableTelemetry"),
    ("java -jar DynamoDBLocal.jar -sharedDb -port 8000 -disableTelemetry\n", "in the background"),
    ("cat > env.json <<'JSON'\n{\nJSON\n", "is not JSON"),
    ("cat > env.json <<'JSON'\n{}\n  JSON\n", "no closing JSON"),
    ("aws a \\ \n  b\n", "a space after the line continuation"),
    ("aws a &\n", "should not run in the background"),
])
def test_plan_refuses_a_block_the_scenario_does_not_match(tmp_path: Path, body: str, problem: str) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(_readme_block(body))
    with pytest.raises(sam.CheckFailed, match=problem):
        sam.plan(sam.readme_commands(readme))


def _done(stdout: str, stderr: str = "") -> subprocess.CompletedProcess:
    return subprocess.CompletedProcess([], 0, stdout, stderr)


def test_an_invocation_error_is_a_failure_even_when_sam_exits_zero() -> None:
    with pytest.raises(sam.CheckFailed, match="invocation failed"):
        sam.invoke_result(_done('{"errorType": "IdempotencyConfigError", "errorMessage": "x"}\n'))
    with pytest.raises(sam.CheckFailed, match="no result"):
        sam.invoke_result(_done(""))


def test_a_replay_that_ran_the_handler_fails() -> None:
    run = sam.Run(work=Path("."), table=None, first_order={"confirmation": "c1"})
    placement = '{"orderId": "o", "items": [], "confirmation": "c2"}\n'
    with pytest.raises(sam.CheckFailed, match="ran the handler again"):
        sam.order_replay(run, _done('{"confirmation": "c2"}\n', placement))


def test_curl_response_reads_status_headers_and_body() -> None:
    status, headers, body = sam.curl_response(
        _done("HTTP/1.1 201 CREATED\r\nIdempotent-Replayed: true\r\nContent-Type: a/b\r\n\r\n{\"k\": 1}"))
    assert (status, headers["idempotent-replayed"], body) == (201, "true", '{"k": 1}')
