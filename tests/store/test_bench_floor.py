"""The bench's floor and profile on DynamoDB Local (bench/floor.py, bench/profile_hot.py).

The floor must send what the layer sends, or its ratio means nothing: per event the same requests, of the same
size, and records the layer itself replays. The profile's in-place parts must each be measured where they run:
non-zero on a path that runs them, zero on one that does not."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))  # bench modules import each other by name

import inprocess
import profile_hot
from inprocess import Path_

from tests.support.dynamodb_local import create_table

N = 10


def _run(system, table, proxy, log, path):
    worker = inprocess.Worker(system, table, proxy.endpoint, log)
    try:
        worker.run(Path_("first", "warm"), 0, 1)  # the floor captures the layer's requests with its first event
        proxy.reset()
        answer = worker.run(path, 0, N)
        return answer, proxy.snapshot()
    finally:
        worker.close()


@pytest.mark.parametrize("token", [False, True], ids=["no token", "session token"])
def test_the_floor_sends_the_layers_requests_and_leaves_records_the_layer_replays(token, ddb_client, proxy,
                                                                                    tmp_path):
    suffix = "+token" if token else ""
    layer_table = create_table(ddb_client, f"bench-floor-layer{'-t' if token else ''}")
    floor_table = create_table(ddb_client, f"bench-floor-floor{'-t' if token else ''}")
    first, replay = Path_("first", "fl"), Path_("replay", "fl")
    with open(tmp_path / "workers.log", "ab") as log:
        layer_first, (layer_requests, layer_sent) = _run("layer" + suffix, layer_table, proxy, log, first)
        floor_first, (floor_requests, floor_sent) = _run("floor" + suffix, floor_table, proxy, log, first)
        assert layer_first["runs"] == floor_first["runs"] == N and floor_first["wrong"] == 0
        assert layer_requests == floor_requests == {"PutItem": N, "UpdateItem": N}
        assert floor_sent == layer_sent  # the same bytes, but for the key, owner, times and signature
        # A replay through the floor: one refused claim each, nothing run.
        floor_replay, (requests, sent) = _run("floor" + suffix, floor_table, proxy, log, replay)
        layer_replay, (layer_requests, layer_sent) = _run("layer" + suffix, layer_table, proxy, log, replay)
        assert floor_replay["runs"] == layer_replay["runs"] == 0
        assert requests == layer_requests == {"PutItem": N} and sent == layer_sent
        # What the floor completed are the layer's records: the layer replays them, right, running nothing.
        replayed, (requests, _) = _run("layer" + suffix, floor_table, proxy, log, replay)
        assert replayed["runs"] == 0 and replayed["wrong"] == 0 and requests == {"PutItem": N}


def test_the_profiles_parts_are_measured_where_they_run(ddb_client, proxy, tmp_path):
    table = create_table(ddb_client, "bench-profile-layer")
    found = profile_hot.profile(proxy.endpoint, {"layer": table}, tmp_path, in_place_only=True)["in_place"]
    # What does not run on a path: no answer to decode on a replay (its claim is refused), no result to encode;
    # no result to decode on a first execution.
    idle = {"first execution": {"result decoding (codec.decode)"},
            "replay": {"answer parsing (wire.decode_answer)", "result encoding (codec.encode)"}}
    for path, rows in found.items():
        measured = {row["part"] for row in rows if row["us"] > 0}
        assert {row["part"] for row in rows} - measured == idle[path], path
        whole = rows[0]["us"]
        assert all(row["us"] < whole for row in rows[1:]), path
