"""doctor's checks of a DynamoDB store (the default): the credentials, the table, its key schema and TTL, read
with the layer's own DynamoDB client (it signs any JSON 1.0 operation: DescribeTable, DescribeTimeToLive); then
the five permissions, proven with the layer's own store on a probe key that is removed again. With
`doctor --function`, also whether the function's role is confined to its own keys (IAM's policy simulator)."""

from __future__ import annotations

import os
import time

from ... import codec
from ...errors import IdempotencyPersistenceLayerError
from ...stores.dynamodb import DynamoDBError
from .check import FAIL, PASS, PROBE_SECONDS, WARN, Check, aws_failure

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_CREDENTIAL_CODES = frozenset({"NoCredentialsError", "UnrecognizedClientException", "InvalidSignatureException",
                               "ExpiredTokenException", "MissingAuthenticationTokenException",
                               "InvalidClientTokenId", "SignatureDoesNotMatch"})

# Refusals that a grant (or the right credentials) fixes; any other failure proves nothing about the role.
_DENIALS = frozenset({"AccessDeniedException", "UnrecognizedClientException", "MissingAuthenticationTokenException",
                      "InvalidSignatureException", "KMSAccessDeniedException"})


def _code(error: BaseException) -> str:
    cause = error if isinstance(error, DynamoDBError) else error.__cause__
    return cause.code if isinstance(cause, DynamoDBError) else type(error).__name__


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



def checks(config: Any, transport: Any) -> list[Check]:
    """The table's checks on `transport` (the layer's DynamoDB client for `config`), then, unless they showed the
    probe cannot run, the permissions' on the store the layer would use."""
    found, probe = table_checks(config, transport)
    if probe:
        from ...stores import open_store

        store = open_store(config, transport)  # as the function opens it
        found += permission_checks(store, config.key_prefix)
    return found


# The item actions the layer sends, as IAM names them: the ones a dynamodb:LeadingKeys condition must confine.
ITEM_ACTIONS = tuple(f"dynamodb:{name}" for name in ("GetItem", "PutItem", "UpdateItem", "DeleteItem",
                                                     "BatchGetItem"))
# Item actions the layer never sends that still read, write or delete records by key: a role that may call them
# on other keys reaches other functions' records as well, so they are asked about with the layer's own.
UNSENT_ITEM_ACTIONS = tuple(f"dynamodb:{name}" for name in ("BatchWriteItem", "TransactWriteItems",
                                                            "TransactGetItems", "ConditionCheckItem"))
KEYED_ACTIONS = ITEM_ACTIONS + UNSENT_ITEM_ACTIONS
# Requests that read or write many keys at once: no statement of the function's role should grant them.
BULK_ACTIONS = tuple(f"dynamodb:{name}" for name in ("Scan", "Query", "PartiQLSelect", "PartiQLInsert",
                                                     "PartiQLUpdate", "PartiQLDelete"))


def outside_key(config: Any) -> tuple[str, str, str]:
    """A leading key that is not the function's, what its own leading keys are, and the condition that confines
    a role to them. In the sort-key layout every record shares one partition value, so another one is outside."""
    if config.partition_value is not None:
        own = config.partition_value
        other = "idempotency#zz-other" if own != "idempotency#zz-other" else "idempotency#zz-another"
        return other, repr(own), f"ForAllValues:StringEquals on dynamodb:LeadingKeys [{own!r}]"
    prefix = config.key_prefix
    other = "zz-other#x" if prefix != "zz-other" else "zz-another#x"
    return other, f"{prefix}#*", f"ForAllValues:StringLike on dynamodb:LeadingKeys ['{prefix}#*']"


def isolation_request(config: Any, role: str, table_arn: str) -> dict[str, Any]:
    """The SimulatePrincipalPolicy request asking whether `role` may touch a key outside the function's own."""
    return {"PolicySourceArn": role, "ActionNames": list(KEYED_ACTIONS), "ResourceArns": [table_arn],
            "ContextEntries": [{"ContextKeyName": "dynamodb:LeadingKeys", "ContextKeyValues": [outside_key(config)[0]],
                                "ContextKeyType": "stringList"}]}


def unkeyed_request(role: str, table_arn: str) -> dict[str, Any]:
    """The SimulatePrincipalPolicy request with no dynamodb:LeadingKeys at all (a context entry applies to every
    action of a call, so this is a second call): an item action allowed here means the Null guard is missing
    (ForAllValues holds over no values), and Scan, Query or PartiQL allowed reach every function's records."""
    return {"PolicySourceArn": role, "ActionNames": [*KEYED_ACTIONS, *BULK_ACTIONS], "ResourceArns": [table_arn]}


def _decisions(results: Any, actions: tuple[str, ...]) -> dict[str, str]:
    decisions = {result["EvalActionName"]: result["EvalDecision"] for result in results}
    if not all(isinstance(text, str) for text in (*decisions, *decisions.values())) or not (
            set(actions) <= set(decisions)):
        raise TypeError("EvaluationResults")
    return decisions


def isolation_check(simulate: Any, config: Any, role: str, table_arn: str) -> Check:
    """Whether the function's role is confined to its own keys (issue 44, R1.5): IAM's policy simulator evaluates
    the role's policies for each item action on a key outside them, then for each item action with no leading
    key and for Scan, Query and PartiQL. `simulate(request)` returns the EvaluationResults of every page. The
    operator's credentials call it; a failure is a warning, never a crash."""
    name = "role isolation"
    other, own, condition = outside_key(config)
    unreadable = Check(name, WARN, "could not run: SimulatePrincipalPolicy's answer is not one this doctor can "
                       "read", "check the endpoint (AWS_ENDPOINT_URL_IAM / AWS_ENDPOINT_URL): it should be IAM's")
    try:
        keyed = simulate(isolation_request(config, role, table_arn))
        unkeyed = simulate(unkeyed_request(role, table_arn))
    except Exception as error:  # botocore's ClientError and BotoCoreError, a call not done in time
        if type(error).__name__ == "ResponseParserError":  # an answer came, but not IAM's: not worth a retry
            return unreadable
        code, kind = aws_failure(error)
        fix = ("IAM did not answer; retry doctor" if kind == "transient" else "run doctor with credentials that "
               "may call iam:SimulatePrincipalPolicy on the role (the function itself does not need it)")
        return Check(name, WARN, f"could not run: iam:SimulatePrincipalPolicy on {role} failed ({code}), so "
                     f"whether the role can reach keys outside {own} is not known", fix)
    try:
        outside, bare = _decisions(keyed, KEYED_ACTIONS), _decisions(unkeyed, KEYED_ACTIONS + BULK_ACTIONS)
    except (KeyError, TypeError, AttributeError):
        return unreadable
    found = []
    allowed = [action for action in KEYED_ACTIONS if outside[action] == "allowed"]
    if allowed:
        found.append(f"the role {role} may call {', '.join(allowed)} on keys outside {own} (IAM's policy "
                     f"simulator allows them on {other!r}): it can read, forge or delete other functions' records "
                     "in the table")
    allowed = [action for action in KEYED_ACTIONS if bare[action] == "allowed"]
    if allowed:
        found.append(f"the role {role} may call {', '.join(allowed)} with no dynamodb:LeadingKeys: the Null "
                     "dynamodb:LeadingKeys false guard is missing (ForAllValues holds for a request naming no key)")
    allowed = [action for action in BULK_ACTIONS if bare[action] == "allowed"]
    if allowed:
        found.append(f"the role {role} may call {', '.join(allowed)} on the table: they reach every function's "
                     "records")
    if found:
        return Check(name, WARN, "; ".join(found), f"confine the role's statement on the table with {condition} "
                     "and Null dynamodb:LeadingKeys false, with no Scan, Query or PartiQL in it (docs/security.md)")
    return Check(name, PASS, f"the role is confined to {own}: IAM's policy simulator denies every item action on "
                 f"{other!r} or with no leading key, and Scan, Query and PartiQL")
