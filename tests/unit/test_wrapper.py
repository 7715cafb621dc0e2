"""The exec wrapper, run for real with bash: a probe command stands in for the Lambda runtime."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WRAPPER = ROOT / "wrapper" / "idempotency-wrapper"
INTERCEPTOR = "idempotency_layer.interceptor.handler"
# Stands in for the runtime: reports what it was started with.
PROBE = (
    "import json, os, sys; print(json.dumps({'argv': sys.argv[1:], 'pid': os.getpid(), "
    "'handler': os.environ.get('_HANDLER'), 'original': os.environ.get('IDEMPOTENCY_ORIGINAL_HANDLER'), "
    "'pythonpath': os.environ.get('PYTHONPATH')}))"
)
PROBE_CMD = [sys.executable, "-c", PROBE]
WRAPPER_VARS = ("_HANDLER", "IDEMPOTENCY_ORIGINAL_HANDLER", "IDEMPOTENCY_NEXT_WRAPPER", "IDEMPOTENCY_WRAPPER_CHAINED",
                "PYTHONPATH")


def run(args: list[str], **env: str) -> dict:
    """Run the wrapper with `args` as the runtime command and the given extra environment."""
    base = {k: v for k, v in os.environ.items() if k not in WRAPPER_VARS}
    out = subprocess.run(["bash", str(WRAPPER), *args], env={**base, **env}, capture_output=True, text=True, check=True,
                         timeout=30)  # a wrapper that loops fails the test instead of hanging it
    return json.loads(out.stdout)


def test_managed_runtime_swaps_handler() -> None:
    got = run(PROBE_CMD, _HANDLER="app.handler")
    assert got["handler"] == INTERCEPTOR
    assert got["original"] == "app.handler"
    assert got["argv"] == []


@pytest.fixture
def fake_ric(tmp_path: Path) -> str:
    """A directory holding an `awslambdaric` whose __main__ is the probe, for `python -m awslambdaric H`."""
    pkg = tmp_path / "awslambdaric"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "__main__.py").write_text(PROBE + "\n")
    return str(tmp_path)


def test_container_image_rewrites_the_awslambdaric_argument(fake_ric: str) -> None:
    got = run([sys.executable, "-m", "awslambdaric", "app.handler"], PYTHONPATH=fake_ric)
    assert got["argv"] == [INTERCEPTOR]
    assert got["original"] == "app.handler"
    assert got["handler"] is None  # the image's handler is the argument; _HANDLER is left alone


@pytest.mark.parametrize("module", [["-m", "awslambdaric"], ["-mawslambdaric"]])
def test_either_spelling_of_the_module_option_is_rewritten(fake_ric: str, module: list[str]) -> None:
    # Python takes `-mawslambdaric` as `-m awslambdaric`; the emulator also sets _HANDLER, which awslambdaric ignores
    # when it has the argument: the argument is the one that must point at the interceptor.
    got = run([sys.executable, *module, "app.handler"], PYTHONPATH=fake_ric, _HANDLER="app.handler")
    assert got["argv"] == [INTERCEPTOR]
    assert got["original"] == "app.handler"


def test_run_twice_keeps_the_first_original(fake_ric: str) -> None:
    got = run(["bash", str(WRAPPER), *PROBE_CMD], _HANDLER="app.handler")
    assert (got["handler"], got["original"]) == (INTERCEPTOR, "app.handler")
    container = [sys.executable, "-m", "awslambdaric", "orders.handler"]
    got = run(["bash", str(WRAPPER), *container], PYTHONPATH=fake_ric)
    assert (got["argv"], got["original"]) == ([INTERCEPTOR], "orders.handler")


def next_wrapper(path: Path, body: str) -> Path:
    """An executable bash script at `path` running `body`: a wrapper to chain to."""
    path.write_text(f"#!/bin/bash\n{body}\n")
    path.chmod(0o755)
    return path


def test_chains_to_the_next_wrapper(tmp_path: Path) -> None:
    record = tmp_path / "argv.txt"
    nxt = next_wrapper(tmp_path / "otel-instrument", f'printf "%s\\n" "$@" > {record}\nexec "$@"')
    got = run(PROBE_CMD, _HANDLER="app.handler", IDEMPOTENCY_NEXT_WRAPPER=str(nxt))
    assert record.read_text().splitlines() == PROBE_CMD
    # The next wrapper sees the swap already done.
    assert (got["handler"], got["original"]) == (INTERCEPTOR, "app.handler")


@pytest.mark.parametrize("pythonpath", [None, "/opt/custom:/var/task/vendor"])
def test_pythonpath_untouched(pythonpath: str | None) -> None:
    env = {"_HANDLER": "app.handler"} | ({"PYTHONPATH": pythonpath} if pythonpath else {})
    assert run(PROBE_CMD, **env)["pythonpath"] == pythonpath


def test_execs_so_the_runtime_keeps_the_wrapper_pid() -> None:
    # The shell prints its PID, then becomes the wrapper (exec), which must become the probe (exec).
    script = 'echo $$; exec bash "$0" "$@"'
    out = subprocess.run(
        ["bash", "-c", script, str(WRAPPER), *PROBE_CMD],
        env={**os.environ, "_HANDLER": "app.handler"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert int(out[0]) == json.loads(out[1])["pid"]


def test_no_command_fails() -> None:
    proc = subprocess.run(["bash", str(WRAPPER)], capture_output=True, text=True)
    assert proc.returncode != 0 and "no runtime command" in proc.stderr


def test_file_is_executable_lf_and_bash_only() -> None:
    mode = stat.S_IMODE(WRAPPER.stat().st_mode)
    assert mode == 0o755, oct(mode)
    body = WRAPPER.read_bytes()
    assert body.startswith(b"#!/bin/bash\n")
    assert b"\r" not in body
    assert b"PYTHONPATH" not in body


def test_git_mode_when_tracked() -> None:
    # Only meaningful once committed; the zip's mode is checked in test_build.
    out = subprocess.run(
        ["git", "ls-files", "-s", "wrapper/idempotency-wrapper"], cwd=ROOT, capture_output=True, text=True
    ).stdout
    if not out:
        pytest.skip("wrapper not tracked by git yet")
    assert out.startswith("100755 ")
    attrs = subprocess.run(
        ["git", "check-attr", "eol", "wrapper/idempotency-wrapper"], cwd=ROOT, capture_output=True, text=True
    ).stdout
    assert attrs.strip().endswith("eol: lf")


@pytest.mark.parametrize("problem", ["missing", "not executable", "a folder"])
def test_a_next_wrapper_that_cannot_run_is_named(tmp_path: Path, problem: str) -> None:
    nxt = tmp_path / "otel-instrument"
    if problem == "not executable":
        nxt.write_text('#!/bin/bash\nexec "$@"\n')
        nxt.chmod(0o644)
    elif problem == "a folder":
        nxt.mkdir()
    base = {k: v for k, v in os.environ.items() if k not in WRAPPER_VARS}
    proc = subprocess.run(["bash", str(WRAPPER), *PROBE_CMD], capture_output=True, text=True,
                          env={**base, "_HANDLER": "app.handler", "IDEMPOTENCY_NEXT_WRAPPER": str(nxt)})
    assert proc.returncode == 126
    assert proc.stdout == ""  # the runtime did not start
    assert f"IDEMPOTENCY_NEXT_WRAPPER={nxt} is not an executable file" in proc.stderr


@pytest.mark.parametrize("blank", ["", "  ", "\t"])
def test_a_blank_next_wrapper_counts_as_unset(blank: str) -> None:
    got = run(PROBE_CMD, _HANDLER="app.handler", IDEMPOTENCY_NEXT_WRAPPER=blank)
    assert (got["handler"], got["original"], got["argv"]) == (INTERCEPTOR, "app.handler", [])


def test_a_next_wrapper_that_is_ours_runs_the_runtime_once() -> None:
    got = run(PROBE_CMD, _HANDLER="app.handler", IDEMPOTENCY_NEXT_WRAPPER=str(WRAPPER))
    assert (got["handler"], got["original"]) == (INTERCEPTOR, "app.handler")


def test_a_next_wrapper_that_execs_ours_again_runs_once(tmp_path: Path) -> None:
    record = tmp_path / "runs.txt"
    nxt = next_wrapper(tmp_path / "loops-back", f'echo ran >> {record}\nexec bash {WRAPPER} "$@"')
    got = run(PROBE_CMD, _HANDLER="app.handler", IDEMPOTENCY_NEXT_WRAPPER=str(nxt))
    assert record.read_text().splitlines() == ["ran"]
    assert (got["handler"], got["original"]) == (INTERCEPTOR, "app.handler")
