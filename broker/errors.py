"""The SDK's public error module: every error Trellis raises, under ``TrellisError``.

The root and its families live in :mod:`security.errors` (importable by every package);
this module adds the broker's own leaves and the table the SDK uses to raise the class
matching an ``ERROR`` frame's ``code``.
"""

from __future__ import annotations

from security.errors import (
    ConnectionLost,
    IntegrityError,
    InvalidRequest,
    NotAuthorized,
    ProtocolError,
    TrellisError,
    TrellisTimeout,
)

__all__ = [
    "ERRORS_BY_CODE",
    "ConnectionLost",
    "FilterError",
    "FilterSyntaxError",
    "IntegrityError",
    "InvalidRequest",
    "LimitExceeded",
    "NotAuthorized",
    "PayloadTooLarge",
    "ProtocolError",
    "SlowConsumerError",
    "TLSError",
    "TrellisError",
    "TrellisTimeout",
]


class FilterError(InvalidRequest):
    """A filter (subscription or advertisement) is not valid."""

    code = "invalid_filter"


class FilterSyntaxError(FilterError):
    """The text form of a filter does not parse.

    Attributes:
        text: the whole filter text.
        position: 0-based character offset of the offending token.
        token: the offending token ('' at end of input).
    """

    code = "filter_syntax"

    def __init__(self, message: str, text: str = "", position: int = 0, token: str = "") -> None:
        super().__init__(message)
        self.text = text
        self.position = position
        self.token = token


class PayloadTooLarge(InvalidRequest):
    """A publication or frame exceeds the configured maximum size."""

    code = "too_large"

    def __init__(self, message: str, size: int = 0, limit: int = 0) -> None:
        super().__init__(message)
        self.size = size
        self.limit = limit


class LimitExceeded(InvalidRequest):
    """A request would take a client past one of the broker's configured limits (the
    message names the limit's config key); the connection stays open."""

    code = "limit_exceeded"


class SlowConsumerError(TrellisError):
    """A subscription's bounded queue overflowed and messages were dropped.

    Attributes:
        pending: messages waiting in the queue when the error was raised.
        dropped: messages dropped since the subscription started.
    """

    code = "slow_consumer"

    def __init__(self, message: str, pending: int = 0, dropped: int = 0) -> None:
        super().__init__(message)
        self.pending = pending
        self.dropped = dropped


class TLSError(NotAuthorized):
    """A TLS connection was refused: the broker's certificate is not trusted, or the broker
    refused this side's certificate (none, another CA's, the wrong name). Retrying with the
    same files cannot help.

    Attributes:
        endpoint: the ``host:port`` it happened at ('' when the broker reported it).
    """

    code = "tls"

    def __init__(self, message: str, endpoint: str = "") -> None:
        super().__init__(message)
        self.endpoint = endpoint


ERRORS_BY_CODE: dict[str, type[TrellisError]] = {
    cls.code: cls
    for cls in (
        TrellisError,
        InvalidRequest,
        FilterError,
        FilterSyntaxError,
        PayloadTooLarge,
        LimitExceeded,
        ProtocolError,
        NotAuthorized,
        ConnectionLost,
        TrellisTimeout,
        SlowConsumerError,
        IntegrityError,
        TLSError,
    )
}
