"""Error types raised by the layer. The Lambda runtime reports each by its class name as `errorType`."""


class IdempotencyError(Exception):
    """Base class of every error the layer raises itself."""


class IdempotencyConfigurationError(IdempotencyError):
    """A setting is missing or invalid; raised at init, before the first event."""


class IdempotencyKeyError(IdempotencyError):
    """The key expression selected nothing and IDEMPOTENCY_REQUIRE_KEY is true."""


class IdempotencyAlreadyInProgressError(IdempotencyError):
    """Another invocation holds a live claim on the same key."""


class IdempotencyPayloadMismatchError(IdempotencyError):
    """The key was used before with a payload whose fingerprint (IDEMPOTENCY_PAYLOAD_JMESPATH) differs."""


class IdempotencyPersistenceLayerError(IdempotencyError):
    """The table could not be read or written; the handler was not run.

    `permanent`: retrying cannot help (no table, no permission, a request the table refuses). `uncertain`: the
    failed request may have been applied all the same (its answer lost, a 5xx). `denied`: the function's role may
    not make this request (a permission the layer can work without, such as BatchGetItem's, is then given up).
    `integrity`: a completed record failed its authentication (IDEMPOTENCY_RECORD_MAC_KEY); it is never used,
    and a batch reports its record failed."""

    def __init__(self, message: str, *, permanent: bool = False, uncertain: bool = False,
                 denied: bool = False, integrity: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent
        self.uncertain = uncertain
        self.denied = denied
        self.integrity = integrity


class IdempotencyResultTooLargeError(IdempotencyError):
    """The first run completed, but its result was too large to store, so it cannot be replayed."""


class IdempotencyResultUndeliverableError(IdempotencyError):
    """The first run completed, but the runtime could not send the value its handler returned, so there is nothing
    to replay; the handler does not run again while the record lives."""


class IdempotencyClaimConflictError(IdempotencyError):
    """The claim kept failing on a record the client clock saw as expired (clock skew between client and table)."""


class IdempotencyBatchIncompleteError(IdempotencyError):
    """Records of a batch must come back but the source cannot be told which (Amazon MQ, or
    IDEMPOTENCY_BATCH_RESPONSE=fail): the invocation fails after the records that ran were completed."""
