"""What every soak shares below its own module: the runtime Python it runs the emulator on, and SIGTERM as an exit.
chaos.py, durable_soak.py and valkey_soak.py import these from here, so chaos.py (whose `--durable` runs the
durable soak) and durable_soak.py do not import each other."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support import downloads


def runtime_python(version: str | None = None) -> tuple[str, Path]:
    runtimes = downloads.runtimes()
    if not runtimes:
        raise RuntimeError("no Python 3.10-3.13 runtime found (python -m tests.support.downloads)")
    if version is None:
        version = "3.12" if "3.12" in runtimes else max(runtimes, key=lambda v: tuple(map(int, v.split("."))))
    if version not in runtimes:
        raise RuntimeError(f"no Python {version} runtime; found {', '.join(sorted(runtimes))}")
    return version, runtimes[version]


def terminated(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds through the finally blocks that stop what the soak started
