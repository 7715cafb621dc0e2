"""IDEMPOTENCY_DURABLE=execution, pure parts and the executor over the in-memory table: the execution's input read
as AWS's durable execution SDK reads it, the answers as the SDK writes them (checked against the SDK's own classes
where it is installed), the settings it needs, and what each answer of the owner does to the claim. Handler runs
are counted by the handler itself. With the SDK's runners and DynamoDB Local: tests/store and tests/e2e."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from idempotency_layer import config as _config
from idempotency_layer import metrics
from idempotency_layer.cycle import Cycle
from idempotency_layer.errors import (
    IdempotencyAlreadyInProgressError,
    IdempotencyConfigurationError,
    IdempotencyKeyError,
    IdempotencyPersistenceLayerError,
)
from idempotency_layer.executor import Executor
from idempotency_layer.invocation import Invocation
from idempotency_layer.keys import KeyDeriver
from idempotency_layer.plan import DURABLE, EVENT, EXECUTION
from idempotency_layer.sources import plan, whole
from idempotency_layer.sources.durable import execution_input, failed, status, succeeded
from idempotency_layer.stores.dynamodb.store import DynamoDBStore
from idempotency_layer.stores.protocol import COMPLETED, INPROGRESS
from tests.support.memory_dynamodb import MemoryDynamoDB, MemoryTransport

FUNCTION, REGION = "orders-workflow", "us-east-1"
BASE = {"IDEMPOTENCY_TABLE": "orders", "IDEMPOTENCY_ORIGINAL_HANDLER": "app.handler",
        "AWS_LAMBDA_FUNCTION_NAME": FUNCTION, "AWS_REGION": REGION, "IDEMPOTENCY_DURABLE": "execution",
        "IDEMPOTENCY_IN_PROGRESS_SECONDS": "86400"}
LEASE_MS = 86_400_000


def arn(name: str = "run-1", last: str = "4f1c2a9e") -> str:
    return f"arn:aws:lambda:{REGION}:123456789012:function:{FUNCTION}:$LATEST/durable-execution/{name}/{last}"


def envelope(given: Any = ..., execution: str | None = None, token: str = "t-1", payload: Any = ...,
             operations: list[Any] | None = None, marker: str | None = None) -> dict[str, Any]:
    execution = execution or arn()
    if payload is ...:
        payload = json.dumps({"orderId": "o-1"} if given is ... else given)
    op = {"Id": execution.rsplit("/", 1)[-1], "Type": "EXECUTION", "Status": "STARTED",
          "ExecutionDetails": {"InputPayload": payload}}
    state: dict[str, Any] = {"Operations": [op] if operations is None else operations}
    if marker is not None:
        state["NextMarker"] = marker
    return {"DurableExecutionArn": execution, "CheckpointToken": token, "InitialExecutionState": state}


# -- the input -----------------------------------------------------------------------------------------------

def test_the_input_is_the_execution_operations_payload_parsed_as_json():
    assert execution_input(envelope({"orderId": "o-9"})) == (arn(), {"orderId": "o-9"})


@pytest.mark.parametrize("payload", [None, "", "   \n"])
def test_a_missing_or_blank_payload_is_an_empty_object_as_the_sdk_reads_it(payload):
    assert execution_input(envelope(payload=payload))[1] == {}
    event = envelope()
    del event["InitialExecutionState"]["Operations"][0]["ExecutionDetails"]
    assert execution_input(event)[1] == {}


def test_the_operation_is_found_by_the_arns_last_segment_among_others_the_last_copy_winning():
    step = {"Id": "step-1", "Type": "STEP", "Status": "SUCCEEDED"}
    first = envelope({"orderId": "old"})["InitialExecutionState"]["Operations"][0]
    last = envelope({"orderId": "new"})["InitialExecutionState"]["Operations"][0]
    assert execution_input(envelope(operations=[step, first, last]))[1] == {"orderId": "new"}


@pytest.mark.parametrize(("event", "said"), [
    (envelope(operations=[], marker="page-2"), "later page"),
    (envelope(operations=[]), "not in this invocation's state"),
    (envelope(operations=[{"Id": "4f1c2a9e", "Type": "STEP"}]), "not in this invocation's state"),
    (envelope(operations="nope"), "not in this invocation's state"),  # type: ignore[arg-type]
    (envelope(payload='{"orderId": "secret-order"'), "not JSON"),
    (envelope(payload=17), "not text"),
])
def test_an_input_that_cannot_be_read_is_refused_naming_why_and_no_content(event, said):
    with pytest.raises(IdempotencyKeyError) as raised:
        execution_input(event)
    assert said in str(raised.value) and "secret-order" not in str(raised.value)


# -- the answers ---------------------------------------------------------------------------------------------

sdk = pytest.importorskip  # (the SDK needs Python 3.11+: its checks skip without it)


def test_the_answers_are_exactly_the_sdks():
    execution = sdk("aws_durable_execution_sdk_python.execution")
    service = sdk("aws_durable_execution_sdk_python.lambda_service")
    output = execution.DurableExecutionInvocationOutput
    assert succeeded('{"a": 1}') == output.create_succeeded(result='{"a": 1}').to_dict()
    for error in (IdempotencyAlreadyInProgressError("busy"), IdempotencyKeyError("no key")):
        expected = output(status=execution.InvocationStatus.FAILED,
                          error=service.ErrorObject.from_exception(error)).to_dict()
        assert failed(error) == expected
        assert output.from_dict(failed(error)).to_dict() == failed(error)
    assert failed(IdempotencyAlreadyInProgressError("x"))["Error"]["ErrorType"] == \
        "idempotency_layer.errors.IdempotencyAlreadyInProgressError"


@pytest.mark.parametrize(("answer", "expected"), [
    ({"Status": "SUCCEEDED", "Result": "1"}, "SUCCEEDED"), ({"Status": "FAILED"}, "FAILED"),
    ({"Status": "PENDING"}, "PENDING"), ({"Status": "RETRY"}, None), ({"status": "SUCCEEDED"}, None),
    ("SUCCEEDED", None), (None, None), ([], None),
])
def test_status(answer, expected):
    assert status(answer) == expected


# -- settings and plans --------------------------------------------------------------------------------------

@pytest.mark.parametrize(("changes", "named"), [
    ({"IDEMPOTENCY_IN_PROGRESS_SECONDS": None}, "IDEMPOTENCY_IN_PROGRESS_SECONDS"),
    ({"IDEMPOTENCY_IN_PROGRESS_SECONDS": "0"}, "IDEMPOTENCY_IN_PROGRESS_SECONDS"),
    ({"IDEMPOTENCY_SCOPE": "record"}, "IDEMPOTENCY_SCOPE"),
    ({"AWS_LAMBDA_FUNCTION_NAME": None}, "AWS_LAMBDA_FUNCTION_NAME"),
    ({"IDEMPOTENCY_DURABLE": "executions"}, "IDEMPOTENCY_DURABLE"),
])
def test_execution_mode_fails_init_without_what_it_needs(changes, named):
    env = {k: v for k, v in {**BASE, **changes}.items() if v is not None}
    with pytest.raises(IdempotencyConfigurationError, match=named):
        _config.load(env)


def test_pass_is_the_default_and_plans_durable():
    config = _config.load({k: v for k, v in BASE.items() if k != "IDEMPOTENCY_DURABLE"})
    assert not config.durable_executions
    keys = KeyDeriver(config.key_prefix, config.key_jmespath, config.payload_jmespath)
    assert plan(config, keys, envelope()).kind == DURABLE


def _keys(config: Any) -> KeyDeriver:
    return KeyDeriver(config.key_prefix, config.key_jmespath, config.payload_jmespath)


@settings(max_examples=60, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                 max_size=3), max_leaves=8),
       st.sampled_from([None, "orderId", "[a, b]"]), st.booleans())
def test_an_execution_is_keyed_exactly_as_its_input_as_a_whole_event(given_input, expression, required):
    env = {**BASE, "IDEMPOTENCY_REQUIRE_KEY": str(required).lower(), "IDEMPOTENCY_PAYLOAD_JMESPATH": "@"}
    if expression:
        env["IDEMPOTENCY_KEY_JMESPATH"] = expression
    config = _config.load(env)
    planned = plan(config, _keys(config), envelope(given_input))
    alone = whole(config, _keys(config), given_input)
    assert planned.kind == EXECUTION and planned.execution == arn()
    assert planned.units == alone.units and type(planned.refusal) is type(alone.refusal)
    assert str(planned.refusal).replace("the execution's input", "the event") == str(alone.refusal)


def test_another_functions_envelope_is_an_ordinary_event():
    config = _config.load(BASE)
    other = envelope(execution=arn().replace(FUNCTION, "someone-else"))
    assert plan(config, _keys(config), other).kind == EVENT


# -- the executor: what each answer does to the claim --------------------------------------------------------

class Clock:
    now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


class Workflow:
    """Settings, the cycle on an in-memory table, an executor, and a durable handler answering `answer`."""

    def __init__(self, **settings: str) -> None:
        self.config = _config.load({**BASE, "IDEMPOTENCY_KEY_JMESPATH": "orderId", **settings})
        self.db = MemoryDynamoDB()
        self.clock = Clock()
        self.transport = MemoryTransport(self.db)
        store = DynamoDBStore(self.transport, "orders", self.config.attributes, key_prefix=self.config.key_prefix)
        self.cycle = Cycle(store, 3600, clock=self.clock, min_claim_ms=self.config.in_progress_seconds * 1000,
                           wait_seconds=self.config.wait_seconds, sleep=lambda s: None)
        self.runs: list[str] = []
        self.answer: Any = {"Status": "SUCCEEDED", "Result": '{"receipt": 1}'}
        self.executor = Executor(self.cycle, self._handler, self.config)

    def _handler(self, event: Any, context: Any) -> Any:
        self.runs.append(event["DurableExecutionArn"])
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer

    def __call__(self, event: Any, tally: Any = None, remaining_ms: int = 60_000) -> Any:
        planned = plan(self.config, _keys(self.config), event)
        return self.executor.run(planned, event, None, Invocation(remaining_ms, tally))

    def items(self) -> list[dict[str, Any]]:
        return list(self.db.items.values())

    def record(self) -> dict[str, Any]:
        (item,) = self.items()
        return item


def test_the_owner_runs_on_every_invocation_and_a_duplicate_replays_its_result():
    flow = Workflow()
    flow.answer = {"Status": "PENDING"}
    assert flow(envelope(token="t-1")) == {"Status": "PENDING"}
    claimed = flow.record()
    assert claimed["status"]["S"] == INPROGRESS and claimed["owner"]["S"] == arn()
    # the lease: IDEMPOTENCY_IN_PROGRESS_SECONDS, not the invocation's minute
    assert int(claimed["in_progress_until"]["N"]) >= Clock.now * 1000 + LEASE_MS
    assert int(claimed["expires_at"]["N"]) * 1000 >= int(claimed["in_progress_until"]["N"])
    assert flow(envelope(token="t-2")) == {"Status": "PENDING"}  # a replay of the owner: never refused
    flow.answer = {"Status": "SUCCEEDED", "Result": '{"receipt": 1}'}
    flow(envelope(token="t-3"))
    assert flow.record()["status"]["S"] == COMPLETED
    duplicate = envelope(execution=arn("run-2", "9e9e"))
    assert flow(duplicate) == {"Status": "SUCCEEDED", "Result": '{"receipt": 1}'}
    assert flow.runs == [arn()] * 3


def test_a_duplicate_of_a_live_execution_fails_as_in_progress_without_running():
    flow = Workflow()
    flow.answer = {"Status": "PENDING"}
    flow(envelope())
    answer = flow(envelope(execution=arn("run-2", "9e9e")))
    assert answer["Status"] == "FAILED" and set(answer) == {"Status", "Error"}
    assert answer["Error"]["ErrorType"].endswith("IdempotencyAlreadyInProgressError")
    assert flow.runs == [arn()]


def test_a_failed_execution_releases_and_the_next_delivery_runs():
    flow = Workflow()
    flow.answer = {"Status": "FAILED", "Error": {"ErrorType": "ValueError", "ErrorMessage": "declined"}}
    flow(envelope())
    assert flow.items() == []
    flow(envelope(execution=arn("run-2", "9e9e")))
    assert len(flow.runs) == 2


@pytest.mark.parametrize("answer", [RuntimeError("checkpoint lost"), {"Status": "RETRY"}, "nonsense"])
def test_a_raise_or_an_answer_the_service_would_not_take_keeps_the_claim(answer):
    flow = Workflow()
    flow.answer = answer
    if isinstance(answer, BaseException):
        with pytest.raises(RuntimeError):
            flow(envelope())
    else:
        flow(envelope())
    assert flow.record()["status"]["S"] == INPROGRESS
    refused = flow(envelope(execution=arn("run-2", "9e9e")))
    assert refused["Status"] == "FAILED" and len(flow.runs) == 1


@pytest.mark.parametrize("result", ["", None])
def test_a_result_the_sdk_checkpointed_completes_without_it_and_duplicates_fail_saying_so(result):
    flow = Workflow()
    flow.answer = {"Status": "SUCCEEDED", **({} if result is None else {"Result": result})}
    flow(envelope())
    assert flow.record()["status"]["S"] == COMPLETED
    answer = flow(envelope(execution=arn("run-2", "9e9e")))
    assert answer["Error"]["ErrorType"].endswith("IdempotencyResultTooLargeError") and len(flow.runs) == 1


def test_a_payload_mismatch_and_a_required_key_are_failed_answers_with_no_run():
    flow = Workflow(IDEMPOTENCY_PAYLOAD_JMESPATH="amount", IDEMPOTENCY_REQUIRE_KEY="true")
    flow(envelope({"orderId": "o-1", "amount": 5}))
    other = flow(envelope({"orderId": "o-1", "amount": 6}, execution=arn("run-2", "9e9e")))
    assert other["Error"]["ErrorType"].endswith("IdempotencyPayloadMismatchError")
    keyless = flow(envelope({"amount": 6}, execution=arn("run-3", "8e8e")))
    assert keyless["Error"]["ErrorType"].endswith("IdempotencyKeyError")
    assert len(flow.runs) == 1


def test_a_store_that_fails_raises_so_the_service_invokes_again_and_nothing_runs():
    flow = Workflow()
    flow.cycle.environment.refusal = "this environment runs no more handlers"
    with pytest.raises(IdempotencyPersistenceLayerError):
        flow(envelope())
    assert flow.runs == []


def test_a_wait_on_a_live_execution_ends_in_the_replay_of_its_result():
    flow = Workflow(IDEMPOTENCY_WAIT_SECONDS="5")
    flow.answer = {"Status": "PENDING"}
    flow(envelope())
    polls = []

    def finish(seconds: float) -> None:  # the owner succeeds while the duplicate waits
        polls.append(seconds)
        if len(polls) == 1:
            flow.answer = {"Status": "SUCCEEDED", "Result": '"done"'}
            flow(envelope(token="t-2"))
    flow.cycle.sleep = finish
    assert flow(envelope(execution=arn("run-2", "9e9e"))) == {"Status": "SUCCEEDED", "Result": '"done"'}
    assert flow.runs == [arn(), arn()]


def test_a_whole_events_record_of_the_same_key_replays_as_json_text():
    flow = Workflow()
    key = plan(flow.config, _keys(flow.config), envelope()).units[0].key
    inv = Invocation(60_000)
    flow.cycle.run(inv, key, lambda: {"receipt": 7})
    assert flow(envelope()) == {"Status": "SUCCEEDED", "Result": '{"receipt": 7}'}
    assert flow.runs == []


def test_the_owner_whose_lease_ran_out_and_was_taken_over_is_refused():
    flow = Workflow(IDEMPOTENCY_IN_PROGRESS_SECONDS="60")
    flow.answer = {"Status": "PENDING"}
    flow(envelope())
    flow.clock.now += 3600  # the lease (60 s) is long gone: IDEMPOTENCY_IN_PROGRESS_SECONDS was set too short
    flow(envelope(execution=arn("run-2", "9e9e")))
    answer = flow(envelope(token="t-2"))
    assert answer["Error"]["ErrorType"].endswith("IdempotencyAlreadyInProgressError")
    assert flow.runs == [arn(), arn("run-2", "9e9e")]


@pytest.mark.parametrize(("counts", "outcome"), [
    ({"FirstExecutions": 1}, "execution_claimed"), ({"OwnerInvocations": 1}, "execution_owner"),
    ({"OwnerInvocations": 1, "ExecutionsCompleted": 1}, "execution_completed"),
    ({"FirstExecutions": 1, "ExecutionsCompleted": 1, "CompletionFailures": 1}, "not_completed"),
    ({"OwnerInvocations": 1, "Releases": 1}, "execution_released"),
    ({"Replays": 1}, "replay"), ({"InProgressConflicts": 1}, "in_progress"),
])
def test_each_outcome_of_an_execution(counts, outcome):
    tally = metrics.Tally()
    tally.kind = "execution"
    tally.add_many(**counts)
    assert metrics.outcome(tally) == outcome


def test_the_invocations_counts_name_what_happened():
    flow = Workflow()
    flow.answer = {"Status": "PENDING"}
    tallies = [metrics.Tally() for _ in range(3)]
    flow(envelope(), tallies[0])
    flow.answer = {"Status": "SUCCEEDED", "Result": "1"}
    flow(envelope(token="t-2"), tallies[1])
    flow(envelope(execution=arn("run-2", "9e9e")), tallies[2])
    assert [metrics.outcome(t) for t in tallies] == ["execution_claimed", "execution_completed", "replay"]
    assert [t.kind for t in tallies] == ["execution"] * 3


# -- what the review found: the owner's writes, and the owner invoked again --------------------------------------

class Refusing(MemoryTransport):
    """Refuses `operation` with a 500 (a transient failure the client retries, then gives up on) while `on`."""

    def __init__(self, db: MemoryDynamoDB, operation: str) -> None:
        super().__init__(db)
        self.operation, self.on = operation, True

    def call(self, operation: str, params: dict, deadline: Any = None) -> dict:
        from idempotency_layer.stores.dynamodb import DynamoDBError

        if self.on and operation == self.operation:
            self.requests.append(operation)
            raise DynamoDBError(operation, "InternalServerError", "down", status=500)
        return super().call(operation, params, deadline)


def refusing(flow: Workflow, operation: str) -> Refusing:
    transport = Refusing(flow.db, operation)
    flow.cycle.store = DynamoDBStore(transport, "orders", flow.config.attributes, key_prefix=flow.config.key_prefix)
    return transport


@pytest.mark.parametrize(("operation", "answer"), [
    ("UpdateItem", {"Status": "SUCCEEDED", "Result": '"done"'}),
    ("DeleteItem", {"Status": "FAILED", "Error": {"ErrorType": "ValueError"}}),
])
def test_an_owners_write_that_does_not_land_fails_the_invocation_so_the_service_invokes_it_again(operation, answer):
    flow = Workflow()
    transport = refusing(flow, operation)
    flow.answer = answer
    with pytest.raises(IdempotencyPersistenceLayerError, match="invokes the execution again"):
        flow(envelope(), remaining_ms=1200)  # (the completion is retried until shortly before the deadline)
    assert flow.record()["status"]["S"] == INPROGRESS  # still the owner's: no duplicate runs meanwhile
    assert flow(envelope(execution=arn("run-2", "9e9e")))["Status"] == "FAILED"
    transport.on = False
    assert flow(envelope(token="t-2")) == answer  # the service's next invocation: the SDK replays, the write lands
    assert flow.items() == [] if operation == "DeleteItem" else flow.record()["status"]["S"] == COMPLETED
    assert flow.runs == [arn(), arn()]


@pytest.mark.parametrize("result", ['{"receipt": 1}', ""])
def test_the_owner_invoked_again_after_its_completion_runs_and_is_never_refused(result):
    flow = Workflow(IDEMPOTENCY_LOCAL_CACHE_SIZE="10")
    flow.answer = {"Status": "SUCCEEDED", "Result": result}
    flow(envelope())
    tally = metrics.Tally()
    assert flow(envelope(token="t-2"), tally) == flow.answer  # (an answer lost after the completion landed)
    assert flow.runs == [arn(), arn()] and metrics.outcome(tally) == "execution_completed"
    assert tally.counts.get("OwnerInvocations") == 1 and not tally.counts.get("Replays")
    duplicate = flow(envelope(execution=arn("run-2", "9e9e")))
    assert duplicate["Status"] == ("SUCCEEDED" if result else "FAILED") and len(flow.runs) == 2


@pytest.mark.parametrize(("answer", "stays"), [
    ({"Status": "SUCCEEDED", "Result": {"receipt": 1}}, True),  # not text: the service would refuse it
    ({"Status": "SUCCEEDED", "Result": None}, False),  # empty, as after the SDK checkpointed the result
    ({"Status": "SUCCEEDED"}, False),
])
def test_a_succeeded_answer_is_completed_only_with_text_or_an_empty_result(answer, stays):
    flow = Workflow()
    flow.answer = answer
    flow(envelope())
    assert flow.record()["status"]["S"] == (INPROGRESS if stays else COMPLETED)


def test_requests_per_invocation_as_docs_durable_md_gives_them():
    flow = Workflow()

    def sent(event: Any) -> list[str]:
        flow.transport.requests.clear()
        flow(event)
        return list(flow.transport.requests)

    flow.answer = {"Status": "PENDING"}
    assert sent(envelope()) == ["PutItem"]  # the first invocation: its claim
    flow.answer = {"Status": "SUCCEEDED", "Result": "1"}
    assert sent(envelope(token="t-2")) == ["PutItem", "UpdateItem"]  # the owner again (its claim read back), done
    assert sent(envelope(execution=arn("run-2", "9e9e"))) == ["PutItem"]  # a duplicate, replayed
    flow.answer = {"Status": "FAILED"}
    assert sent(envelope({"orderId": "o-2"}, execution=arn("run-3", "7e7e"))) == ["PutItem", "DeleteItem"]
