import pytest

from idempotency_layer.config import load
from idempotency_layer.errors import IdempotencyConfigurationError

BASE = {"IDEMPOTENCY_ORIGINAL_HANDLER": "app.handler", "IDEMPOTENCY_TABLE": "orders", "AWS_LAMBDA_FUNCTION_NAME": "fn"}


def test_defaults():
    config = load(BASE)
    assert config.table == "orders"
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
    assert config.scope == "auto"
    assert config.payload_jmespath is None and config.attributes.payload_hash == "payload_hash"
    assert config.in_progress_seconds == 0 and config.wait_seconds == 0
    assert config.http is True and config.key_header == "Idempotency-Key"
    assert config.stream_checkpoint is True


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
        ("IDEMPOTENCY_SCOPE", "records", "auto, event, record"),
        ("IDEMPOTENCY_STREAM_FAILURES", "record", "checkpoint, records"),
        ("IDEMPOTENCY_STREAM_FAILURES", "first", "checkpoint, records"),
        ("IDEMPOTENCY_HTTP", "on", "auto, off"),
        ("IDEMPOTENCY_HTTP_ANONYMOUS", "isolated", "separate, shared"),
        ("IDEMPOTENCY_HTTP_PREVIOUS_KEYS", "on", "consult, off"),
        ("IDEMPOTENCY_KEY_HEADER", "Idempotency Key", "not an HTTP header name"),
        ("IDEMPOTENCY_CALLER_HEADERS", "Authorization, X User", "'X User' is not an HTTP header name"),
        ("IDEMPOTENCY_CALLER_HEADERS", "authorization,", "'' is not an HTTP header name"),
        ("IDEMPOTENCY_CALLER_HEADERS", "idempotency-key", "names the key header"),
        ("IDEMPOTENCY_WAIT_SECONDS", "901", "seconds from 0"),
        ("IDEMPOTENCY_WAIT_SECONDS", "soon", "seconds"),
        ("IDEMPOTENCY_IN_PROGRESS_SECONDS", "-1", "whole number from 0"),
        ("IDEMPOTENCY_IN_PROGRESS_SECONDS", "1_000", "whole number"),
        ("IDEMPOTENCY_WAIT_SECONDS", "1_0", "seconds"),
        ("IDEMPOTENCY_WAIT_SECONDS", "\uff15", "seconds"),  # a fullwidth digit five
        ("IDEMPOTENCY_TTL_SECONDS", "\u0665", "whole number"),  # an Arabic-Indic digit five
        ("IDEMPOTENCY_READ_TIMEOUT", "1e1", "seconds"),
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
    env = {"IDEMPOTENCY_ORIGINAL_HANDLER": "app.handler", "IDEMPOTENCY_TABLE": "orders"}
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


def test_attribute_names_must_differ_and_the_error_names_both_variables():
    with pytest.raises(IdempotencyConfigurationError, match="IDEMPOTENCY_STATUS_ATTR and IDEMPOTENCY_OWNER_ATTR"):
        load({**BASE, "IDEMPOTENCY_OWNER_ATTR": "status"})
    with pytest.raises(IdempotencyConfigurationError, match="IDEMPOTENCY_KEY_ATTR and IDEMPOTENCY_SORT_KEY_ATTR"):
        load({**BASE, "IDEMPOTENCY_SORT_KEY_ATTR": "id"})


@pytest.mark.parametrize("table", ["ab", "orders!", "a" * 256, "arn:aws:dynamodb:us-east-1:123:table/orders",
                                   "arn:aws:s3:::bucket", "orders table"])
def test_table_must_be_a_name_or_an_arn(table):
    with pytest.raises(IdempotencyConfigurationError, match="IDEMPOTENCY_TABLE"):
        load({**BASE, "IDEMPOTENCY_TABLE": table})


@pytest.mark.parametrize("table", ["abc", "my_table.v2-prod", "a" * 255,
                                   "arn:aws:dynamodb:eu-west-1:123456789012:table/orders",
                                   "arn:aws-cn:dynamodb:cn-north-1:123456789012:table/orders"])
def test_table_names_and_arns_are_accepted(table):
    assert load({**BASE, "IDEMPOTENCY_TABLE": table}).table == table


def test_sort_key_attribute_name_is_at_most_255_bytes():
    with pytest.raises(IdempotencyConfigurationError, match="IDEMPOTENCY_SORT_KEY_ATTR"):
        load({**BASE, "IDEMPOTENCY_SORT_KEY_ATTR": "s" * 256})


def test_key_prefix_is_at_most_64_characters_in_either_key_layout():
    assert load({**BASE, "IDEMPOTENCY_KEY_PREFIX": "p" * 64}).key_prefix == "p" * 64
    for layout in ({}, {"IDEMPOTENCY_SORT_KEY_ATTR": "sk"}):
        with pytest.raises(IdempotencyConfigurationError, match=r"IDEMPOTENCY_KEY_PREFIX=.* 1 to 64 of"):
            load({**BASE, **layout, "IDEMPOTENCY_KEY_PREFIX": "p" * 65})


def test_partition_value_needs_a_sort_key_and_fits_a_key():
    with pytest.raises(IdempotencyConfigurationError, match="IDEMPOTENCY_PARTITION_VALUE is set but"):
        load({**BASE, "IDEMPOTENCY_PARTITION_VALUE": "IDEM"})
    with pytest.raises(IdempotencyConfigurationError, match=r"IDEMPOTENCY_PARTITION_VALUE='v{128}'\.\.\. \(2049"):
        load({**BASE, "IDEMPOTENCY_SORT_KEY_ATTR": "sk", "IDEMPOTENCY_PARTITION_VALUE": "v" * 2049})


def test_choices_are_case_insensitive():
    config = load({**BASE, "IDEMPOTENCY_TRANSPORT": "BOTO3", "IDEMPOTENCY_LOG_LEVEL": "debug",
                   "IDEMPOTENCY_SCOPE": "Record", "IDEMPOTENCY_STREAM_FAILURES": " Records "})
    assert config.transport == "boto3"
    assert config.stream_checkpoint is False
    assert config.scope == "record"
    assert config.log_level == "DEBUG"


@pytest.mark.parametrize("name", ["IDEMPOTENCY_KEY_PREFIX", "IDEMPOTENCY_KEY_ATTR", "IDEMPOTENCY_TABLE"])
def test_values_that_are_not_utf8_name_the_variable(name):
    with pytest.raises(IdempotencyConfigurationError, match=f"{name} is not valid UTF-8"):
        load({**BASE, name: "a\udcff"})


def test_disabled_skips_the_key_prefix_length_check():
    assert load({**BASE, "IDEMPOTENCY_DISABLED": "true", "IDEMPOTENCY_KEY_PREFIX": "p" * 3000}).disabled


def test_payload_waiting_and_in_progress_settings_are_read():
    config = load({**BASE, "IDEMPOTENCY_PAYLOAD_JMESPATH": "body", "IDEMPOTENCY_WAIT_SECONDS": "2.5",
                   "IDEMPOTENCY_IN_PROGRESS_SECONDS": "600", "IDEMPOTENCY_PAYLOAD_HASH_ATTR": "ph"})
    assert config.payload_jmespath == "body" and config.wait_seconds == 2.5
    assert config.in_progress_seconds == 600 and config.attributes.payload_hash == "ph"


def test_the_payload_hash_attribute_must_not_clash():
    clash = "IDEMPOTENCY_STATUS_ATTR and IDEMPOTENCY_PAYLOAD_HASH_ATTR"
    with pytest.raises(IdempotencyConfigurationError, match=clash):
        load({**BASE, "IDEMPOTENCY_PAYLOAD_HASH_ATTR": "status"})


def test_empty_or_blank_values_count_as_unset():
    config = load({**BASE, "IDEMPOTENCY_TTL_SECONDS": "  ", "IDEMPOTENCY_PAYLOAD_JMESPATH": "",
                   "IDEMPOTENCY_WAIT_SECONDS": " ", "IDEMPOTENCY_SCOPE": "", "IDEMPOTENCY_STREAM_FAILURES": " "})
    assert (config.ttl_seconds, config.payload_jmespath, config.wait_seconds, config.scope) == (3600, None, 0, "auto")
    assert config.stream_checkpoint is True


def test_caller_headers_are_a_lower_cased_list_without_repeats():
    assert load(BASE).caller_headers == ()
    config = load({**BASE, "IDEMPOTENCY_CALLER_HEADERS": " Authorization , X-Api-Key,authorization "})
    assert config.caller_headers == ("authorization", "x-api-key")


def test_anonymous_http_callers_are_kept_apart_unless_told_to_share():
    assert load(BASE).http_anonymous_shared is False
    assert load({**BASE, "IDEMPOTENCY_HTTP_ANONYMOUS": "separate"}).http_anonymous_shared is False
    assert load({**BASE, "IDEMPOTENCY_HTTP_ANONYMOUS": "Shared"}).http_anonymous_shared is True


def test_previous_http_keys_are_consulted_until_turned_off():
    assert load(BASE).http_previous_keys is True
    assert load({**BASE, "IDEMPOTENCY_HTTP_PREVIOUS_KEYS": "off"}).http_previous_keys is False


def test_caller_headers_under_http_off_fail_init_instead_of_being_ignored():
    # With HTTP handling off nothing reads them: every caller would share each key without a word.
    settings = {**BASE, "IDEMPOTENCY_CALLER_HEADERS": "Authorization", "IDEMPOTENCY_HTTP": "off"}
    with pytest.raises(IdempotencyConfigurationError, match="CALLER_HEADERS is set but IDEMPOTENCY_HTTP=off"):
        load(settings)
    assert load({**settings, "IDEMPOTENCY_HTTP": "auto"}).caller_headers == ("authorization",)
    assert load({**settings, "IDEMPOTENCY_CALLER_HEADERS": " "}).http is False


@pytest.mark.parametrize(("name", "value"), [("IDEMPOTENCY_HTTP_ANONYMOUS", "shared"),
                                           ("IDEMPOTENCY_HTTP_ANONYMOUS", "separate"),
                                           ("IDEMPOTENCY_HTTP_PREVIOUS_KEYS", "off"),
                                           ("IDEMPOTENCY_HTTP_PREVIOUS_KEYS", "consult")])
def test_http_only_settings_under_http_off_fail_init_instead_of_being_ignored(name, value):
    settings = {**BASE, name: value, "IDEMPOTENCY_HTTP": "off"}
    with pytest.raises(IdempotencyConfigurationError) as raised:
        load(settings)
    assert str(raised.value) == (f"{name} is set but IDEMPOTENCY_HTTP=off: it decides only for requests the layer "
                                 f"handles as HTTP, so nothing would read it; unset {name}, or unset IDEMPOTENCY_HTTP "
                                 "(auto)")
    assert load({**settings, "IDEMPOTENCY_HTTP": "auto"}).http is True
    assert load({**settings, name: " "}).http is False  # blank is unset


@pytest.mark.parametrize(("name", "meant"), [
    ("IDEMPOTENCY_KEY_JMESPAHT", "IDEMPOTENCY_KEY_JMESPATH"),  # the key would fall back to the whole event
    ("IDEMPOTENCY_TTL", "IDEMPOTENCY_TTL_SECONDS"),
    ("IDEMPOTENCY_WAIT", "IDEMPOTENCY_WAIT_SECONDS"),
    ("IDEMPOTENCY_REQUIREKEY", "IDEMPOTENCY_REQUIRE_KEY"),
    ("IDEMPOTENCY_PAYLOAD_JMESPAT", "IDEMPOTENCY_PAYLOAD_JMESPATH"),
    ("IDEMPOTENCY_TABEL", "IDEMPOTENCY_TABLE"),
    ("idempotency_key_jmespath", "IDEMPOTENCY_KEY_JMESPATH"),  # names are case-sensitive: this one is not read
])
def test_a_mistyped_name_fails_init_naming_it_and_what_was_meant(name, meant):
    with pytest.raises(IdempotencyConfigurationError) as raised:
        load({**BASE, name: "paymentId"})
    message = str(raised.value)
    assert message.startswith(f"{name} is set, but it is not a setting of this layer (did you mean {meant}?)")
    assert "paymentId" not in message  # a value may be anything; the name is what is wrong


@pytest.mark.parametrize("name", ["IDEMPOTENCY_FOO", "IDEMPOTENCY_KEY", "IDEMPOTENCY_TIMEOUT"])
def test_an_unknown_name_with_no_clear_match_fails_init_without_a_guess(name):
    # IDEMPOTENCY_KEY could be four settings, IDEMPOTENCY_TIMEOUT two: no guess is better than a wrong one.
    with pytest.raises(IdempotencyConfigurationError, match=f"^{name} is set, but it is not a setting of this "
                                                            "layer; a misspelled setting"):
        load({**BASE, name: "x"})


def test_names_the_wrapper_and_the_cli_set_are_allowed_and_a_blank_unknown_name_is_unset():
    settings = {**BASE, "IDEMPOTENCY_NEXT_WRAPPER": "/opt/other", "IDEMPOTENCY_WRAPPER_CHAINED": "1",
                "IDEMPOTENCY_CLI_TRACEBACK": "1", "IDEMPOTENCY_UNUSED": "  "}
    assert load(settings).table == "orders"
    # Another prefix is none of the layer's business (Powertools' own, for one).
    assert load({**BASE, "POWERTOOLS_IDEMPOTENCY_DISABLED": "true", "MY_IDEMPOTENCY_KEY": "x"}).disabled is False


def test_a_mistyped_name_fails_even_when_the_layer_is_disabled():
    with pytest.raises(IdempotencyConfigurationError, match="did you mean IDEMPOTENCY_KEY_JMESPATH"):
        load({**BASE, "IDEMPOTENCY_DISABLED": "true", "IDEMPOTENCY_KEY_JMESPAHT": "orderId"})


def test_the_powertools_handler_is_a_module_and_function_on_powertools_layout():
    assert load(BASE).powertools_handler is None
    for name in ("app.handler", "my-app.handler", "app.make.<locals>.handler"):  # as Powertools joins them
        assert load({**BASE, "IDEMPOTENCY_POWERTOOLS_HANDLER": name}).powertools_handler == name
    with pytest.raises(IdempotencyConfigurationError, match="is not a handler as Powertools names it"):
        load({**BASE, "IDEMPOTENCY_POWERTOOLS_HANDLER": "handler"})
    with pytest.raises(IdempotencyConfigurationError, match="a partition key only"):
        load({**BASE, "IDEMPOTENCY_POWERTOOLS_HANDLER": "app.handler", "IDEMPOTENCY_SORT_KEY_ATTR": "sk"})
    without_name = {k: v for k, v in BASE.items() if k != "AWS_LAMBDA_FUNCTION_NAME"}
    with pytest.raises(IdempotencyConfigurationError, match="AWS_LAMBDA_FUNCTION_NAME"):
        load({**without_name, "IDEMPOTENCY_KEY_PREFIX": "p", "IDEMPOTENCY_POWERTOOLS_HANDLER": "app.handler"})


@pytest.mark.parametrize(("name", "meant"), [
    ("IDEMPOTENTCY_KEY_JMESPATH", "IDEMPOTENCY_KEY_JMESPATH"),
    ("IDEMPOTENCYKEY_JMESPATH", "IDEMPOTENCY_KEY_JMESPATH"),
    ("idempotancy_ttl_seconds", "IDEMPOTENCY_TTL_SECONDS"),
])
def test_a_setting_with_its_prefix_misspelled_fails_init_too(name, meant):
    said = f"{name} is set, and looks like a setting of this layer with IDEMPOTENCY_ misspelled (did you mean {meant}?)"
    with pytest.raises(IdempotencyConfigurationError) as raised:
        load({**BASE, name: "paymentId"})
    assert str(raised.value).startswith(said)


@pytest.mark.parametrize("name", ["IDEMPOTENT_MODE", "IDEMLAYER_TEST_CACHE", "IDEM_POTENT", "MY_IDEMPOTENCY_KEY"])
def test_a_name_of_ones_own_that_only_starts_alike_is_left_alone(name):
    assert load({**BASE, name: "x"}).table == "orders"
