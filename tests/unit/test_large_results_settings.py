"""IDEMPOTENCY_LARGE_RESULTS_BUCKET, _PREFIX and _READ_BUCKETS: validated at init; they change nothing else."""

from __future__ import annotations

import pytest

from idempotency_layer import config
from idempotency_layer.errors import IdempotencyConfigurationError

BASE = {"IDEMPOTENCY_ORIGINAL_HANDLER": "app.handler", "AWS_LAMBDA_FUNCTION_NAME": "orders", "IDEMPOTENCY_TABLE": "t-1"}


def test_the_bucket_and_its_prefix() -> None:
    plain = config.load(BASE)
    assert (plain.large_results_bucket, plain.large_results_prefix) == (None, "idempotency-results/orders/")
    assert config.load({**BASE, "IDEMPOTENCY_LARGE_RESULTS_BUCKET": "my-results-1", "IDEMPOTENCY_KEY_PREFIX": "pay-1"}
                       ).large_results_prefix == "idempotency-results/pay-1/"  # per function: the key prefix
    found = config.load({**BASE, "IDEMPOTENCY_LARGE_RESULTS_BUCKET": "my-results-1",
                         "IDEMPOTENCY_LARGE_RESULTS_PREFIX": "orders/large/"})
    assert (found.large_results_bucket, found.large_results_prefix) == ("my-results-1", "orders/large/")
    assert found._replace(large_results_bucket=None, large_results_prefix="idempotency-results/orders/") == plain
    assert config.load({**BASE, "IDEMPOTENCY_LARGE_RESULTS_BUCKET": "ab--results"}).large_results_bucket == \
        "ab--results"


def test_the_read_allow_list() -> None:
    found = config.load({**BASE, "IDEMPOTENCY_LARGE_RESULTS_BUCKET": "new-results",
                         "IDEMPOTENCY_LARGE_RESULTS_READ_BUCKETS": " old-results , older-1,old-results,new-results"})
    assert found.large_results_read_buckets == ("old-results", "older-1")  # the setting's own bucket goes without
    assert config.load({**BASE, "IDEMPOTENCY_LARGE_RESULTS_BUCKET": "new-results"}).large_results_read_buckets == ()


@pytest.mark.parametrize(("env", "says"), [
    ({"IDEMPOTENCY_LARGE_RESULTS_BUCKET": "My_Bucket"}, "is not an S3 bucket name"),
    ({"IDEMPOTENCY_LARGE_RESULTS_BUCKET": "with.dots.bucket"}, "no dots"),
    ({"IDEMPOTENCY_LARGE_RESULTS_BUCKET": "ab"}, "is not an S3 bucket name"),
    ({"IDEMPOTENCY_LARGE_RESULTS_BUCKET": "xn--results"}, "is not an S3 bucket name"),
    ({"IDEMPOTENCY_LARGE_RESULTS_BUCKET": "sthree-results"}, "is not an S3 bucket name"),
    ({"IDEMPOTENCY_LARGE_RESULTS_BUCKET": "results-s3alias"}, "is not an S3 bucket name"),
    ({"IDEMPOTENCY_LARGE_RESULTS_PREFIX": "x/"}, "IDEMPOTENCY_LARGE_RESULTS_BUCKET is not"),
    ({"IDEMPOTENCY_LARGE_RESULTS_READ_BUCKETS": "old-results"}, "IDEMPOTENCY_LARGE_RESULTS_BUCKET is not"),
    ({"IDEMPOTENCY_LARGE_RESULTS_BUCKET": "good-bucket", "IDEMPOTENCY_LARGE_RESULTS_READ_BUCKETS": "old-1,a.b.c"},
     "IDEMPOTENCY_LARGE_RESULTS_READ_BUCKETS='old-1,a.b.c' is not accepted: 'a.b.c' is not an S3 bucket name"),
    ({"IDEMPOTENCY_LARGE_RESULTS_BUCKET": "good-bucket", "IDEMPOTENCY_LARGE_RESULTS_READ_BUCKETS": "old-1,"},
     "'' is not an S3 bucket name"),
    ({"IDEMPOTENCY_LARGE_RESULTS_BUCKET": "good-bucket", "IDEMPOTENCY_LARGE_RESULTS_READ_BUCKETS": "xn--old"},
     "is not an S3 bucket name"),
    ({"IDEMPOTENCY_LARGE_RESULTS_BUCKET": "good-bucket", "IDEMPOTENCY_LARGE_RESULTS_PREFIX": "a b"}, "not accepted"),
])
def test_bad_values_fail_init(env: dict[str, str], says: str) -> None:
    with pytest.raises(IdempotencyConfigurationError, match=says):
        config.load({**BASE, **env})
