"""gac's errors as Python exceptions.

Every error of gac's C++ libraries is a ``gac.Status`` with a gRPC status
code; in Python it is raised as a :class:`GacError` subclass that carries the
message and the code (``error.code``, a :class:`StatusCode`). Where a
built-in exception means the same, the class derives from it too, so
``except ValueError`` catches bad arguments (``INVALID_ARGUMENT``) and
``except TimeoutError`` a missed deadline.
"""

from __future__ import annotations

import enum
from typing import Dict, Type


class StatusCode(enum.IntEnum):
    """gRPC's status codes, as gac's C++ ``gac::StatusCode`` numbers them."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


class GacError(Exception):
    """An error of gac's C++ libraries: ``str(error)`` is its message and
    ``error.code`` its :class:`StatusCode`."""

    def __init__(self, message: str, code: int = StatusCode.UNKNOWN) -> None:
        super().__init__(message)
        self.message = message
        self.code = StatusCode(code)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, code=StatusCode.{self.code.name})"


class InvalidArgumentError(GacError, ValueError):
    """A bad argument (``INVALID_ARGUMENT``); nothing was changed."""


class FailedPreconditionError(GacError, RuntimeError):
    """The call does not fit the object's state (``FAILED_PRECONDITION``), e.g.
    a different parameter list than the agent tracks: call ``reset()``."""


class UnavailableError(GacError, ConnectionError):
    """A peer (gacd, another rank) could not be reached (``UNAVAILABLE``)."""


class DeadlineExceededError(GacError, TimeoutError):
    """The call did not finish within its deadline (``DEADLINE_EXCEEDED``)."""


class NotFoundError(GacError, LookupError):
    """Something named does not exist (``NOT_FOUND``)."""


class PermissionDeniedError(GacError, PermissionError):
    """The token or the file system refused (``PERMISSION_DENIED``,
    ``UNAUTHENTICATED``)."""


class UnimplementedError(GacError, NotImplementedError):
    """Not supported by this build or this gacd (``UNIMPLEMENTED``)."""


_CLASSES: Dict[int, Type[GacError]] = {
    StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    StatusCode.OUT_OF_RANGE: InvalidArgumentError,
    StatusCode.FAILED_PRECONDITION: FailedPreconditionError,
    StatusCode.UNAVAILABLE: UnavailableError,
    StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
    StatusCode.NOT_FOUND: NotFoundError,
    StatusCode.PERMISSION_DENIED: PermissionDeniedError,
    StatusCode.UNAUTHENTICATED: PermissionDeniedError,
    StatusCode.UNIMPLEMENTED: UnimplementedError,
}


def error_class(code: int) -> Type[GacError]:
    """The exception class raised for a status code (the C++ modules' choice)."""
    return _CLASSES.get(code, GacError)
