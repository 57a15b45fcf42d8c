"""Domain errors that cross from the engine to the gRPC edge.

Each class names the gRPC status code the servicer answers with (by name, so this module
and the engine never import grpc). Messages say what to change.

A request is wrong only where it is read: the parsing layer and the prepare step
(`engine.prepare`) turn their ``ValueError`` into ``InvalidArgument``, as do the checks of a
Score or Embedding request. Anywhere else a plain ``ValueError`` (raised inside mlx-lm, say)
is a fault of the server: INTERNAL, with its message. ``as_backend_error`` is the one place
that maps an exception to a domain error.
"""

from __future__ import annotations


class BackendError(Exception):
    """Base class; ``status`` is the name of a ``grpc.StatusCode`` member."""

    status = "INTERNAL"


class InvalidArgument(BackendError, ValueError):
    """The request itself is wrong (bad field value, prompt too long, bad JSON). Also a
    ``ValueError``: what the request layers raise, for callers that check for one."""

    status = "INVALID_ARGUMENT"


class FailedPrecondition(BackendError):
    """The server is not in a state to answer (no model loaded, shutting down)."""

    status = "FAILED_PRECONDITION"


class NotFound(BackendError):
    """The request names something this backend does not have (model identity mismatch)."""

    status = "NOT_FOUND"


class ResourceExhausted(BackendError):
    """Too many requests in flight or waiting; retry later."""

    status = "RESOURCE_EXHAUSTED"


class Cancelled(BackendError):
    """The request was cancelled (client gone, deadline passed, server stopping)."""

    status = "CANCELLED"


class Unavailable(BackendError):
    """The backend cannot serve now (a distributed rank was lost); retry elsewhere or later."""

    status = "UNAVAILABLE"


class ModelLoadError(BackendError):
    """A model could not be resolved or loaded; the message says why and what to change.

    LoadModel answers it as ``Result(success=false, message=...)``, as LocalAI expects.
    The message is capped at ``MAX_LOAD_ERROR_CHARS`` (its start and end kept): a
    loader's error can list every parameter of a model (millions of characters).
    """

    status = "FAILED_PRECONDITION"

    def __init__(self, message: object = "") -> None:
        super().__init__(shorten(str(message), MAX_LOAD_ERROR_CHARS))


MAX_LOAD_ERROR_CHARS = 1500  # longest ModelLoadError message, in the reply and the log


def shorten(text: str, limit: int) -> str:
    """``text``, or when longer than ``limit`` characters its start and end around a
    note of how much was cut (at most ``limit`` characters in all)."""
    if len(text) <= limit:
        return text
    note = f" ... [{len(text)} characters, cut] ... "
    head = (limit - len(note)) * 3 // 4
    tail = limit - len(note) - head
    return text[:head] + note[: limit - head - tail] + (text[-tail:] if tail > 0 else "")


def as_backend_error(exc: BaseException) -> BackendError:
    """The domain error for ``exc``: itself when it is one, else INTERNAL with its type and
    message (a ``ValueError`` too: the request layers raise ``InvalidArgument``)."""
    if isinstance(exc, BackendError):
        return exc
    return BackendError(f"{type(exc).__name__}: {exc}")


def invalid_argument(exc: ValueError) -> InvalidArgument:
    """``exc``, raised while reading a request, as the INVALID_ARGUMENT it is."""
    if isinstance(exc, InvalidArgument):
        return exc
    return InvalidArgument(str(exc))
