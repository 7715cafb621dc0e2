"""The container-image entry point (`wrapper python -m awslambdaric app.handler`) on every Python found.

An image puts the layer's folders on PYTHONPATH itself, so this proves each Python finds its own orjson build
under `python/lib/python3.X/site-packages` on that path too, not only through the managed runtime's sys.path.
"""

from __future__ import annotations

from typing import Any

from tests.e2e.conftest import Environments, Executions, get_record, marker, record_id


def test_image_same_event_twice_runs_once(python_version: str, environments: Environments, shared_table: str,
                                          executions: Executions, ddb_client: Any) -> None:
    env = environments.shared(python_version, shared_table, image=True)
    info = env.invoke({"marker": marker(), "action": "info"})
    assert info.error_type is None, info.body
    assert info.json()["python"] == python_version
    assert info.json()["original_handler"] == "app.handler"

    event = {"marker": marker(), "action": "random"}
    first, second = env.invoke(event), env.invoke(event)
    assert first.error_type is None, first.body
    assert second.body == first.body  # the random id and the timestamp, replayed byte for byte
    assert executions.count(event["marker"]) == 1
    assert get_record(ddb_client, shared_table, record_id(event))["status"] == {"S": "COMPLETED"}

    raw = {"marker": marker(), "action": "result", "result": "bytes"}  # the tagged path, orjson included
    assert env.invoke(raw).body == env.invoke(raw).body == b"\x00\xff\xfe raw bytes \x80\n"
    assert executions.count(raw["marker"]) == 1
