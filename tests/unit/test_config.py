import pytest

from idempotency_layer.config import load
from idempotency_layer.errors import IdempotencyConfigurationError

BASE = {"IDEMPOTENCY_ORIGINAL_HANDLER": "app.handler", "IDEMPOTENCY_TABLE": "t", "AWS_LAMBDA_FUNCTION_NAME": "fn"}


def test_defaults():
    config = load(BASE)
    assert config.table == "t"
    assert config.key_prefix == "fn"
    assert config.key_jmespath is None
    assert config.ttl_seconds == 3600
    assert config.require_key is False
    assert config.disabled is False
    assert config.local_cache_size == 0
    assert config.transport == "lean"
    assert config.log_level == "WARNING"
    assert config.max_attempts == 3
    assert config.attributes.key == "id" and config.attributes.expires_at == "expires_at"
    assert config.attributes.sort_key is None and config.partition_value is None
    assert config.original_handler == "app.handler"


def test_config_is_immutable():
    config = load(BASE)
    with pytest.raises(AttributeError):
        config.table = "other"  # type: ignore[misc]


@pytest.mark.parametrize("text", ["true", "TRUE", "1", "yes", "Yes"])
def test_true_booleans(text):
    assert load({**BASE, "IDEMPOTENCY_REQUIRE_KEY": text}).require_key is True


@pytest.mark.parametrize("text", ["false", "False", "0", "no", "NO"])
def test_false_booleans(text):
    assert load({**BASE, "IDEMPOTENCY_REQUIRE_KEY": text}).require_key is False


@pytest.mark.parametrize(
    ("name", "value", "accepted"),
    [
        ("IDEMPOTENCY_REQUIRE_KEY", "maybe", "true/false"),
        ("IDEMPOTENCY_DISABLED", "on", "true/false"),
        ("IDEMPOTENCY_TTL_SECONDS", "abc", "whole number"),
        ("IDEMPOTENCY_TTL_SECONDS", "0", "whole number from 1"),
        ("IDEMPOTENCY_LOCAL_CACHE_SIZE", "-1", "whole number from 0"),
        ("IDEMPOTENCY_MAX_ATTEMPTS", "11", "from 1 to 10"),
        ("IDEMPOTENCY_READ_TIMEOUT", "fast", "seconds"),
        ("IDEMPOTENCY_TRANSPORT", "http2", "lean, boto3"),
        ("IDEMPOTENCY_LOG_LEVEL", "LOUD", "DEBUG, INFO, WARNING, ERROR"),
    ],
)
def test_bad_settings_name_variable_value_and_accepted(name, value, accepted):
    with pytest.raises(IdempotencyConfigurationError) as caught:
        load({**BASE, name: value})
    message = str(caught.value)
    assert name in message
    assert repr(value) in message
    assert accepted in message


def test_table_required():
    env = dict(BASE)
    del env["IDEMPOTENCY_TABLE"]
    with pytest.raises(IdempotencyConfigurationError, match="IDEMPOTENCY_TABLE"):
        load(env)


def test_table_not_required_when_disabled():
    env = {"IDEMPOTENCY_ORIGINAL_HANDLER": "app.handler", "IDEMPOTENCY_DISABLED": "yes"}
    assert load(env).disabled is True


def test_original_handler_required():
    env = dict(BASE)
    del env["IDEMPOTENCY_ORIGINAL_HANDLER"]
    with pytest.raises(IdempotencyConfigurationError, match="AWS_LAMBDA_EXEC_WRAPPER"):
        load(env)


def test_prefix_required_without_function_name():
    env = {"IDEMPOTENCY_ORIGINAL_HANDLER": "app.handler", "IDEMPOTENCY_TABLE": "t"}
    with pytest.raises(IdempotencyConfigurationError, match="IDEMPOTENCY_KEY_PREFIX"):
        load(env)
    assert load({**env, "IDEMPOTENCY_KEY_PREFIX": "orders"}).key_prefix == "orders"


def test_whole_event_expression_is_the_default():
    assert load({**BASE, "IDEMPOTENCY_KEY_JMESPATH": "@"}).key_jmespath is None
    assert load({**BASE, "IDEMPOTENCY_KEY_JMESPATH": " orderId "}).key_jmespath == "orderId"


def test_sort_key_layout_gets_a_static_partition_value():
    config = load({**BASE, "IDEMPOTENCY_SORT_KEY_ATTR": "sk", "IDEMPOTENCY_KEY_ATTR": "pk"})
    assert config.attributes.sort_key == "sk"
    assert config.partition_value == "idempotency#fn"
    config = load({**BASE, "IDEMPOTENCY_SORT_KEY_ATTR": "sk", "IDEMPOTENCY_PARTITION_VALUE": "IDEM"})
    assert config.partition_value == "IDEM"


def test_attribute_names_must_differ():
    with pytest.raises(IdempotencyConfigurationError, match="same attribute twice"):
        load({**BASE, "IDEMPOTENCY_OWNER_ATTR": "status"})


def test_choices_are_case_insensitive():
    config = load({**BASE, "IDEMPOTENCY_TRANSPORT": "BOTO3", "IDEMPOTENCY_LOG_LEVEL": "debug"})
    assert config.transport == "boto3"
    assert config.log_level == "DEBUG"
