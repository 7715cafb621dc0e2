"""The wheel's container path end to end: `./build.sh wheel`, `pip install` of the wheel and awslambdaric into a
fresh venv, then `idempotency-wrapper python -m awslambdaric app.handler` (the README's ENTRYPOINT and CMD) under
the Runtime Interface Emulator against DynamoDB Local; and the AWS base image's way, the runtime's bootstrap
running the pip-installed wrapper named by AWS_LAMBDA_EXEC_WRAPPER.

The venv has nothing but what the wheel and awslambdaric bring: no boto3, botocore or layer zip, and no
PYTHONPATH, so a run proves the wheel carries everything the layer needs (jmespath for the key expression, orjson
for results). pip installs offline from build.sh's wheel cache, fetching into it only what it lacks; the venv is
made once per session.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import CREDENTIALS
from tests.e2e.conftest import PRIMARY, Executions, get_record, marker, record_id
from tests.support import downloads
from tests.support.dynamodb_local import create_table
from tests.support.rie import LambdaEnvironment

ROOT = Path(__file__).resolve().parents[2]
WRAPPER = ROOT / "wrapper" / "idempotency-wrapper"
# build.sh's WHEEL_CACHE, so both fill and reuse one cache.
WHEEL_CACHE = Path(
    os.environ.get("IDEMLAYER_WHEEL_CACHE")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "idempotency-layer" / "wheels"
)
FUNCTION = "wheel-e2e"


def _run(*args: str | Path, **options: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=600, **options)


@pytest.fixture(scope="session")
def wheel() -> Path:
    """`./build.sh wheel`, run by the test itself (`./build.sh test` builds only the zips): the wheel it made."""
    with downloads._locked("build"):  # two test runs at once do not build into one dist/ together
        done = _run("bash", ROOT / "build.sh", "wheel", cwd=ROOT)
    assert done.returncode == 0, f"./build.sh wheel failed:\n{done.stdout}\n{done.stderr}"
    built = done.stdout.strip().splitlines()[-1].split(":")[0]  # "dist/<name>.whl: N files, ...: OK"
    assert built.endswith(".whl") and done.stdout.strip().endswith(": OK"), done.stdout
    return ROOT / built


def _pip_install(python: Path, *requirements: str | Path) -> None:
    """Install offline from WHEEL_CACHE; on a miss, download into it (binary wheels only) and install again."""
    offline = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-index",
               "--find-links", WHEEL_CACHE, *requirements]
    if _run(*offline).returncode == 0:
        return
    WHEEL_CACHE.mkdir(parents=True, exist_ok=True)
    fetched = _run(python, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--only-binary=:all:",
                   "--dest", WHEEL_CACHE, *requirements)
    assert fetched.returncode == 0, fetched.stderr
    for requirement in requirements:  # pip download copies a wheel given as a file into the cache: not ours to keep
        if isinstance(requirement, Path):
            (WHEEL_CACHE / requirement.name).unlink(missing_ok=True)
    done = _run(*offline)
    assert done.returncode == 0, done.stderr


@pytest.fixture(scope="session")
def image_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv standing in for the image: the wheel and awslambdaric, pip-installed, and nothing else."""
    interpreters = downloads.interpreters()
    if PRIMARY not in interpreters:
        pytest.skip(f"no Python {PRIMARY} found")
    venv = tmp_path_factory.mktemp("image") / "venv"
    made = _run(interpreters[PRIMARY], "-m", "venv", venv)
    assert made.returncode == 0, made.stderr
    _pip_install(venv / "bin" / "python", wheel, "awslambdaric")
    return venv


class WheelImage(LambdaEnvironment):
    """RIE in front of the image's ENTRYPOINT + CMD exactly as the README's Dockerfile writes them: bare names,
    found on PATH (the venv's bin first, as pip puts console scripts in an image's PATH)."""

    def command(self, api_port: int) -> list[str]:
        return [str(downloads.rie()), "--runtime-interface-emulator-address", f"127.0.0.1:{self.port}",
                "--runtime-api-address", f"127.0.0.1:{api_port}",
                "idempotency-wrapper", "python", "-m", "awslambdaric", self.handler]

    def environment(self, api_port: int) -> dict[str, str]:
        env = super().environment(api_port)
        env.pop("PYTHONPATH", None)  # the wheel's files only: no layer folders on the path
        return env


@pytest.fixture(scope="session")
def wheel_table(ddb_client: Any) -> Iterator[str]:
    name = create_table(ddb_client, f"idempotency-wheel-{uuid.uuid4().hex[:8]}")
    yield name
    ddb_client.delete_table(TableName=name)


@pytest.fixture(scope="session")
def image(image_venv: Path, task_root: Path, executions: Executions, dynamodb: Any, wheel_table: str,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[LambdaEnvironment]:
    env = {
        **CREDENTIALS,
        "PATH": f"{image_venv / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "AWS_ENDPOINT_URL_DYNAMODB": dynamodb.endpoint,
        "IDEMPOTENCY_TABLE": wheel_table,
        "IDEMPOTENCY_KEY_JMESPATH": "marker",  # jmespath: a dependency of the wheel, as nothing else brings it
        "EXECUTIONS_FILE": str(executions.path),
    }
    lambda_env = WheelImage(image_venv / "bin" / "python", task_root, version=PRIMARY, env=env, wrapper=False,
                            image=True, function_name=FUNCTION,
                            log_path=tmp_path_factory.mktemp("wheel-logs") / "rie.log")
    with lambda_env:
        yield lambda_env


def test_wheel_installs_the_wrapper_unchanged_and_both_scripts(image_venv: Path) -> None:
    bin_dir = image_venv / "bin"
    installed = bin_dir / "idempotency-wrapper"
    # A data script: the bash file itself (pip leaves a #!/bin/bash line alone), no Python start-up in front.
    assert installed.read_bytes() == WRAPPER.read_bytes()
    assert os.access(installed, os.X_OK)
    assert (bin_dir / "idempotency-layer").is_file()  # the CLI's console script (its module is another part's)


def test_the_venv_holds_no_botocore_and_https_needs_none(image_venv: Path) -> None:
    # What the image resolves for real DynamoDB over TLS: the lean path (no botocore), certifi's bundle, which
    # the wheel ships a certificate directory for when certifi is the build's pinned version.
    code = (
        "import importlib.util, os\n"
        "from idempotency_layer.aws import trust\n"
        "from idempotency_layer.stores.dynamodb import environment\n"
        "assert importlib.util.find_spec('botocore') is None, 'botocore installed'\n"
        "target = environment.plain_lambda(os.environ)\n"
        "assert target is not None, 'not the plain Lambda case'\n"
        "print(target.endpoint, os.path.basename(os.path.dirname(target.cafile)), trust.shipped_dir(target.cafile) "
        "is not None)\n"
    )
    env = {**CREDENTIALS, "PATH": "/usr/bin:/bin", "HOME": str(image_venv)}
    done = _run(image_venv / "bin" / "python", "-I", "-c", code, env=env)
    assert done.returncode == 0, done.stderr
    endpoint, bundle_package, shipped = done.stdout.split()
    assert (endpoint, bundle_package) == ("https://dynamodb.us-east-1.amazonaws.com", "certifi")
    pinned = _run(image_venv / "bin" / "python", "-m", "pip", "show", "certifi").stdout
    build_pin = (ROOT / "build.sh").read_text().split("CERTIFI_VERSION=")[1].split()[0]
    assert shipped == str(f"Version: {build_pin}" in pinned), (shipped, pinned)


def test_container_path_first_run_then_replay(image: LambdaEnvironment, image_venv: Path, executions: Executions,
                                              ddb_client: Any, wheel_table: str) -> None:
    info = image.invoke({"marker": marker(), "action": "info"})
    assert info.error_type is None, info.body
    assert info.json()["executable"] == str(image_venv / "bin" / "python")
    assert info.json()["original_handler"] == "app.handler"  # the installed wrapper swapped the handler
    assert info.json()["pythonpath"] is None

    event = {"marker": marker(), "action": "random"}
    first = image.invoke(event)
    assert first.error_type is None, first.body
    assert executions.count(event["marker"]) == 1
    second = image.invoke(event)
    assert second.body == first.body  # a random id and a timestamp: only a replay gives them back
    assert executions.count(event["marker"]) == 1
    record = get_record(ddb_client, wheel_table, record_id(event["marker"], prefix=FUNCTION))
    assert record is not None and record["status"] == {"S": "COMPLETED"}

    raw = {"marker": marker(), "action": "result", "result": "bytes"}  # the tagged result path, orjson's
    assert image.invoke(raw).body == image.invoke(raw).body == b"\x00\xff\xfe raw bytes \x80\n"
    assert executions.count(raw["marker"]) == 1



def test_aws_base_image_path_runs_the_installed_wrapper_from_exec_wrapper(
        image_venv: Path, task_root: Path, executions: Executions, dynamodb: Any, wheel_table: str,
        ddb_client: Any, tmp_path: Path) -> None:
    # An AWS base image's /var/runtime/bootstrap execs $AWS_LAMBDA_EXEC_WRAPPER in front of its python (our
    # stand-in does the same, with the same checks); pip put the wrapper beside that python (/var/lang/bin there).
    empty_opt = tmp_path / "opt"  # no layer attached: only the wheel's files
    empty_opt.mkdir()
    env = {
        **CREDENTIALS,
        "AWS_ENDPOINT_URL_DYNAMODB": dynamodb.endpoint,
        "IDEMPOTENCY_TABLE": wheel_table,
        "IDEMPOTENCY_KEY_JMESPATH": "marker",
        "EXECUTIONS_FILE": str(executions.path),
        "AWS_LAMBDA_EXEC_WRAPPER": str(image_venv / "bin" / "idempotency-wrapper"),
    }
    with LambdaEnvironment(image_venv / "bin" / "python", task_root, version=PRIMARY, env=env, opt_dir=empty_opt,
                           function_name=FUNCTION, log_path=tmp_path / "rie.log") as base_image:
        info = base_image.invoke({"marker": marker(), "action": "info"})
        assert info.error_type is None, info.body
        assert info.json()["original_handler"] == "app.handler"
        assert info.json()["handler"] == "idempotency_layer.interceptor.handler"
        event = {"marker": marker(), "action": "random"}
        first, second = base_image.invoke(event), base_image.invoke(event)
    assert first.error_type is None, first.body
    assert second.body == first.body
    assert executions.count(event["marker"]) == 1
    record = get_record(ddb_client, wheel_table, record_id(event["marker"], prefix=FUNCTION))
    assert record is not None and record["status"] == {"S": "COMPLETED"}
