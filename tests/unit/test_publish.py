"""scripts/publish.py's checks that need no AWS endpoint: the upload size limit and the runtimes it declares.
Publishing itself runs against moto's server in tests/e2e/test_publish.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from scripts import publish
from tests.support.rie import ensure_layer

pytestmark = pytest.mark.built

ROOT = Path(__file__).resolve().parents[2]


def test_a_zip_over_the_direct_upload_limit_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    built = ensure_layer().parent
    for arch in publish.ARCHES:
        shutil.copyfile(built / f"idempotency-layer-{arch}.zip", tmp_path / f"idempotency-layer-{arch}.zip")
    assert set(publish.check_zips(tmp_path, [])) == set(publish.ARCHES)  # within the real 50 MB limit
    monkeypatch.setattr(publish, "MAX_UPLOAD_BYTES", 1_000_000)  # the zips are about 1.6 MB
    with pytest.raises(publish.Refused, match=r"over the 1000000-byte direct upload limit; nothing was published"):
        publish.check_zips(tmp_path, [])


def test_runtimes_are_the_builds_pythons() -> None:
    build = (ROOT / "build.sh").read_text()
    pythons = build.split("PYTHONS=(", 1)[1].split(")", 1)[0].split()
    assert publish.runtimes(["--package-src", "x", "--pythons", " ".join(pythons)]) == [f"python{p}" for p in pythons]
    assert publish.runtimes([]) == [f"python{p}" for p in publish.DEFAULT_PYTHONS.split()]
    assert publish.DEFAULT_PYTHONS.split() == pythons  # verify_layer's default is the build's list too
