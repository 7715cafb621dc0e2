"""The end-to-end rows' Powertools function (bench/rie_bench.py): the bench handler under `@idempotent`.

Configured by common.make_powertools, as the in-process `powertools` worker is: `DynamoDBPersistenceLayer` on
the table in BENCH_TABLE, key expression, TTL and prefix as the layer's, no local cache,
`raise_on_no_idempotency_key=False`. Built at import, as a function's module is at init.
"""

from __future__ import annotations

import os

import bench_handler
from common import make_powertools

handler = make_powertools(os.environ["BENCH_TABLE"], False, bench_handler.handler)
