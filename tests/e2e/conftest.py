"""End-to-end fixtures: the built layer, unpacked as /opt, under RIE + awslambdaric, on each Python found.

Environments are expensive next to an invocation (a process, an init with botocore), so those with the
same settings are shared by the tests of a session; tests keep apart by putting a fresh marker in every
event (a fresh key), and count executions by that marker.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from tests.conftest import CREDENTIALS
from tests.support import downloads
from tests.support.counting_proxy import CountingProxy
from tests.support.dynamodb_local import create_table, wait_for
from tests.support.rie import LambdaEnvironment, ensure_layer, unpack_layer

APPS = Path(__file__).resolve().parent / "apps"
PYTHONS = sorted(downloads.interpreters(), key=lambda v: tuple(map(int, v.split("."))))
# The full behaviour matrix runs on one Python; a smoke subset runs on every one.
PRIMARY = "3.12" if "3.12" in PYTHONS else (PYTHONS[-1] if PYTHONS else "none")
FUNCTION = "idempotency-e2e"
INTERCEPTOR = "idempotency_layer.interceptor.handler"
_LOGS = pytest.StashKey[list[tuple[LambdaEnvironment, int]]]()


def marker() -> str:
    """A value no other test's events carry, so its key and its execution count are its own."""
    return uuid.uuid4().hex


def record_id(value: Any, prefix: str = FUNCTION) -> str:
    """The record key the layer must store for `value` (docs/how-it-works.md: `<prefix>#<sha256 of canonical JSON>`)."""
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    return f"{prefix}#{hashlib.sha256(canonical).hexdigest()}"


def get_record(client: Any, table: str, key: str) -> dict[str, Any] | None:
    item = client.get_item(TableName=table, Key={"id": {"S": key}}, ConsistentRead=True).get("Item")
    return item


def scan_count(client: Any, table: str) -> int:
    return client.scan(TableName=table, Select="COUNT", ConsistentRead=True)["Count"]


class Executions:
    """Reads the user handler's own log of executions (one JSON line per run)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def count(self, mark: str) -> int:
        if not self.path.exists():
            return 0
        return sum(json.loads(line)["marker"] == mark for line in self.path.read_text().splitlines())

    def wait_for(self, mark: str, n: int, timeout: float = 30) -> None:
        wait_for(lambda: self.count(mark) >= n, timeout, f"{n} execution(s) of {mark}")


def same_as_first(first: Any, again: Any, executions: Executions, mark: str) -> bool:
    """Check that the copy `again` answered exactly as `first` did and the handler ran once; False when the
    runtime refused the value (`Runtime.MarshalError`, as it would without the layer): the handler ran, so the key
    is completed and the copy is told why there is nothing to replay, without running again."""
    if first.error_type == "Runtime.MarshalError":
        assert again.error_type == "IdempotencyResultUndeliverableError", again.body[:300]
        assert executions.count(mark) == 1
        return False
    assert first.error_type is None, first.body[:300]
    assert (again.status, again.body) == (first.status, first.body)
    assert again.headers.get("Content-Type") == first.headers.get("Content-Type")
    assert executions.count(mark) == 1
    return True


class Environments:
    """Starts LambdaEnvironments with the layer on a given table; `shared` ones live for the session."""

    def __init__(self, runtimes: dict[str, Path], opt_dir: Path, task_root: Path, log_dir: Path,
                 executions: Executions, endpoint: str) -> None:
        self.runtimes = runtimes
        self.opt_dir = opt_dir
        self.task_root = task_root
        self.log_dir = log_dir
        self.executions = executions
        self.endpoint = endpoint
        self._shared: dict[Any, LambdaEnvironment] = {}
        self._count = 0
        self.current: list[tuple[LambdaEnvironment, int]] | None = None  # envs used by the running test

    def base_env(self, table: str) -> dict[str, str]:
        """`table` "": no IDEMPOTENCY_TABLE (the Valkey store's environments)."""
        return {**CREDENTIALS, "AWS_ENDPOINT_URL_DYNAMODB": self.endpoint, **({"IDEMPOTENCY_TABLE": table} if table
                else {}), "EXECUTIONS_FILE": str(self.executions.path)}

    def _used(self, env: LambdaEnvironment) -> LambdaEnvironment:
        if self.current is not None:
            size = env.log_path.stat().st_size if env.log_path.exists() else 0
            self.current.append((env, size))
        return env

    def new(self, version: str, table: str, env: dict[str, str] | None = None, **options: Any) -> LambdaEnvironment:
        """A started environment; the caller (or `make_env`) stops it."""
        if version not in self.runtimes:
            pytest.skip(f"Python {version} not found")
        self._count += 1
        options.setdefault("opt_dir", self.opt_dir)
        options.setdefault("task_root", self.task_root)
        options.setdefault("function_name", FUNCTION)
        lambda_env = LambdaEnvironment(
            self.runtimes[version], version=version, env={**self.base_env(table), **(env or {})},
            log_path=self.log_dir / f"env-{self._count}-py{version}.log", **options,
        )
        self._used(lambda_env)
        return lambda_env.start()

    def shared(self, version: str, table: str, env: dict[str, str] | None = None, index: int = 0,
               **options: Any) -> LambdaEnvironment:
        """The session's environment with these settings (`index` tells apart several alike)."""
        key = (version, table, tuple(sorted((env or {}).items())), index, tuple(sorted(options.items())))
        if key not in self._shared or self._shared[key].process is None:
            self._shared[key] = self.new(version, table, env, **options)
        return self._used(self._shared[key])

    def close(self) -> None:
        for lambda_env in self._shared.values():
            lambda_env.stop()


@pytest.fixture(scope="session")
def runtimes() -> dict[str, Path]:
    return downloads.runtimes()


@pytest.fixture(scope="session")
def opt_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The built layer (rebuilt first when stale) unpacked into a stand-in for /opt."""
    return unpack_layer(ensure_layer(), tmp_path_factory.mktemp("opt"))


@pytest.fixture(scope="session")
def task_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The function's code (/var/task): the user's app, unmodified."""
    root = tmp_path_factory.mktemp("task")
    for source in APPS.glob("*.py"):
        shutil.copy(source, root / source.name)
    return root


@pytest.fixture(scope="session")
def executions(tmp_path_factory: pytest.TempPathFactory) -> Executions:
    return Executions(tmp_path_factory.mktemp("executions") / "executions.jsonl")


@pytest.fixture(scope="session")
def environments(runtimes: dict[str, Path], opt_dir: Path, task_root: Path, executions: Executions,
                 dynamodb: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Environments]:
    pool = Environments(runtimes, opt_dir, task_root, tmp_path_factory.mktemp("rie-logs"), executions,
                        dynamodb.endpoint)
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture(scope="session")
def shared_table(ddb_client: Any) -> Iterator[str]:
    """One table for the shared environments; every test's events carry their own marker, so keys differ."""
    name = create_table(ddb_client, f"idempotency-e2e-{uuid.uuid4().hex[:8]}")
    yield name
    ddb_client.delete_table(TableName=name)


@pytest.fixture
def wired_env(environments: Environments, ddb_client: Any, dynamodb: Any) -> Any:
    """Factory: an environment (with `settings`) on a table of its own behind a proxy counting its requests on the
    wire; the environment, the proxy and the table are gone when the `with` block ends."""

    @contextmanager
    def wired(version: str, handler: str, settings: dict[str, str] | None = None
              ) -> Iterator[tuple[LambdaEnvironment, CountingProxy]]:
        table = create_table(ddb_client, f"idempotency-wire-{uuid.uuid4().hex[:8]}")
        upstream = urlparse(dynamodb.endpoint)
        proxy = CountingProxy(upstream.hostname, upstream.port)
        try:
            env = environments.new(version, table, {"AWS_ENDPOINT_URL_DYNAMODB": proxy.endpoint, **(settings or {})},
                                   handler=handler)
            try:
                yield env, proxy
            finally:
                env.stop()
        finally:
            proxy.close()
            ddb_client.delete_table(TableName=table)

    return wired


@pytest.fixture
def make_env(environments: Environments) -> Iterator[Any]:
    """Factory for environments of this test alone, all stopped when it ends."""
    started: list[LambdaEnvironment] = []

    def make(version: str, table: str, env: dict[str, str] | None = None, **options: Any) -> LambdaEnvironment:
        lambda_env = environments.new(version, table, env, **options)
        started.append(lambda_env)
        return lambda_env

    try:
        yield make
    finally:
        for lambda_env in started:
            lambda_env.stop()


@pytest.fixture(autouse=True)
def _attach_logs(request: pytest.FixtureRequest) -> Iterator[None]:
    """Remember which environments a test used, so a failure shows their logs from that test on."""
    used: list[tuple[LambdaEnvironment, int]] = []
    request.node.stash[_LOGS] = used
    pool = request.getfixturevalue("environments") if "environments" in request.fixturenames else None
    if pool is not None:
        pool.current = used
    yield
    if pool is not None:
        pool.current = None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.failed:
        for lambda_env, offset in item.stash.get(_LOGS, []):
            text = lambda_env.logs()[offset:]
            report.sections.append((f"log of {lambda_env.log_path.name}", text[-20000:]))
    return report


@pytest.fixture(params=PYTHONS or ["none"], ids=lambda v: f"py{v}")
def python_version(request: pytest.FixtureRequest) -> str:
    """Each Python 3.10-3.13 found."""
    if not PYTHONS:
        pytest.skip("no Python 3.10-3.13 found")
    return request.param


@pytest.fixture
def primary() -> str:
    """The one Python the full behaviour matrix runs on."""
    if not PYTHONS:
        pytest.skip("no Python 3.10-3.13 found")
    return PRIMARY
