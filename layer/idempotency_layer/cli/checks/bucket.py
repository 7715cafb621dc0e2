"""doctor's check of the large-results bucket (IDEMPOTENCY_LARGE_RESULTS_BUCKET): a probe object written, read back
and deleted, as the layer writes, reads and the CLI's purge deletes results."""

from __future__ import annotations

import os

from .check import FAIL, PASS, WARN, Check

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def checks(bucket: Any) -> list[Check]:
    """PutObject, GetObject and DeleteObject on a probe object, as the layer and the CLI's purge make them."""
    from ...stores.s3 import S3Error

    probe = f"{bucket.prefix}doctor-probe-{os.urandom(8).hex()}"  # under the function's own prefix
    where = f"s3://{bucket.name}/"
    fix = (f"grant the function's role s3:PutObject and s3:GetObject on arn:aws:s3:::{bucket.name}/"
           f"{bucket.prefix}*, and the operator s3:DeleteObject there (and the bucket must exist in this Region)")
    rows = []
    pointer = None
    try:
        pointer = bucket.write(probe, b"idempotency-layer doctor probe")
        rows.append(Check("large results PutObject", PASS, f"{where}{probe} (SSE-S3)"))
        bucket.get(pointer)
        rows.append(Check("large results GetObject", PASS, "read back, size and SHA-256 as written"))
        bucket.delete(pointer.object_key)
        rows.append(Check("large results DeleteObject", PASS, "the probe object removed"))
        pointer = None
    except S3Error as error:
        if error.code is None:
            fix = "S3 did not answer: check the network path (a VPC needs an S3 gateway endpoint or a NAT)"
        elif error.code == "NoSuchBucket":
            fix = f"create the bucket {bucket.name}, in the function's Region, or fix the setting"
        rows.append(Check("large results bucket", FAIL, str(error), fix))
    if pointer is not None:  # written but not read back or deleted: try to leave nothing behind
        try:
            bucket.delete(pointer.object_key)
        except S3Error:
            rows.append(Check("large results probe", WARN, f"{where}{probe} could not be deleted",
                              "the bucket's lifecycle rule removes it"))
    return rows
