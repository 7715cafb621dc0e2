"""`doctor`: checks the settings, the store and the permissions the layer needs (and, with `--function`, a
deployed function and its event source mappings), each one line: PASS, WARN or FAIL, with the fix.

Each backend's checks are its own module in `checks/` (the table and its permissions, the Valkey server and its
probe, the large-results bucket), imported only when the settings name that backend; this module checks the
function, its mappings, the wrapper and the settings. Only `--function` needs boto3 (the Lambda and SQS APIs)."""

from __future__ import annotations

import os

from ..errors import IdempotencyConfigurationError
from . import settings as _settings
from .checks.check import FAIL, PASS, WARN, Check, aws_failure

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

WRAPPER = "/opt/idempotency-wrapper"
SUPPORTED = (10, 14)  # python3.10 to python3.14, the runtimes the layer is built and tested for


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


def _deployed(name: str, region: str | None) -> tuple[dict[str, Any], list[dict[str, Any]], Any, str | None]:
    """The function's configuration, its event source mappings, the boto3 session that read them, and its
    function URL's AuthType (None: no URL, or one these credentials may not read)."""
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
    return configuration, mappings, session, _url_auth(client, name)


def _url_auth(client: Any, name: str) -> str | None:
    """The function URL's AuthType: a hint that the function serves HTTP requests, and whether IAM names their
    callers. Without a URL, or without lambda:GetFunctionUrlConfig, there is no hint."""
    try:
        auth = _bounded(lambda: client.get_function_url_config(FunctionName=name)).get("AuthType")
    except Exception:  # ResourceNotFoundException (no URL), a denial, no answer: nothing learnt
        return None
    return auth if isinstance(auth, str) else None


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


def run(args: Any, env: dict[str, str]) -> list[Check]:
    checks: list[Check] = []
    timeout = None
    configuration: dict[str, Any] = {}
    mappings: list[dict[str, Any]] = []
    session = None
    url_auth = None
    variables: dict[str, str] | None = None  # doctor --function: the function's own environment variables
    if args.function:
        try:
            configuration, mappings, session, url_auth = _deployed(args.function, args.region)
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
    keys, unread = record_mac_keys(config, env, variables)
    checks.append(Check("settings", FAIL, unread, "fix the key source it names" + _AS_OPERATOR * bool(args.function))
                  if unread else Check("settings", PASS, f"valid: {where}, key prefix {config.key_prefix!r}, scope "
                                       f"{config.scope}{keys}"))
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
        checks += _isolation_checks(config, configuration, session, url_auth)
    # Each backend's checks are imported only when the settings name it.
    if config.store == "valkey":
        from .checks import valkey

        return checks + valkey.checks(config) + _bucket_checks(config)
    try:
        transport = _settings.transport(config, env)
    except Exception as error:
        return [*checks, _client_failed(error, env)]
    from .checks import dynamodb

    return checks + dynamodb.checks(config, transport) + _bucket_checks(config)


_AS_OPERATOR = (" (doctor --function reads the keys with your credentials, not the function's role, and an env: "
                "source from the function's environment)")


def record_mac_keys(config: Any, env: dict[str, str], own: dict[str, str] | None) -> tuple[str, str | None]:
    """IDEMPOTENCY_RECORD_MAC_KEY's keys read as init reads them (`record_mac.keyed`): what the settings line says
    of them, and init's message when one cannot be read or is no key (None: they are keys). `own`: under doctor
    --function, the function's variables: `env` is them over the operator's environment (whose credentials read a
    secret), but an `env:` source is read from the function's variables alone, as its init reads it."""
    if not config.record_mac_sources:
        return "", None
    from ..record_mac import keyed

    deployed = own is not None
    if own is not None:  # the operator's own variable of that name is not the function's
        env = {name: value for name, value in env.items()
               if name in own or f"env:{name}" not in config.record_mac_sources}
    try:
        mac = keyed(config, env, "")  # only the keys are checked: no record is read, so no store binds them
    except IdempotencyConfigurationError as error:
        return "", str(error)
    stored = any(not source.startswith("env:") for source in config.record_mac_sources)
    whose = ", read with your credentials, not the function's role" if deployed and stored else ""
    return f"; IDEMPOTENCY_RECORD_MAC_KEY: {len(mac.key_ids)} key(s) read as init reads them{whose} (current " \
           f"key id {mac.current})", None


def _bucket_checks(config: Any) -> list[Check]:
    """The large-results bucket, when IDEMPOTENCY_LARGE_RESULTS_BUCKET is set."""
    if config.large_results_bucket is None:
        return []
    from .checks import bucket as _bucket

    try:
        bucket = _settings.bucket(config)
    except Exception as error:
        return [Check("large results bucket", FAIL, f"could not be set up: {type(error).__name__}: {error}",
                      "check AWS_REGION and the credentials")]
    return _bucket.checks(bucket)


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


def http_callers_check(config: Any, variables: dict[str, str], url_auth: str | None) -> Check | None:
    """Whether callers no authorizer names share one scope (issue 44, R-M1.2). The layer tells an HTTP request by
    its shape, so doctor goes by hints: a function URL without IAM auth, or IDEMPOTENCY_KEY_HEADER in the
    function's own settings. API Gateway's authorizers are not visible to doctor. None: nothing to say."""
    if not config.http:
        return None
    hints = []
    if url_auth == "NONE":
        hints.append("its function URL has AuthType NONE")
    if variables.get("IDEMPOTENCY_KEY_HEADER"):
        hints.append(f"IDEMPOTENCY_KEY_HEADER={variables['IDEMPOTENCY_KEY_HEADER']!r} is set")
    if not hints:
        return None
    if config.caller_headers:
        return Check("http callers", PASS, f"IDEMPOTENCY_CALLER_HEADERS={','.join(config.caller_headers)}: a "
                     "request no authorizer names is scoped by those headers")
    unseen = "" if hints[0].startswith("its function URL") else " (API Gateway's authorizers are not visible here)"
    return Check("http callers", WARN, f"the function takes HTTP requests ({'; '.join(hints)}), and "
                 f"IDEMPOTENCY_CALLER_HEADERS is unset: callers without an authorizer{unseen} share one scope, so "
                 "one caller can be answered with another's stored response",
                 "set IDEMPOTENCY_CALLER_HEADERS (e.g. Authorization) to the headers that name the caller, or put an "
                 "authorizer in front (docs/http.md)")


def _isolation_checks(config: Any, configuration: dict[str, Any], session: Any, url_auth: str | None) -> list[Check]:
    """Who else the function's records are open to: other functions through its role's policy, other HTTP callers
    through a shared scope."""
    checks = []
    role, arn = configuration.get("Role"), configuration["FunctionArn"].split(":")
    if (config.store == "dynamodb" and config.table and isinstance(role, str) and role and session is not None
            and len(arn) >= 7):
        from .checks import dynamodb

        # The table is in the function's Region and account (the layer's client uses AWS_REGION), unless named
        # by its ARN.
        table_arn = config.table if config.table.startswith("arn:") else (
            f"arn:{arn[1]}:dynamodb:{arn[3]}:{arn[4]}:table/{config.table}")
        checks.append(dynamodb.isolation_check(_simulator(session), config, role, table_arn))
    variables = (configuration.get("Environment") or {}).get("Variables") or {}
    callers = http_callers_check(config, variables, url_auth)
    return checks if callers is None else [*checks, callers]


def _simulator(session: Any) -> Any:
    """iam:SimulatePrincipalPolicy with the operator's credentials, every page of EvaluationResults. IAM is
    global: botocore signs for its partition's endpoint (iam.amazonaws.com, us-east-1) whatever the Region."""
    def simulate(request: dict[str, Any]) -> list[Any]:
        iam = _client(session, "iam")

        def pages() -> list[Any]:
            found: list[Any] = []
            for page in iam.get_paginator("simulate_principal_policy").paginate(**request):
                found.extend(page.get("EvaluationResults") or [])  # none: isolation_check says unreadable
            return found

        return list(_bounded(pages))
    return simulate


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
