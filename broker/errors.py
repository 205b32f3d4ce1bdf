"""The exception hierarchy shared by the broker, the SDK and the CLI.

Classes are split by what the caller should do next: retry (``ConnectionLost``,
``TrellisTimeout``), fix the input (``InvalidRequest`` and its children), or give up
(``NotAuthorized``). Every class carries its data as attributes, and every error the
broker sends on the wire has a stable ``code`` so the SDK can raise the matching class.
"""

from __future__ import annotations


class TrellisError(Exception):
    """Root of every error Trellis raises."""

    code: str = "internal"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidRequest(TrellisError):
    """The request itself is wrong: fix the input, retrying the same bytes cannot help."""

    code = "invalid_request"


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


class ProtocolError(TrellisError):
    """The peer broke the wire protocol (malformed frame, unknown type, wrong order)."""

    code = "protocol"


class NotAuthorized(TrellisError):
    """The peer is not allowed to do this; retrying will not help."""

    code = "not_authorized"


class ConnectionLost(TrellisError):
    """The connection to the broker went away; the SDK reconnects, the caller may retry."""

    code = "connection_lost"


class TrellisTimeout(TrellisError):
    """A network wait ran out of time; the caller may retry."""

    code = "timeout"


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


ERRORS_BY_CODE: dict[str, type[TrellisError]] = {
    cls.code: cls
    for cls in (
        TrellisError,
        InvalidRequest,
        FilterError,
        FilterSyntaxError,
        PayloadTooLarge,
        ProtocolError,
        NotAuthorized,
        ConnectionLost,
        TrellisTimeout,
        SlowConsumerError,
    )
}
