"""T1.3 (issue 44): the shipped policies isolate functions that share a table, a bucket or a Valkey server.

A static check of template.yaml and examples/*/template.yaml: every statement allowing an item action on an
idempotency table is confined by `dynamodb:LeadingKeys` to that function's IDEMPOTENCY_KEY_PREFIX + `#*` (or
its partition value in the sort-key layout), with the Null guard that ForAllValues needs; no Scan, Query or
PartiQL on a table; PITR, deletion protection and SSE on every table; S3 object resources under the function's
own prefix, PutObject only with SSE, no s3:DeleteObject on a function role; no password in a *_VALKEY_URL, and
the ACL user confined to its keys; an HTTP API without an authorizer names the caller's header. The JSON policies
in README.md and docs/security.md parse and carry the same condition. Each check is shown to catch a planted
break: the parsed template (or the text) is mutated in memory and the check must then report it.
"""

from __future__ import annotations

import copy
import fnmatch
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from cfnlint.decode import cfn_yaml

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = [ROOT / "template.yaml", *sorted((ROOT / "examples").glob("*/template.yaml"))]
PREFIX = re.compile(r"[A-Za-z0-9_-]{1,64}")  # IDEMPOTENCY_KEY_PREFIX's alphabet (R1.2)
ITEM_ACTIONS = {"dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem"}
DYNAMODB_ACTIONS = [  # what a wildcard in a statement's Action could reach; checked by pattern against these
    *ITEM_ACTIONS, "dynamodb:BatchGetItem", "dynamodb:BatchWriteItem", "dynamodb:TransactGetItems",
    "dynamodb:TransactWriteItems", "dynamodb:ConditionCheckItem", "dynamodb:Scan", "dynamodb:Query",
    "dynamodb:PartiQLSelect", "dynamodb:PartiQLInsert", "dynamodb:PartiQLUpdate", "dynamodb:PartiQLDelete",
    "dynamodb:DescribeTable", "dynamodb:DeleteTable", "dynamodb:UpdateTable"]
NO_KEY = {"dynamodb:Scan", "dynamodb:Query", "dynamodb:PartiQLSelect", "dynamodb:PartiQLInsert",
          "dynamodb:PartiQLUpdate", "dynamodb:PartiQLDelete"}  # never on an idempotency table
S3_ACTIONS = ["s3:PutObject", "s3:GetObject", "s3:DeleteObject", "s3:DeleteObjectVersion", "s3:ListBucket",
              "s3:PutObjectAcl", "s3:GetObjectVersion"]
BATCH_EVENTS = {"SQS", "Kinesis", "DynamoDB", "MSK", "SelfManagedKafka", "MQ"}
NULL_GUARD = {"dynamodb:LeadingKeys": "false"}


def load(path: Path) -> dict[str, Any]:
    """The template as plain JSON values (CloudFormation's short tags read as their long forms)."""
    return json.loads(json.dumps(cfn_yaml.load(str(path))))


# -- reading a template --------------------------------------------------------------------------------------

def listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def functions(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: r["Properties"] for name, r in template["Resources"].items()
            if r["Type"] == "AWS::Serverless::Function"}


def environment(fn: dict[str, Any]) -> dict[str, Any]:
    return fn.get("Environment", {}).get("Variables", {})


def statements(fn: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The function role's Allow statements (inline documents; a policy given by name cannot be read here)."""
    for policy in listed(fn.get("Policies", [])):
        if not (isinstance(policy, dict) and "Statement" in policy):
            continue  # readable_policy_problems reports it
        for stmt in listed(policy["Statement"]):
            if stmt.get("Effect") == "Allow":
                yield stmt


def reached(stmt: dict[str, Any], known: list[str]) -> set[str]:
    """The actions of `known` a statement's Action patterns allow (a wildcard reaches every action it matches)."""
    patterns = [a.lower() for a in listed(stmt.get("Action", []))]
    return {a for a in known if any(fnmatch.fnmatchcase(a.lower(), p) for p in patterns)}


def table_named(resource: Any, tables: set[str]) -> str | None:
    """The template's table a Resource entry names (its ARN, an index of it), or None."""
    if isinstance(resource, dict) and "Fn::GetAtt" in resource:
        target = resource["Fn::GetAtt"]
        name = target[0] if isinstance(target, list) else target.split(".")[0]
        return name if name in tables else None
    text = resource.get("Fn::Sub", "") if isinstance(resource, dict) else ""
    text = text[0] if isinstance(text, list) else text
    found = re.match(r"\$\{(\w+)\.Arn\}", text) if isinstance(text, str) else None
    return found.group(1) if found and found.group(1) in tables else None


def batch_fed(template: dict[str, Any], name: str, fn: dict[str, Any]) -> bool:
    """Whether the function is fed batches (an event of a batch source, or a mapping naming it): the pre-check's
    BatchGetItem is then its to use."""
    if any(e.get("Type") in BATCH_EVENTS for e in fn.get("Events", {}).values()):
        return True
    return any(r["Type"] == "AWS::Lambda::EventSourceMapping" and r["Properties"].get("FunctionName") == {"Ref": name}
               for r in template["Resources"].values())


def sub_text(value: Any) -> str | None:
    """A literal, or the text of a Fn::Sub (its ${...} left as written); None for anything else."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and "Fn::Sub" in value:
        sub = value["Fn::Sub"]
        return sub[0] if isinstance(sub, list) else sub
    return None


# -- the checks: each returns what it found wrong ------------------------------------------------------------

def leading_keys_problems(condition: Any, patterns: list[str], operators: tuple[str, ...]) -> list[str]:
    """A statement's Condition confines dynamodb:LeadingKeys to exactly `patterns` (ForAllValues with one of
    `operators`), with the Null guard."""
    condition = condition if isinstance(condition, dict) else {}
    found = [(op, condition[op].get("dynamodb:LeadingKeys")) for op in operators if op in condition]
    problems = []
    if not found or any(listed(values) != patterns for _, values in found if values is not None) or all(
            values is None for _, values in found):
        problems.append(f"dynamodb:LeadingKeys is not confined to {patterns} by {' or '.join(operators)}: "
                        f"{condition!r}")
    null = condition.get("Null", {})
    if str(null.get("dynamodb:LeadingKeys", "")).lower() != "false":
        problems.append(f"no Null guard {{'dynamodb:LeadingKeys': 'false'}} (ForAllValues allows a request "
                        f"without keys): {condition!r}")
    return problems


def own_patterns(env: dict[str, Any], prefix: str) -> tuple[list[str], tuple[str, ...]]:
    """What the function's keys match: `P#*` (StringLike), or its partition value in the sort-key layout."""
    if env.get("IDEMPOTENCY_SORT_KEY_ATTR"):
        return [env.get("IDEMPOTENCY_PARTITION_VALUE") or f"idempotency#{prefix}"], ("ForAllValues:StringEquals",)
    return [f"{prefix}#*"], ("ForAllValues:StringLike",)


def dynamodb_problems(template: dict[str, Any]) -> list[str]:
    tables = {n for n, r in template["Resources"].items() if r["Type"] == "AWS::DynamoDB::Table"}
    problems = []
    for name, fn in functions(template).items():
        env = environment(fn)
        prefix = env.get("IDEMPOTENCY_KEY_PREFIX")
        for stmt in statements(fn):
            actions = reached(stmt, DYNAMODB_ACTIONS)
            if not actions:
                continue
            where = f"{name} {stmt.get('Sid', '')}".strip()
            named = {table_named(r, tables) for r in listed(stmt.get("Resource"))}
            if None in named:
                problems.append(f"{where}: DynamoDB actions on {stmt.get('Resource')!r}, not the template's table")
            if actions & NO_KEY:
                problems.append(f"{where}: allows {sorted(actions & NO_KEY)} on the table (no leading keys: "
                                "never with the item statement)")
            if not isinstance(prefix, str) or not PREFIX.fullmatch(prefix):
                problems.append(f"{where}: IDEMPOTENCY_KEY_PREFIX is not an explicit literal prefix: {prefix!r}")
                continue
            problems += [f"{where}: {p}" for p in statement_problems(template, name, fn, stmt, actions - NO_KEY)]
    return problems


def statement_problems(template: dict[str, Any], name: str, fn: dict[str, Any], stmt: dict[str, Any],
                       actions: set[str]) -> list[str]:
    """One table statement of function `name`: only the actions the layer uses, confined to its keys."""
    env = environment(fn)
    handler = env.get("IDEMPOTENCY_POWERTOOLS_HANDLER")
    condition = stmt.get("Condition", {})
    migration = listed(condition.get("ForAllValues:StringLike", {}).get("dynamodb:LeadingKeys", []))
    if handler and actions == {"dynamodb:GetItem"} and len(migration) == 1 and migration[0].endswith(
            f".{handler}#*") and not migration[0].startswith("*"):
        return leading_keys_problems(condition, migration, ("ForAllValues:StringLike",))  # Powertools' keys
    allowed = ITEM_ACTIONS | ({"dynamodb:BatchGetItem"} if batch_fed(template, name, fn) else set())
    problems = [f"allows {sorted(actions - allowed)}, which the layer does not use here"] if actions - allowed else []
    patterns, operators = own_patterns(env, env["IDEMPOTENCY_KEY_PREFIX"])
    return problems + leading_keys_problems(condition, patterns, operators)


def table_problems(template: dict[str, Any]) -> list[str]:
    problems = []
    for name, r in template["Resources"].items():
        if r["Type"] != "AWS::DynamoDB::Table":
            continue
        props = r["Properties"]
        if props.get("PointInTimeRecoverySpecification", {}).get("PointInTimeRecoveryEnabled") is not True:
            problems.append(f"{name}: point-in-time recovery is not enabled")
        if props.get("DeletionProtectionEnabled") is not True:
            problems.append(f"{name}: deletion protection is not enabled")
        if props.get("SSESpecification", {}).get("SSEEnabled") is not True:
            problems.append(f"{name}: SSESpecification.SSEEnabled is not true")
    return problems


def s3_problems(template: dict[str, Any]) -> list[str]:
    problems = []
    for name, fn in functions(template).items():
        env = environment(fn)
        prefix = env.get("IDEMPOTENCY_KEY_PREFIX")
        results = env.get("IDEMPOTENCY_LARGE_RESULTS_PREFIX") or f"idempotency-results/{prefix}/"
        for stmt in statements(fn):
            actions = reached(stmt, S3_ACTIONS)
            if not actions:
                continue
            where = f"{name} {stmt.get('Sid', '')}".strip()
            if actions - {"s3:PutObject", "s3:GetObject"}:
                problems.append(f"{where}: a function role allows {sorted(actions - {'s3:PutObject', 's3:GetObject'})}"
                                " (no s3:DeleteObject: purge is the operator's)")
            for resource in listed(stmt.get("Resource")):
                text = sub_text(resource) or ""
                if not (text.endswith(f"/{prefix}/*") and text.endswith(f"/{results}*")):
                    problems.append(f"{where}: object resource {resource!r} is not under its own prefix "
                                    f"{results!r} (ending /{prefix}/*)")
            sse = stmt.get("Condition", {}).get("StringEquals", {}).get("s3:x-amz-server-side-encryption")
            if "s3:PutObject" in actions and sse not in ("AES256", "aws:kms"):
                problems.append(f"{where}: s3:PutObject without StringEquals on s3:x-amz-server-side-encryption")
        if env.get("IDEMPOTENCY_LARGE_RESULTS_BUCKET"):
            problems += bucket_problems(template, name, env, results)
    return problems


def bucket_problems(template: dict[str, Any], name: str, env: dict[str, Any], results: str) -> list[str]:
    """The function's results bucket (when the template makes it): encrypted, with a lifecycle rule over them."""
    bucket = env["IDEMPOTENCY_LARGE_RESULTS_BUCKET"]
    if not (isinstance(bucket, dict) and bucket.get("Ref") in template["Resources"]):
        return []
    props = template["Resources"][bucket["Ref"]]["Properties"]
    rules = [r for r in props.get("LifecycleConfiguration", {}).get("Rules", []) if r.get("Status") == "Enabled"]
    covering = [r for r in rules if results.startswith(r.get("Prefix", r.get("Filter", {}).get("Prefix", "")))]
    problems = [] if covering else [f"{name}: no enabled lifecycle rule covers {results!r}"]
    if not props.get("BucketEncryption"):
        problems.append(f"{name}: the results bucket has no default encryption")
    return problems


def valkey_problems(template: dict[str, Any]) -> list[str]:
    problems = []
    for name, fn in functions(template).items():
        env = environment(fn)
        for var, value in env.items():
            if not var.endswith("_VALKEY_URL"):
                continue
            text = sub_text(value)
            if text is None:
                problems.append(f"{name}: {var} is not a literal or Fn::Sub, so it cannot be checked: {value!r}")
            elif urlsplit(text).password is not None or re.match(r"^[a-z]+://[^@/]*:[^@/]*@", text):
                problems.append(f"{name}: {var} holds a password; use IDEMPOTENCY_VALKEY_SECRET or IAM")
            if env.get("IDEMPOTENCY_VALKEY_SECRET") and not any(
                    reached(s, ["secretsmanager:GetSecretValue"]) and s.get("Resource") ==
                    env["IDEMPOTENCY_VALKEY_SECRET"] for s in statements(fn)):
                problems.append(f"{name}: no secretsmanager:GetSecretValue on exactly IDEMPOTENCY_VALKEY_SECRET")
    prefixes = {environment(fn).get("IDEMPOTENCY_KEY_PREFIX") for fn in functions(template).values()
                if environment(fn).get("IDEMPOTENCY_STORE") == "valkey"}
    for name, r in template["Resources"].items():
        if r["Type"] in ("AWS::MemoryDB::User", "AWS::ElastiCache::User"):
            words = r["Properties"]["AccessString"].split()
            keys = [w for w in words if w.startswith(("~", "%")) or w == "allkeys"]
            if "resetkeys" not in words or "resetchannels" not in words or "+@all" in words or len(keys) != 1 or (
                    keys[0] not in {f"~{p}#*" for p in prefixes}):
                problems.append(f"{name}: the ACL is not resetkeys ~P#* resetchannels for one function: {words}")
    return problems


def http_problems(template: dict[str, Any]) -> list[str]:
    """An API event without an authorizer names no caller: the function must name the caller's header."""
    problems = []
    for name, fn in functions(template).items():
        for event in fn.get("Events", {}).values():
            anonymous = event.get("Type") in ("HttpApi", "Api") and not event.get("Properties", {}).get("Auth")
            if anonymous and not environment(fn).get("IDEMPOTENCY_CALLER_HEADERS"):
                problems.append(f"{name}: {event['Type']} without an authorizer and no IDEMPOTENCY_CALLER_HEADERS")
    return problems


def readable_policy_problems(template: dict[str, Any]) -> list[str]:
    """Every function's permissions are inline documents this check reads: a managed policy, a SAM policy
    template (DynamoDBCrudPolicy is table-wide) or a role of its own would grant what no check here sees."""
    problems = []
    for name, fn in functions(template).items():
        if "Role" in fn:
            problems.append(f"{name}: a Role of its own, which this check cannot read")
        for policy in listed(fn.get("Policies", [])):
            if not (isinstance(policy, dict) and "Statement" in policy and set(policy) <= {"Version", "Statement"}):
                problems.append(f"{name}: a policy this check cannot read: {policy!r}")
    return problems


def tag_problems(template: dict[str, Any]) -> list[str]:
    """A function tagged for the ABAC policy (docs/security.md) is tagged with its own prefix."""
    return [f"{name}: tag idempotency-prefix={fn['Tags']['idempotency-prefix']!r} is not its IDEMPOTENCY_KEY_PREFIX"
            for name, fn in functions(template).items() if "idempotency-prefix" in fn.get("Tags", {})
            and fn["Tags"]["idempotency-prefix"] != environment(fn).get("IDEMPOTENCY_KEY_PREFIX")]


CHECKS: list[Callable[[dict[str, Any]], list[str]]] = [
    readable_policy_problems, tag_problems, dynamodb_problems, table_problems, s3_problems, valkey_problems,
    http_problems]


# -- the JSON policies of the docs ---------------------------------------------------------------------------

def json_blocks(text: str) -> list[str]:
    return re.findall(r"^```json\n(.*?)^```", text, flags=re.M | re.S)


def document_problems(document: Any, operator_sids: tuple[str, ...] = ()) -> list[str]:
    """A policy document: Version 2012-10-17; every statement with item actions confined by LeadingKeys with the
    Null guard (but the operator's, table-wide by design, named by Sid); no Scan, Query or PartiQL anywhere."""
    problems = [] if document.get("Version") == "2012-10-17" else [f"no Version 2012-10-17: {document!r}"]
    for stmt in listed(document.get("Statement", [])):
        actions = reached(stmt, DYNAMODB_ACTIONS)
        if actions & NO_KEY:
            problems.append(f"{stmt.get('Sid')}: allows {sorted(actions & NO_KEY)}")
        if not actions & (ITEM_ACTIONS | {"dynamodb:BatchGetItem"}) or stmt.get("Sid") in operator_sids:
            continue
        condition = stmt.get("Condition", {})
        operators = ("ForAllValues:StringEquals",) if "ForAllValues:StringEquals" in condition else (
            "ForAllValues:StringLike",)
        patterns = listed(condition.get(operators[0], {}).get("dynamodb:LeadingKeys", []))
        if not patterns or any(p in ("*", "#*") or not (p.endswith("#*") or operators[0].endswith("Equals"))
                               for p in patterns):
            problems.append(f"{stmt.get('Sid')}: LeadingKeys not confined to a prefix: {patterns!r}")
        problems += [f"{stmt.get('Sid')}: {p}" for p in leading_keys_problems(condition, patterns, operators)]
    return problems


def readme_problems(text: str) -> list[str]:
    """The README's IAM policy: a document that parses, the item statement confined to `<prefix>#*`."""
    section = text.split("### IAM policy", 1)[-1].split("\n### ", 1)[0]
    blocks = json_blocks(section)
    if len(blocks) != 1:
        return [f"the IAM policy section has {len(blocks)} JSON blocks, not 1"]
    try:
        document = json.loads(blocks[0])
    except ValueError as error:
        return [f"the README's policy does not parse: {error}"]
    (stmt,) = listed(document.get("Statement", [{}]))
    problems = document_problems(document)
    return problems + leading_keys_problems(stmt.get("Condition"), ["<prefix>#*"], ("ForAllValues:StringLike",))


def docs_problems(text: str, operator_sids: tuple[str, ...] = ("IdempotencyRecords",)) -> list[str]:
    problems = []
    for block in json_blocks(text):
        try:
            document = json.loads(block)
        except ValueError as error:
            problems.append(f"a JSON block does not parse ({error}): {block[:80]!r}")
            continue
        problems += document_problems(document, operator_sids)
    return problems


# -- the shipped files pass ----------------------------------------------------------------------------------

@pytest.fixture(scope="module", params=TEMPLATES, ids=lambda p: str(p.relative_to(ROOT)))
def template(request: pytest.FixtureRequest) -> dict[str, Any]:
    return load(request.param)


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
def test_every_template_passes(template: dict[str, Any], check: Callable[[dict[str, Any]], list[str]]) -> None:
    assert check(template) == []


def test_every_table_function_is_checked() -> None:
    """The check reads every function of every template that uses a table: none slips by unread."""
    seen = {(str(path.relative_to(ROOT)), name): environment(fn).get("IDEMPOTENCY_KEY_PREFIX")
            for path in TEMPLATES for name, fn in functions(load(path)).items()}
    assert seen == {
        ("template.yaml", "OrderFunction"): "orders", ("template.yaml", "ShipmentFunction"): "shipments",
        ("template.yaml", "OrdersApiFunction"): "orders-api", ("template.yaml", "KafkaOrdersFunction"): "kafka-orders",
        ("examples/large-results/template.yaml", "OrdersApi"): "orders-api",
        ("examples/valkey/template.yaml", "Orders"): "orders"}


def test_prefixes_are_distinct_within_each_template() -> None:
    for path in TEMPLATES:
        prefixes = [environment(fn).get("IDEMPOTENCY_KEY_PREFIX") for fn in functions(load(path)).values()]
        assert len(prefixes) == len(set(prefixes)), (path, prefixes)


def test_the_readme_policy_parses_and_is_confined() -> None:
    assert readme_problems((ROOT / "README.md").read_text()) == []


@pytest.mark.parametrize("page", ["docs/security.md", "docs/powertools.md"])
def test_the_docs_policies_parse_and_are_confined(page: str) -> None:
    text = (ROOT / page).read_text()
    assert json_blocks(text), f"{page} has no JSON policy"
    assert docs_problems(text) == []


def test_security_md_gives_the_powertools_message_exactly() -> None:
    message = ("the function's role may not read the Powertools record of this invocation: grant dynamodb:GetItem "
               "on keys 'orders.app.handler#*' (a GetItem-only statement, docs/security.md)")
    assert message in (ROOT / "docs" / "security.md").read_text()


# -- each check catches a planted break ----------------------------------------------------------------------

def _table_statement(t: dict[str, Any], fn: str) -> dict[str, Any]:
    return t["Resources"][fn]["Properties"]["Policies"][0]["Statement"][0]


def _env(t: dict[str, Any], fn: str) -> dict[str, Any]:
    return t["Resources"][fn]["Properties"]["Environment"]["Variables"]


def _condition(t: dict[str, Any], fn: str = "OrderFunction") -> dict[str, Any]:
    return _table_statement(t, fn)["Condition"]


def _add_action(fn: str, action: str) -> Callable[[dict[str, Any]], None]:
    return lambda t: _table_statement(t, fn)["Action"].append(action)


def _extra_statement(fn: str, stmt: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    return lambda t: t["Resources"][fn]["Properties"]["Policies"][0]["Statement"].append(copy.deepcopy(stmt))


TABLE_ARN = {"Fn::GetAtt": ["IdempotencyTable", "Arn"]}
MAIN_BREAKS: dict[str, tuple[Callable[[dict[str, Any]], None], Callable[[dict[str, Any]], list[str]], str]] = {
    "no Null guard": (lambda t: _condition(t).pop("Null"), dynamodb_problems, "no Null guard"),
    "Null guard true": (lambda t: _condition(t)["Null"].update({"dynamodb:LeadingKeys": "true"}),
                        dynamodb_problems, "no Null guard"),
    "no condition": (lambda t: _table_statement(t, "OrderFunction").pop("Condition"), dynamodb_problems,
                     "not confined"),
    "pattern *": (lambda t: _condition(t)["ForAllValues:StringLike"].update({"dynamodb:LeadingKeys": ["*"]}),
                  dynamodb_problems, "not confined to ['orders#*']"),
    "another's prefix": (lambda t: _condition(t)["ForAllValues:StringLike"].update(
        {"dynamodb:LeadingKeys": ["shipments#*"]}), dynamodb_problems, "not confined to ['orders#*']"),
    "a second pattern": (lambda t: _condition(t)["ForAllValues:StringLike"]["dynamodb:LeadingKeys"].append(
        "shipments#*"), dynamodb_problems, "not confined"),
    "ForAnyValue": (lambda t: _condition(t).update(
        {"ForAnyValue:StringLike": _condition(t).pop("ForAllValues:StringLike")}), dynamodb_problems, "not confined"),
    "env prefix moved": (lambda t: _env(t, "OrderFunction").update({"IDEMPOTENCY_KEY_PREFIX": "payments"}),
                         dynamodb_problems, "not confined to ['payments#*']"),
    "no env prefix": (lambda t: _env(t, "ShipmentFunction").pop("IDEMPOTENCY_KEY_PREFIX"), dynamodb_problems,
                      "not an explicit literal prefix"),
    "prefix from a Ref": (lambda t: _env(t, "OrderFunction").update({"IDEMPOTENCY_KEY_PREFIX": {"Ref": "X"}}),
                          dynamodb_problems, "not an explicit literal prefix"),
    "Scan in the statement": (_add_action("OrderFunction", "dynamodb:Scan"), dynamodb_problems, "dynamodb:Scan"),
    "PartiQL in the statement": (_add_action("ShipmentFunction", "dynamodb:PartiQLSelect"), dynamodb_problems,
                                 "dynamodb:PartiQLSelect"),
    "dynamodb:* in the statement": (_add_action("OrderFunction", "dynamodb:*"), dynamodb_problems, "dynamodb:Query"),
    "Query on its own": (_extra_statement("OrdersApiFunction", {"Effect": "Allow", "Action": "dynamodb:Query",
                                                               "Resource": TABLE_ARN}), dynamodb_problems,
                         "dynamodb:Query"),
    "a table-wide GetItem": (_extra_statement("OrderFunction", {"Effect": "Allow", "Action": "dynamodb:GetItem",
                                                               "Resource": TABLE_ARN}), dynamodb_problems,
                             "not confined"),
    "items on *": (_extra_statement("OrderFunction", {"Effect": "Allow", "Action": ["dynamodb:GetItem"],
                                                     "Resource": "*"}), dynamodb_problems, "not the template's table"),
    "BatchWriteItem": (_add_action("ShipmentFunction", "dynamodb:BatchWriteItem"), dynamodb_problems,
                       "BatchWriteItem"),
    "BatchGetItem where no batch comes": (_add_action("OrderFunction", "dynamodb:BatchGetItem"), dynamodb_problems,
                                          "BatchGetItem"),
    "no PITR": (lambda t: t["Resources"]["IdempotencyTable"]["Properties"].pop("PointInTimeRecoverySpecification"),
                table_problems, "point-in-time recovery"),
    "no deletion protection": (lambda t: t["Resources"]["IdempotencyTable"]["Properties"].update(
        {"DeletionProtectionEnabled": False}), table_problems, "deletion protection"),
    "no SSE": (lambda t: t["Resources"]["IdempotencyTable"]["Properties"].pop("SSESpecification"), table_problems,
               "SSE"),
    "a SAM policy template": (lambda t: t["Resources"]["OrderFunction"]["Properties"]["Policies"].append(
        {"DynamoDBCrudPolicy": {"TableName": {"Ref": "IdempotencyTable"}}}), readable_policy_problems,
        "cannot read"),
    "a managed policy": (lambda t: t["Resources"]["ShipmentFunction"]["Properties"]["Policies"].append(
        "AmazonDynamoDBFullAccess"), readable_policy_problems, "cannot read"),
    "a role of its own": (lambda t: t["Resources"]["OrderFunction"]["Properties"].update(
        {"Role": "arn:aws:iam::123456789012:role/x"}), readable_policy_problems, "Role of its own"),
    "a tag of another prefix": (lambda t: t["Resources"]["ShipmentFunction"]["Properties"]["Tags"].update(
        {"idempotency-prefix": "orders"}), tag_problems, "is not its IDEMPOTENCY_KEY_PREFIX"),
    "HTTP without the caller header": (lambda t: _env(t, "OrdersApiFunction").pop("IDEMPOTENCY_CALLER_HEADERS"),
                                       http_problems, "IDEMPOTENCY_CALLER_HEADERS"),
}


@pytest.mark.parametrize("name", MAIN_BREAKS)
def test_each_check_catches_a_planted_break_in_template_yaml(name: str) -> None:
    mutate, check, said = MAIN_BREAKS[name]
    t = load(ROOT / "template.yaml")
    assert check(t) == []
    mutate(t)
    found = check(t)
    assert any(said in p for p in found), found


def _s3(t: dict[str, Any], sid: str) -> dict[str, Any]:
    return next(s for s in t["Resources"]["OrdersApi"]["Properties"]["Policies"][0]["Statement"] if s.get("Sid") == sid)


LARGE_BREAKS: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "DeleteObject": (lambda t: _s3(t, "ReadOwnResults").update({"Action": ["s3:GetObject", "s3:DeleteObject"]}),
                     "s3:DeleteObject"),
    "s3:*": (lambda t: _s3(t, "ReadOwnResults").update({"Action": "s3:*"}), "s3:DeleteObject"),
    "the shared prefix": (lambda t: _s3(t, "ReadOwnResults").update(
        {"Resource": {"Fn::Sub": "${ResultsBucket.Arn}/idempotency-results/*"}}), "not under its own prefix"),
    "another's prefix": (lambda t: _s3(t, "WriteOwnResultsEncrypted").update(
        {"Resource": {"Fn::Sub": "${ResultsBucket.Arn}/idempotency-results/orders/*"}}), "not under its own prefix"),
    "the whole bucket": (lambda t: _s3(t, "ReadOwnResults").update({"Resource": "*"}), "not under its own prefix"),
    "the setting moved": (lambda t: _env(t, "OrdersApi").update(
        {"IDEMPOTENCY_LARGE_RESULTS_PREFIX": "elsewhere/orders-api/"}), "not under its own prefix"),
    "PutObject unencrypted": (lambda t: _s3(t, "WriteOwnResultsEncrypted").pop("Condition"),
                              "without StringEquals on s3:x-amz-server-side-encryption"),
    "no lifecycle rule": (lambda t: t["Resources"]["ResultsBucket"]["Properties"].pop("LifecycleConfiguration"),
                          "no enabled lifecycle rule"),
}


@pytest.mark.parametrize("name", LARGE_BREAKS)
def test_each_s3_check_catches_a_planted_break(name: str) -> None:
    mutate, said = LARGE_BREAKS[name]
    t = load(ROOT / "examples" / "large-results" / "template.yaml")
    assert s3_problems(t) == []
    mutate(t)
    found = s3_problems(t)
    assert any(said in p for p in found), found


def _user(t: dict[str, Any]) -> dict[str, Any]:
    return t["Resources"]["OrdersUser"]["Properties"]


def _access(old: str, new: str) -> Callable[[dict[str, Any]], None]:
    return lambda t: _user(t).update({"AccessString": _user(t)["AccessString"].replace(old, new)})


VALKEY_BREAKS: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "a password in the URL": (lambda t: _env(t, "Orders").update(
        {"IDEMPOTENCY_VALKEY_URL": "rediss://orders:hunter2-hunter2@cache.example:6379"}), "holds a password"),
    "a parameter as the password": (lambda t: _env(t, "Orders").update({"IDEMPOTENCY_VALKEY_URL": {
        "Fn::Sub": "rediss://orders:${UserPassword}@${Cache.ClusterEndpoint.Address}:6379"}}), "holds a password"),
    "no grant on the secret": (lambda t: t["Resources"]["Orders"]["Properties"].pop("Policies"), "GetSecretValue"),
    "a grant on every secret": (lambda t: t["Resources"]["Orders"]["Properties"]["Policies"][0]["Statement"][0].update(
        {"Resource": "*"}), "GetSecretValue"),
    "every key": (_access("~orders#*", "~*"), "the ACL is not"),
    "another's keys": (_access("~orders#*", "~shipments#*"), "the ACL is not"),
    "two patterns": (_access("~orders#*", "~orders#* ~shipments#*"), "the ACL is not"),
    "no resetkeys": (_access("resetkeys ", ""), "the ACL is not"),
    "no resetchannels": (_access("resetchannels ", ""), "the ACL is not"),
    "+@all": (_access("-@all", "+@all"), "the ACL is not"),
}


@pytest.mark.parametrize("name", VALKEY_BREAKS)
def test_each_valkey_check_catches_a_planted_break(name: str) -> None:
    mutate, said = VALKEY_BREAKS[name]
    t = load(ROOT / "examples" / "valkey" / "template.yaml")
    assert valkey_problems(t) == []
    mutate(t)
    found = valkey_problems(t)
    assert any(said in p for p in found), found


def test_the_sort_key_layout_is_checked_against_its_partition_value() -> None:
    t = load(ROOT / "template.yaml")
    _env(t, "OrderFunction")["IDEMPOTENCY_SORT_KEY_ATTR"] = "sk"
    assert any("not confined to ['idempotency#orders']" in p for p in dynamodb_problems(t))
    _condition(t).pop("ForAllValues:StringLike")
    _condition(t)["ForAllValues:StringEquals"] = {"dynamodb:LeadingKeys": ["idempotency#orders"]}
    assert dynamodb_problems(t) == []
    _env(t, "OrderFunction")["IDEMPOTENCY_PARTITION_VALUE"] = "idempotency#payments"
    assert any("idempotency#payments" in p for p in dynamodb_problems(t))


def test_the_powertools_statement_is_getitem_only_on_its_handlers_keys() -> None:
    t = load(ROOT / "template.yaml")
    _env(t, "OrderFunction")["IDEMPOTENCY_POWERTOOLS_HANDLER"] = "app.handler"
    migration = {"Sid": "PowertoolsMigrationReadOnly", "Effect": "Allow", "Action": "dynamodb:GetItem",
                 "Resource": TABLE_ARN, "Condition": {
                     "ForAllValues:StringLike": {"dynamodb:LeadingKeys": ["OrderFunction.app.handler#*"]},
                     "Null": NULL_GUARD}}
    _extra_statement("OrderFunction", migration)(t)
    assert dynamodb_problems(t) == []
    for broken in ({"Action": ["dynamodb:GetItem", "dynamodb:PutItem"]},  # a write on Powertools' keys
                   {"Condition": {"ForAllValues:StringLike": {"dynamodb:LeadingKeys": ["*.app.handler#*"]},
                                  "Null": NULL_GUARD}},
                   {"Condition": {"ForAllValues:StringLike": {
                       "dynamodb:LeadingKeys": ["OrderFunction.app.handler#*"]}}}):  # no Null guard
        planted = copy.deepcopy(t)
        planted["Resources"]["OrderFunction"]["Properties"]["Policies"][0]["Statement"][-1].update(broken)
        assert dynamodb_problems(planted), broken


README_BREAKS = {
    "no Null guard": (',\n                "Null": {"dynamodb:LeadingKeys": "false"}', "", "no Null guard"),
    "pattern *": ('["<prefix>#*"]', '["*"]', "not confined"),
    "no Version": ('"Version": "2012-10-17", ', "", "no Version"),
    "Scan added": ('"dynamodb:BatchGetItem"]', '"dynamodb:BatchGetItem", "dynamodb:Scan"]', "dynamodb:Scan"),
    "does not parse": ('"Effect": "Allow",', '"Effect": "Allow"', "does not parse"),
}


@pytest.mark.parametrize("name", README_BREAKS)
def test_the_readme_check_catches_a_planted_break(name: str) -> None:
    old, new, said = README_BREAKS[name]
    text = (ROOT / "README.md").read_text()
    assert old in text, f"the README no longer holds {old!r}: update this test"
    found = readme_problems(text.replace(old, new, 1))
    assert any(said in p for p in found), found


def test_the_docs_check_catches_a_planted_break() -> None:
    text = (ROOT / "docs" / "security.md").read_text()
    assert docs_problems(text) == []
    guard = '"Null": {"dynamodb:LeadingKeys": "false"}'
    assert guard in text
    assert any("no Null guard" in p for p in docs_problems(text.replace(guard, '"Null": {}', 1)))
    assert any("does not parse" in p for p in docs_problems(text.replace('"Effect": "Allow",', '"Effect": "Allow"', 1)))
    assert any("dynamodb:Query" in p for p in docs_problems(text.replace('"dynamodb:GetItem"', '"dynamodb:Query"', 1)))
    # The operator's statement is table-wide by design; any other without a condition is not.
    assert any("not confined" in p for p in docs_problems(text, operator_sids=()))
