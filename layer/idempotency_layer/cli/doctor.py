"""`doctor`: checks the settings, the table and the permissions the layer needs (and, with `--function`, a
deployed function and its event source mappings), each one line: PASS, WARN or FAIL, with the fix.

Table checks use the layer's own DynamoDB client (it signs any JSON 1.0 operation: DescribeTable,
DescribeTimeToLive); the five permissions are proven with the layer's own store on a probe key that is
removed again. Only `--function` needs boto3 (the Lambda and SQS APIs)."""

from __future__ import annotations

import os
import time
from collections import namedtuple

from .. import codec
from ..errors import IdempotencyConfigurationError, IdempotencyPersistenceLayerError
from ..stores.dynamodb import DynamoDBError
from . import settings as _settings

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, NamedTuple

PASS, WARN, FAIL = "PASS", "WARN", "FAIL"
WRAPPER = "/opt/idempotency-wrapper"
SUPPORTED = (10, 14)  # python3.10 to python3.14, the runtimes the layer is built and tested for
PROBE_SECONDS = 120  # how long a probe record could outlive a doctor that dies mid-probe
_CREDENTIAL_CODES = frozenset({"NoCredentialsError", "UnrecognizedClientException", "InvalidSignatureException",
                               "ExpiredTokenException", "MissingAuthenticationTokenException",
                               "InvalidClientTokenId", "SignatureDoesNotMatch"})


# Refusals that a grant (or the right credentials) fixes; any other failure proves nothing about the role.
_DENIALS = frozenset({"AccessDeniedException", "UnrecognizedClientException", "MissingAuthenticationTokenException",
                      "InvalidSignatureException", "KMSAccessDeniedException"})


if TYPE_CHECKING:
    class _CheckFields(NamedTuple):
        name: str
        status: str  # PASS, WARN or FAIL
        detail: str
        fix: str | None = None
else:
    _CheckFields = namedtuple("Check", ("name", "status", "detail", "fix"), defaults=(None,))


class Check(_CheckFields):
    __slots__ = ()


def _code(error: BaseException) -> str:
    cause = error if isinstance(error, DynamoDBError) else error.__cause__
    return cause.code if isinstance(cause, DynamoDBError) else type(error).__name__


# -- the function and its event source mappings (pure: tested without the Lambda API) -----------------------

def wrapper_check(wrapper: str | None, package: str) -> Check:
    """AWS_LAMBDA_EXEC_WRAPPER for `package`: "zip" (the layer, so exactly /opt/idempotency-wrapper), "image"
    (the wheel, installed anywhere; unset when the wrapper is the image's ENTRYPOINT) or "local" (either)."""
    name = "AWS_LAMBDA_EXEC_WRAPPER"
    blank = not (wrapper or "").strip()
    installed = (wrapper is not None and not blank and wrapper.startswith("/")
                 and wrapper.rsplit("/", 1)[-1] == "idempotency-wrapper")
    image_fix = (f"set {name} to the absolute path of idempotency-wrapper in the image (e.g. "
                 "/var/lang/bin/idempotency-wrapper after pip install of the wheel), or make it the ENTRYPOINT")
    if package == "zip":
        if wrapper == WRAPPER:
            return Check("wrapper", PASS, f"{name}={WRAPPER}")
        said = "not set" if wrapper is None else f"{wrapper!r}"
        return Check("wrapper", FAIL, f"{name} is {said}: the layer never runs",
                     f"set {name}={WRAPPER} in the function's environment")
    if package == "image":
        if installed:
            return Check("wrapper", PASS, f"{name}={wrapper}")
        if blank:
            return Check("wrapper", WARN, f"a container image without {name}: the wrapper must be its ENTRYPOINT "
                         "(not checked)", image_fix)
        return Check("wrapper", FAIL, f"{name} is {wrapper!r}: not an absolute path to idempotency-wrapper, so "
                     "the layer never runs", image_fix)
    if installed:
        return Check("wrapper", PASS, f"{name}={wrapper}")
    if blank:
        return Check("wrapper", WARN, f"{name} is not in these settings",
                     f"the function needs {name}={WRAPPER} (a layer) or the path of idempotency-wrapper in its "
                     "image (or doctor --function NAME)")
    return Check("wrapper", FAIL, f"{name} is {wrapper!r}: not an absolute path to idempotency-wrapper, so the "
                 "layer never runs", f"set {name}={WRAPPER} (a layer) or the absolute path of idempotency-wrapper "
                 "in the image")


def next_wrapper_check(value: str | None) -> Check | None:
    """IDEMPOTENCY_NEXT_WRAPPER: the wrapper execs it, so it must be an absolute path (exit 126 otherwise)."""
    if value is None or not value.strip():
        return None
    if value.startswith("/"):
        return Check("next wrapper", PASS, f"IDEMPOTENCY_NEXT_WRAPPER={value}")
    return Check("next wrapper", FAIL, f"IDEMPOTENCY_NEXT_WRAPPER={value!r} is not an absolute path: the wrapper "
                 "exits 126 and no invocation runs", "set it to the absolute path of the next wrapper, or unset it")


def _runtime_check(runtime: str | None) -> Check:
    minor = runtime[len("python3."):] if runtime and runtime.startswith("python3.") else ""
    if minor.isdigit() and SUPPORTED[0] <= int(minor) <= SUPPORTED[1]:
        return Check("runtime", PASS, runtime or "")
    return Check("runtime", FAIL, f"{runtime or 'no runtime'}: the layer supports python3.{SUPPORTED[0]} to "
                 f"python3.{SUPPORTED[1]}", f"set the function's runtime to python3.{SUPPORTED[0]} - "
                 f"python3.{SUPPORTED[1]} (e.g. aws lambda update-function-configuration --runtime python3.12)")


def _architecture_check(arn: str, architecture: str) -> Check:
    name = arn.split(":layer:")[-1].split(":")[0]
    other = "arm64" if architecture == "x86_64" else "x86_64"
    if name.endswith(f"-{architecture}"):
        return Check("architecture", PASS, f"{architecture}, layer {name}")
    if name.endswith(f"-{other}"):
        return Check("architecture", FAIL, f"the function runs on {architecture}, the layer {name} is built for "
                     f"{other}: its compiled parts do not load", f"attach the {name[:-len(other)]}{architecture} "
                     "layer's version ARN")
    return Check("architecture", WARN, f"the function runs on {architecture}; layer {name}'s name says neither "
                 "x86_64 nor arm64", f"make sure the layer was built for {architecture}")


def function_checks(configuration: dict[str, Any], layer_name: str) -> list[Check]:
    """What GetFunctionConfiguration says about the layer's place in the function."""
    checks = []
    image = configuration.get("PackageType") == "Image"
    if not image:
        checks.append(_runtime_check(configuration.get("Runtime")))
    arns = [layer.get("Arn", "") for layer in configuration.get("Layers") or []]
    named = [arn for arn in arns if layer_name in arn.split(":layer:")[-1]]
    if named:
        checks.append(Check("layer", PASS, f"attached: {named[0]}"))
        architecture = (configuration.get("Architectures") or ["x86_64"])[0]
        checks.append(_architecture_check(named[0], architecture))
    elif image:
        checks.append(Check("layer", WARN, "a container image has no layers: skipped (install the wheel in it)"))
    else:
        checks.append(Check("layer", FAIL, f"no layer whose name contains {layer_name!r} among {len(arns)} layer(s)",
                            "attach the idempotency layer's version ARN (or pass --layer-name with its name)"))
    variables = (configuration.get("Environment") or {}).get("Variables") or {}
    checks.append(wrapper_check(variables.get("AWS_LAMBDA_EXEC_WRAPPER"), "image" if image else "zip"))
    following = next_wrapper_check(variables.get("IDEMPOTENCY_NEXT_WRAPPER"))
    if following is not None:
        checks.append(following)
    role = configuration.get("Role")
    checks.append(Check("role", PASS, role) if role else
                  Check("role", FAIL, "the function names no role", "give the function an execution role"))
    return checks


def timeout_check(timeout: int, wait_seconds: float) -> Check:
    if wait_seconds >= timeout:
        return Check("timeout", WARN, f"{timeout} s, but IDEMPOTENCY_WAIT_SECONDS={wait_seconds:g} is as long: a "
                     "waiting copy times out before its wait ends", "set IDEMPOTENCY_WAIT_SECONDS below the timeout")
    return Check("timeout", PASS, f"{timeout} s")


def durable_check(durable: Any, config: Any, mappings: int) -> Check | None:
    """A durable function's settings against its DurableConfig (GetFunctionConfiguration): the claim of an
    execution must last as long as the execution may, which only the Lambda API can tell. None: nothing to say."""
    if not isinstance(durable, dict):
        if not config.durable_executions:
            return None
        return Check("durable", WARN, "IDEMPOTENCY_DURABLE=execution, but the function is not a durable function "
                     "(no DurableConfig): the setting changes nothing", "unset IDEMPOTENCY_DURABLE")
    timeout = durable.get("ExecutionTimeout")
    if not config.durable_executions:
        if mappings:
            return Check("durable", WARN, f"a durable function fed by {mappings} event source mapping(s) under "
                         "IDEMPOTENCY_DURABLE=pass: every delivery starts a new execution, and none is claimed",
                         "set IDEMPOTENCY_DURABLE=execution and IDEMPOTENCY_IN_PROGRESS_SECONDS="
                         f"{timeout or 'its execution timeout'} (docs/durable.md), or put a dispatcher in front")
        return Check("durable", PASS, "a durable function; IDEMPOTENCY_DURABLE=pass: its invocations run unclaimed")
    if not isinstance(timeout, int):
        return Check("durable", WARN, "IDEMPOTENCY_DURABLE=execution; the function's DurableConfig names no "
                     "ExecutionTimeout to compare IDEMPOTENCY_IN_PROGRESS_SECONDS with",
                     "make sure IDEMPOTENCY_IN_PROGRESS_SECONDS is at least the durable execution timeout")
    if config.in_progress_seconds < timeout:
        return Check("durable", FAIL, f"IDEMPOTENCY_IN_PROGRESS_SECONDS={config.in_progress_seconds} is shorter than "
                     f"the durable execution timeout ({timeout} s): a duplicate delivered after an execution's claim "
                     "ended runs the workflow again", f"set IDEMPOTENCY_IN_PROGRESS_SECONDS={timeout}")
    return Check("durable", PASS, f"IDEMPOTENCY_DURABLE=execution: a claim lasts {config.in_progress_seconds} s, the "
                 f"durable execution timeout is {timeout} s")


def mapping_kind(mapping: dict[str, Any]) -> str:
    arn = mapping.get("EventSourceArn") or ""
    if mapping.get("SelfManagedEventSource") or ":kafka:" in arn:
        return "Kafka"
    for marker, kind in ((":sqs:", "SQS"), (":kinesis:", "Kinesis"), (":dynamodb:", "DynamoDB Streams"),
                         (":mq:", "Amazon MQ")):
        if marker in arn:
            return kind
    return "other"


def mapping_checks(mapping: dict[str, Any], timeout: int, queue: dict[str, str] | None = None,
                   fail_whole_batch: bool = False) -> list[Check]:
    """What makes one event source mapping's batches safe under the layer. `queue`: an SQS queue's attributes
    (GetQueueAttributes), or None when they could not be read. `fail_whole_batch`: IDEMPOTENCY_BATCH_RESPONSE=fail,
    under which the layer never relies on a partial batch response, so a mapping need not honour one."""
    kind = mapping_kind(mapping)
    uuid = mapping.get("UUID", "?")
    name = f"mapping {uuid} ({kind})"
    update = f"aws lambda update-event-source-mapping --uuid {uuid}"
    if kind == "other":
        return [Check(name, PASS, "not a batch source the layer serves per record")]
    if kind == "Amazon MQ":  # no partial batch response exists: the layer always fails the invocation instead
        return [Check(name, PASS, "no partial batch response on Amazon MQ: a batch with a message that cannot run "
                      "fails the invocation after the others completed, and the broker redelivers it")]
    checks = []
    fail = fail_whole_batch
    if "ReportBatchItemFailures" in (mapping.get("FunctionResponseTypes") or []):
        checks.append(Check(name, PASS, "ReportBatchItemFailures is on"))
    elif fail:
        checks.append(Check(name, PASS, "ReportBatchItemFailures is off and IDEMPOTENCY_BATCH_RESPONSE=fail: a batch "
                            "with a record that must come back fails the invocation and is redelivered whole"))
    else:
        checks.append(Check(name, FAIL, "ReportBatchItemFailures is off: Lambda ignores the layer's partial batch "
                            "response and retries or drops whole batches",
                            f"{update} --function-response-types ReportBatchItemFailures, or set "
                            "IDEMPOTENCY_BATCH_RESPONSE=fail"))
    if kind == "Kafka":
        if mapping.get("ProvisionedPollerConfig"):
            checks.append(Check(name, PASS, "provisioned mode"))
        elif fail:
            checks.append(Check(name, PASS, "not in provisioned mode, and IDEMPOTENCY_BATCH_RESPONSE=fail needs no "
                                "partial batch response"))
        else:
            checks.append(Check(name, FAIL, "not in provisioned mode: partial batch responses need it on Kafka",
                                f"{update} --provisioned-poller-config MinimumPollers=1,MaximumPollers=2, or set "
                                "IDEMPOTENCY_BATCH_RESPONSE=fail"))
    if kind == "SQS":
        if queue is None:
            checks.append(Check(name, FAIL, "the queue's attributes could not be read (GetQueueAttributes)",
                                "run doctor with credentials that may call sqs:GetQueueAttributes"))
            return checks
        visibility = int(queue.get("VisibilityTimeout", "30"))
        if visibility >= 6 * timeout:
            checks.append(Check(name, PASS, f"visibility timeout {visibility} s >= 6 x the {timeout} s timeout"))
        else:
            checks.append(Check(name, FAIL, f"visibility timeout {visibility} s < 6 x the function's {timeout} s "
                                "timeout: messages come back while their batch may still run",
                                f"aws sqs set-queue-attributes --queue-url {queue.get('QueueUrl', '<url>')} "
                                f"--attributes VisibilityTimeout={6 * timeout}"))
        if queue.get("RedrivePolicy"):
            checks.append(Check(name, PASS, "a dead-letter queue (RedrivePolicy)"))
        else:
            checks.append(Check(name, FAIL, "no dead-letter queue: a message that always fails is retried until "
                                "it expires", "set a RedrivePolicy with a deadLetterTargetArn and maxReceiveCount"))
        return checks
    destination = ((mapping.get("DestinationConfig") or {}).get("OnFailure") or {}).get("Destination")
    if destination:
        checks.append(Check(name, PASS, f"on-failure destination {destination}"))
    else:
        checks.append(Check(name, FAIL, "no on-failure destination: a record that always fails blocks its shard "
                            "until it expires", f"{update} --destination-config "
                            "'{\"OnFailure\":{\"Destination\":\"<queue or topic ARN>\"}}'"))
    return checks


def _client(session: Any, service: str, **options: Any) -> Any:
    from botocore.config import Config

    # A stalled endpoint must end in a FAIL line within seconds, not botocore's 60 s reads retried for minutes.
    # Two attempts in all (Config's "max_attempts" counts retries: 2 would be three 10 s reads).
    return session.client(service, config=Config(connect_timeout=5, read_timeout=10,
                                                 retries={"total_max_attempts": 2, "mode": "standard"}), **options)


# botocore's read timeout bounds each read, not an answer trickled a byte at a time: each call is bounded whole.
CALL_SECONDS = 30


def _bounded(call: Any) -> Any:
    from ..deadline import within

    return within(CALL_SECONDS, call, "idempotency-doctor")


class NotLambda(Exception):
    """The Lambda endpoint answered with something that is not a function's configuration."""


def _deployed(name: str, region: str | None) -> tuple[dict[str, Any], list[dict[str, Any]], Any]:
    import boto3  # only `doctor --function` needs it

    # boto3 reads AWS_DEFAULT_REGION only; the layer and the README name AWS_REGION too (Lambda sets both).
    session = boto3.session.Session(region_name=region or os.environ.get("AWS_REGION") or None)
    client = _client(session, "lambda")
    configuration = _bounded(lambda: client.get_function_configuration(FunctionName=name))
    if not (isinstance(configuration, dict) and isinstance(configuration.get("FunctionArn"), str)
            and isinstance(configuration.get("FunctionName"), str)):
        raise NotLambda("GetFunctionConfiguration")

    def pages() -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        for page in client.get_paginator("list_event_source_mappings").paginate(FunctionName=name):
            found.extend(page.get("EventSourceMappings", []))
        return found

    mappings = _bounded(pages)
    if not all(isinstance(mapping, dict) for mapping in mappings):
        raise NotLambda("ListEventSourceMappings")
    return configuration, mappings, session


_MISSING_QUEUE = frozenset({"QueueDoesNotExist", "AWS.SimpleQueueService.NonExistentQueue"})
_THROTTLED = frozenset({"Throttling", "ThrottlingException", "TooManyRequestsException", "RequestLimitExceeded",
                        "ServiceUnavailable", "ServiceUnavailableException", "InternalFailure",
                        "InternalServerError", "ServiceException"})


def aws_failure(error: BaseException) -> tuple[str, str]:
    """What a boto3 call's failure was (an error code or type) and the kind of fix it needs: "missing",
    "transient" (a timeout, a 5xx, a throttle: retry) or "access" (credentials, permissions, the name)."""
    response = getattr(error, "response", None)
    if isinstance(response, dict):  # a ClientError: the service answered
        answer: dict[str, Any] = response["Error"] if isinstance(response.get("Error"), dict) else {}
        code = str(answer.get("Code") or type(error).__name__)
        status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode") or 0
        if code in _MISSING_QUEUE or code == "ResourceNotFoundException":
            return code, "missing"
        if code in _THROTTLED or (isinstance(status, int) and status >= 500):
            return code, "transient"
        return code, "access"
    kind = type(error).__name__
    if kind in ("NoCredentialsError", "PartialCredentialsError", "NoRegionError", "ProfileNotFound"):
        return kind, "access"
    return kind, "transient"  # timeouts, refused connections, broken answers: the endpoint did not answer


def _queue(session: Any, arn: str) -> tuple[dict[str, str] | None, Check | None]:
    """An SQS queue's attributes, or None and what kept doctor from reading them."""
    parts = arn.split(":")
    try:
        sqs = _client(session, "sqs", region_name=parts[3])
        url = _bounded(lambda: sqs.get_queue_url(QueueName=parts[5], QueueOwnerAWSAccountId=parts[4])["QueueUrl"])
        attributes = _bounded(lambda: sqs.get_queue_attributes(
            QueueUrl=url, AttributeNames=["VisibilityTimeout", "RedrivePolicy"]).get("Attributes", {}))
        return {**attributes, "QueueUrl": url}, None
    except Exception as error:
        code, kind = aws_failure(error)
        if kind == "missing":
            return None, Check("queue", FAIL, f"the mapping's queue {arn} does not exist ({code}): the mapping "
                               "delivers nothing", "delete the mapping, or create the queue again")
        if kind == "transient":
            return None, Check("queue", FAIL, f"the queue's attributes could not be read ({code})",
                               "the SQS endpoint did not answer; retry doctor")
        return None, Check("queue", FAIL, f"the queue's attributes could not be read ({code})",
                           "run doctor with credentials that may call sqs:GetQueueUrl and sqs:GetQueueAttributes")


def _not_lambda(operation: str) -> Check:
    return Check("function", FAIL, f"{operation}'s answer is not one this doctor can read (not a Lambda answer)",
                 "check the endpoint (AWS_ENDPOINT_URL_LAMBDA / AWS_ENDPOINT_URL) and the Region: it should be "
                 "Lambda's; the function itself was not checked")


# -- the table and the permissions ----------------------------------------------------------------------------

def _unreadable() -> Check:
    return Check("table", FAIL, "DescribeTable's answer is not one this doctor can read (a 200 without a table "
                 "description)", "check the endpoint (AWS_ENDPOINT_URL_DYNAMODB / --endpoint-url): it should be "
                 "DynamoDB")


def _describe_failed(error: DynamoDBError, config: Any, transport: Any) -> tuple[list[Check], bool]:
    """What a DescribeTable that failed says, and whether the permission probe can still run."""
    table, key = config.table, config.attributes.key
    if error.code in _CREDENTIAL_CODES:
        said = "none found: nothing was sent" if error.code == "NoCredentialsError" else (
            f"DynamoDB refused them: {error.code}")
        return [Check("credentials", FAIL, said,
                      "export the credentials of the function's role (or a profile), and its Region")], False
    if error.code == "ResourceNotFoundException":
        return [Check("table", FAIL, f"no table {table!r} in {transport.region}",
                      f"create it: aws dynamodb create-table --table-name {table} --attribute-definitions "
                      f"AttributeName={key},AttributeType=S --key-schema AttributeName={key},KeyType=HASH "
                      "--billing-mode PAY_PER_REQUEST --sse-specification Enabled=true (or set "
                      "IDEMPOTENCY_TABLE / --table)")], False
    if error.code != "AccessDeniedException":
        return [Check("table", FAIL, f"DescribeTable failed: {error.code}: {error.message}",
                      "retry doctor (a timeout, a throttle or a 5xx passes); else check the Region, the endpoint "
                      "and the network")], False
    return [Check("table", WARN, "these credentials may not call DescribeTable: schema and TTL not checked",
                  "run doctor with dynamodb:DescribeTable and DescribeTimeToLive (the function does not "
                  "need them)")], True


def table_checks(config: Any, transport: Any) -> tuple[list[Check], bool]:
    """Credentials, the table, its key schema and TTL. Also whether the permission probe can run."""
    a = config.attributes
    table = config.table
    try:
        description = transport.call("DescribeTable", {"TableName": table})["Table"]
    except DynamoDBError as error:
        return _describe_failed(error, config, transport)
    except (KeyError, TypeError):  # a 200 whose body has no Table
        return [_unreadable()], False
    try:
        name, status = description["TableName"], description["TableStatus"]
        schema = {k["KeyType"]: k["AttributeName"] for k in description["KeySchema"]}
        types = {d["AttributeName"]: d["AttributeType"] for d in description.get("AttributeDefinitions", [])}
        if not all(isinstance(text, str) for text in (name, status, *schema, *schema.values(), *types,
                                                      *types.values())):
            raise TypeError("a name that is not a string")
    except (KeyError, TypeError, AttributeError, ValueError):
        return [_unreadable()], False
    checks = [Check("credentials", PASS, f"accepted in {transport.region} at {transport.endpoint}")]
    if status in ("ACTIVE", "UPDATING"):
        checks.append(Check("table", PASS, f"{name} ({status})"))
    elif status == "CREATING":
        checks.append(Check("table", WARN, f"{name} is still being created", "wait until it is ACTIVE"))
    else:  # DELETING, ARCHIVING, ARCHIVED, INACCESSIBLE_ENCRYPTION_CREDENTIALS: no request of the layer will work
        checks.append(Check("table", FAIL, f"{name} is {status}: the layer's requests fail",
                            "use an ACTIVE table (for INACCESSIBLE_ENCRYPTION_CREDENTIALS, restore the table's KMS "
                            "key access)"))
    expected = {"HASH": a.key} if a.sort_key is None else {"HASH": a.key, "RANGE": a.sort_key}
    said = ", ".join(f"{name} ({kind}, {types.get(name, '?')})" for kind, name in schema.items())
    want = f"{a.key} (HASH, S)" + (f", {a.sort_key} (RANGE, S)" if a.sort_key else "")
    usable = status in ("ACTIVE", "UPDATING", "CREATING")
    if schema != expected:
        checks.append(Check("key schema", FAIL, f"the table has {said}; the settings expect {want}",
                            "set IDEMPOTENCY_KEY_ATTR / IDEMPOTENCY_SORT_KEY_ATTR to the table's key, or use a "
                            "table with that key"))
        usable = False
    elif not all(types.get(name) == "S" for name in expected.values()):
        checks.append(Check("key schema", FAIL, f"the table has {said}; the layer's keys are strings",
                            f"use a table whose key attributes are strings (AttributeType S): {want}"))
        usable = False
    else:
        checks.append(Check("key schema", PASS, said))
    try:
        ttl = transport.call("DescribeTimeToLive", {"TableName": table}).get("TimeToLiveDescription", {})
        if not isinstance(ttl, dict):
            raise TypeError("TimeToLiveDescription")
    except DynamoDBError as error:
        checks.append(Check("ttl", WARN, f"DescribeTimeToLive failed: {error.code}", "check TTL in the console"))
        return checks, usable
    except (KeyError, TypeError, AttributeError):
        checks.append(Check("ttl", WARN, "DescribeTimeToLive's answer is not one this doctor can read",
                            "check TTL in the console"))
        return checks, usable
    enable = (f"aws dynamodb update-time-to-live --table-name {table} --time-to-live-specification "
              f"Enabled=true,AttributeName={a.expires_at}")
    if ttl.get("TimeToLiveStatus") in ("ENABLED", "ENABLING") and ttl.get("AttributeName") == a.expires_at:
        checks.append(Check("ttl", PASS, f"enabled on {a.expires_at}"))
    elif ttl.get("TimeToLiveStatus") in ("ENABLED", "ENABLING"):
        checks.append(Check("ttl", WARN, f"enabled on {ttl.get('AttributeName')!r}, not on {a.expires_at!r}: "
                            "records are never deleted", f"disable it, then {enable}"))
    else:
        checks.append(Check("ttl", WARN, f"not enabled ({ttl.get('TimeToLiveStatus', 'DISABLED')}): expired "
                            "records stay in the table for ever (the layer still ignores them)", enable))
    return checks, usable


def permission_checks(store: Any, prefix: str) -> list[Check]:
    """PutItem, UpdateItem, GetItem and DeleteItem, as the layer makes them, on a probe key removed again, and
    BatchGetItem (a warning: only a batch's pre-check needs it).
    A refused condition proves the permission as well as success does (DynamoDB checks access first)."""
    suffix = os.urandom(8).hex()
    key, owner = f"{prefix}#doctor-probe-{suffix}", f"doctor-{suffix}"
    now = time.time()
    fix = "grant the function's role dynamodb:{} on table " + repr(store.table)
    checks = []
    claimed = False
    denied: set[str] = set()

    def probe(operation: str, action: Any) -> Any:
        try:
            done = action()
        except (IdempotencyPersistenceLayerError, DynamoDBError) as error:
            code = _code(error)
            if code in _DENIALS:
                denied.add(operation)
                checks.append(Check(f"permission {operation}", FAIL, f"{code} on probe key {key}",
                                    fix.format(operation)))
            else:  # a throttle, a 5xx, a timeout: says nothing about the role
                checks.append(Check(f"permission {operation}", FAIL, f"could not be proven ({code}) on probe key "
                                    f"{key}", f"the table answered {code}: retry doctor"))
            return None
        checks.append(Check(f"permission {operation}", PASS, f"probe key {key}"))
        return done

    claimed = probe("PutItem", lambda: store.claim(key, owner, now, int(now * 1000) + PROBE_SECONDS * 1000,
                                                   int(now) + PROBE_SECONDS) is None)
    probe("UpdateItem", lambda: store.complete(key, owner, codec.Encoded(codec.DONE, None), int(now) + PROBE_SECONDS))
    probe("GetItem", lambda: store.get(key))
    released = probe("DeleteItem", lambda: store.release(key, owner))
    # BatchGetItem serves only a batch's pre-check, and the layer works without it: a warning, never a failure.
    try:
        store.read([key])
    except (IdempotencyPersistenceLayerError, DynamoDBError) as error:
        code = _code(error)
        if code in _DENIALS:
            checks.append(Check("permission BatchGetItem", WARN, f"{code} on probe key {key}: each record of a "
                                "redelivered batch is claimed instead of read in one request",
                                fix.format("BatchGetItem")))
        else:
            checks.append(Check("permission BatchGetItem", WARN, f"could not be proven ({code}) on probe key "
                                f"{key}", f"the table answered {code}: retry doctor"))
    else:
        checks.append(Check("permission BatchGetItem", PASS, f"probe key {key}"))
    if claimed and not released:
        checks.append(Check("probe record", WARN, f"{key} stays until {PROBE_SECONDS} s after the probe (the "
                            "layer then ignores it; TTL deletes it)",
                            fix.format("DeleteItem") if "DeleteItem" in denied else "nothing to do: it expires"))
    return checks


def run(args: Any, env: dict[str, str]) -> list[Check]:
    checks: list[Check] = []
    timeout = None
    configuration: dict[str, Any] = {}
    mappings: list[dict[str, Any]] = []
    session = None
    if args.function:
        try:
            configuration, mappings, session = _deployed(args.function, args.region)
        except ImportError:
            return [Check("function", FAIL, "doctor --function reads the function with boto3, which is not installed",
                          "pip install boto3")]
        except NotLambda as error:
            return [_not_lambda(str(error))]
        except Exception as error:  # botocore's ClientError and BotoCoreError (timeouts included)
            code, kind = aws_failure(error)
            fix = {"transient": "the Lambda endpoint did not answer; retry doctor (and check the Region and "
                                "the network)",
                   "missing": "check the function's name and the Region"}.get(
                kind, "check the name, the Region, the credentials and lambda:GetFunctionConfiguration, "
                      "lambda:ListEventSourceMappings")
            return [Check("function", FAIL, f"could not read function {args.function!r}: {code}", fix)]
        try:
            found = [Check("function", PASS, configuration["FunctionArn"]), *function_checks(configuration,
                                                                                           args.layer_name)]
            variables = (configuration.get("Environment") or {}).get("Variables") or {}
            base = {**{k: v for k, v in os.environ.items() if not k.startswith("IDEMPOTENCY_")}, **variables,
                    "AWS_LAMBDA_FUNCTION_NAME": configuration["FunctionName"]}
            timeout = int(configuration.get("Timeout", 3))
            if not all(isinstance(value, str) for value in variables.values()):
                raise TypeError("Environment.Variables")
        except (KeyError, TypeError, AttributeError, ValueError):  # fields of the wrong shape
            return [_not_lambda("GetFunctionConfiguration")]
        checks += found
        env = _settings.environment(args, base)
    try:
        config = _settings.load(env)
    except IdempotencyConfigurationError as error:
        return [*checks, Check("settings", FAIL, str(error), "fix the setting it names")]
    where = f"table {config.table}" if config.store == "dynamodb" else f"store {config.valkey!r}"
    checks.append(Check("settings", PASS, f"valid: {where}, key prefix {config.key_prefix!r}, scope {config.scope}"))
    checks.append(key_check(config))
    if config.disabled:
        checks.append(Check("disabled", WARN, "IDEMPOTENCY_DISABLED is true: the runtime calls the handler directly "
                            "and nothing is stored", "unset IDEMPOTENCY_DISABLED to make the function idempotent"))
        if not config.table and config.valkey is None:
            return checks
    if not args.function:
        checks.append(wrapper_check(env.get("AWS_LAMBDA_EXEC_WRAPPER"), "local"))
        following = next_wrapper_check(env.get("IDEMPOTENCY_NEXT_WRAPPER"))
        if following is not None:
            checks.append(following)
    else:
        checks += _deployment_checks(config, configuration, mappings, session, timeout or 3)
    if config.store == "valkey":
        return checks + _valkey_checks(config) + _bucket_checks(config)
    try:
        transport = _settings.transport(config, env)
    except Exception as error:
        return [*checks, _client_failed(error, env)]
    found, probe = table_checks(config, transport)
    checks += found
    if probe:
        from ..stores.dynamodb.store import DynamoDBStore

        store = DynamoDBStore(transport, config.table, config.attributes, config.partition_value)
        checks += permission_checks(store, config.key_prefix)
    return checks + _bucket_checks(config)


def _bucket_checks(config: Any) -> list[Check]:
    """The large-results bucket, when IDEMPOTENCY_LARGE_RESULTS_BUCKET is set."""
    if config.large_results_bucket is None:
        return []
    from .checks.bucket import bucket_checks

    try:
        bucket = _settings.bucket(config)
    except Exception as error:
        return [Check("large results bucket", FAIL, f"could not be set up: {type(error).__name__}: {error}",
                      "check AWS_REGION and the credentials")]
    return bucket_checks(bucket, Check)


def _valkey_checks(config: Any) -> list[Check]:
    from ..stores.valkey import make_store
    from .checks.valkey import probe_checks, server_checks

    try:
        store = make_store(config)
    except Exception as error:  # the CA bundle unreadable, say
        return [Check("client", FAIL, f"the Valkey client could not be set up: {type(error).__name__}: {error}",
                      "check AWS_CA_BUNDLE and IDEMPOTENCY_VALKEY_URL")]
    try:
        found, nodes = server_checks(store, Check)
        return found + probe_checks(store, config.key_prefix, Check, nodes)
    finally:
        store.client.close()


def _deployment_checks(config: Any, configuration: dict[str, Any], mappings: list[dict[str, Any]], session: Any,
                       timeout: int) -> list[Check]:
    """The settings against the deployed function: its timeout, its durable configuration, each event source
    mapping (and an SQS mapping's queue)."""
    checks = [timeout_check(timeout, config.wait_seconds)]
    durable = durable_check(configuration.get("DurableConfig"), config, len(mappings))
    if durable is not None:
        checks.append(durable)
    for mapping in mappings:
        queue, unread = None, None
        if mapping_kind(mapping) == "SQS" and session is not None:
            queue, unread = _queue(session, mapping.get("EventSourceArn", ""))
        try:
            found = mapping_checks(mapping, timeout, queue, config.fail_whole_batch)
        except (KeyError, TypeError, AttributeError, ValueError):
            checks.append(_not_lambda("ListEventSourceMappings"))
            continue
        if unread is not None:  # say why the queue could not be read, not the generic line
            found = [check for check in found if "could not be read" not in check.detail]
            found.append(unread._replace(name=found[0].name if found else unread.name))
        checks += found
    return checks


def _client_failed(error: Exception, env: Any) -> Check:
    problem = _settings.client_problem(error, env)
    if problem is not None:
        detail, fix = problem.split(": ", 1)
        return Check("client", FAIL, detail, fix)
    return Check("client", FAIL, f"the DynamoDB client could not be set up: {type(error).__name__}: {error}",
                 "set AWS_REGION (or --region), the credentials and the endpoint")


def key_check(config: Any) -> Check:
    """The key expression in force. The whole-event default is a warning: doctor cannot know which events will
    come, and a whole event keyed on all of it makes two retries that differ in any field (a timestamp, a trace id)
    two keys; batch records and HTTP requests have their own rules, for which the default is right."""
    if config.key_jmespath:
        require = "required" if config.require_key else "an event it selects nothing from runs unguarded"
        return Check("key", PASS, f"IDEMPOTENCY_KEY_JMESPATH={config.key_jmespath!r} ({require})")
    if config.scope == "record":  # whole events are refused: every unit is a record, keyed by its identity
        return Check("key", PASS, "each batch record by its delivery identity (IDEMPOTENCY_KEY_JMESPATH unset, "
                     "IDEMPOTENCY_SCOPE=record)")
    own = ([] if config.scope == "event" else ["batch records (keyed by their delivery identity)"]) + (
        [f"HTTP requests (by their {config.key_header} header)"] if config.http else [])
    right = f"; right when the function gets only {' and '.join(own)}" if own else ""
    return Check("key", WARN, "IDEMPOTENCY_KEY_JMESPATH is unset (or @): a whole event is keyed on all of it, so "
                 f"two retries that differ in any field (a timestamp, a request id) run twice{right}",
                 "set IDEMPOTENCY_KEY_JMESPATH to what names the operation (e.g. paymentId) and "
                 "IDEMPOTENCY_REQUIRE_KEY=true")


def text(facts: dict[str, Any]) -> list[str]:
    lines = []
    for check in facts["checks"]:
        lines.append(f"{check['status']} {check['name']}: {check['detail']}")
        if check["fix"] and check["status"] != PASS:
            lines.append(f"     fix: {check['fix']}")
    lines.append(f"{facts['failed']} failed, {facts['warned']} warning(s), {facts['passed']} passed")
    return lines
