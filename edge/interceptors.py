"""gRPC server interceptors: bearer-token auth and request-decoding errors.

- ``LOCALAI_GRPC_AUTH_TOKEN``: when set (non-blank), every call must carry metadata
  ``authorization: Bearer <token>`` (compared in constant time), else UNAUTHENTICATED.
  One exemption: ``/grpc.health.v1.Health/Check``, so Kubernetes' native gRPC probes and
  load balancers, which cannot send credentials, still see liveness; it answers only
  SERVING / NOT_SERVING and reveals nothing else. ``Health/Watch``, LocalAI's own
  ``backend.Backend/Health`` and server reflection all need the token.
- ``DecodeErrorInterceptor``: a request that does not parse (e.g. invalid UTF-8 in a
  string field) gets INVALID_ARGUMENT rather than UNKNOWN and a logged traceback.

Never imports MLX or the engine.
"""

from __future__ import annotations

import hashlib
import hmac
import inspect
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import Any

import grpc
from google.protobuf.message import DecodeError

logger = logging.getLogger("localai.mlx." + __name__)

AUTH_TOKEN_ENV = "LOCALAI_GRPC_AUTH_TOKEN"
# Methods open without a token: the standard health check only (see the module docstring).
AUTH_EXEMPT_METHODS = frozenset({"/grpc.health.v1.Health/Check"})


# --------------------------------------------------------------------------- auth
class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Requires metadata ``authorization: Bearer <token>`` on every call but ``exempt``.

    The comparison hashes both sides first, so its time depends neither on where the
    supplied value differs from the token nor on the token's length. The scheme name
    is case-insensitive (RFC 6750); the token is compared exactly. A denied call gets
    UNAUTHENTICATED before any handler runs, whatever the method, even an unknown one
    (which would otherwise reveal UNIMPLEMENTED).
    """

    def __init__(self, token: str, exempt: frozenset[str] = AUTH_EXEMPT_METHODS) -> None:
        if not token:
            raise ValueError("the bearer token must not be empty")
        self._expected = _digest(token.encode("utf-8"))
        self._exempt = exempt
        self._deny = grpc.stream_stream_rpc_method_handler(_deny)

    def authorized(self, metadata: Iterable[tuple[str, str | bytes]] | None) -> bool:
        """Whether ``metadata`` (invocation metadata pairs) carries the token; the first
        ``authorization`` entry counts."""
        header = next((v for k, v in (metadata or ()) if k == "authorization"), None)
        if header is None:
            return False
        if isinstance(header, bytes):
            header = header.decode("utf-8", "replace")
        scheme, _, supplied = header.partition(" ")
        ok_scheme = scheme.lower() == "bearer"
        ok_token = hmac.compare_digest(_digest(supplied.encode("utf-8")), self._expected)
        return ok_scheme and ok_token

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        if details.method in self._exempt or self.authorized(details.invocation_metadata):
            return await continuation(details)
        logger.debug("denied %s: missing or wrong bearer token", details.method)
        # Raw bytes in, raw bytes out, request never read: fits any call shape.
        return self._deny


def _digest(value: bytes) -> bytes:
    return hashlib.sha256(value).digest()


async def _deny(
    request_iterator: AsyncIterator[bytes], context: grpc.aio.ServicerContext
) -> AsyncIterator[bytes]:
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")
    yield b""  # pragma: no cover  (unreachable; makes this an async generator)


# --------------------------------------------------------------------------- decoding
class DecodeErrorInterceptor(grpc.aio.ServerInterceptor):
    """Answers INVALID_ARGUMENT to a request message that does not parse.

    A proto3 string field holding invalid UTF-8, or truncated bytes, otherwise get
    UNKNOWN and a traceback in the log for every such call. Wraps handlers that take one
    request message: they receive raw bytes, parse them here, then run as before.
    """

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or handler.request_streaming or handler.request_deserializer is None:
            return handler
        parse = handler.request_deserializer
        if handler.response_streaming:
            inner = handler.unary_stream
            behavior: Callable[[bytes, grpc.aio.ServicerContext], Any]
            if inspect.isasyncgenfunction(inner):

                async def stream_gen(
                    raw: bytes, context: grpc.aio.ServicerContext
                ) -> AsyncIterator[Any]:
                    async for reply in inner(await _parse(parse, raw, context), context):
                        yield reply

                behavior = stream_gen
            else:  # a coroutine that writes with context.write (health Watch)

                async def stream_coro(raw: bytes, context: grpc.aio.ServicerContext) -> Any:
                    return await inner(await _parse(parse, raw, context), context)

                behavior = stream_coro
            return grpc.unary_stream_rpc_method_handler(behavior, None, handler.response_serializer)
        inner_unary = handler.unary_unary

        async def unary(raw: bytes, context: grpc.aio.ServicerContext) -> Any:
            return await inner_unary(await _parse(parse, raw, context), context)

        return grpc.unary_unary_rpc_method_handler(unary, None, handler.response_serializer)


async def _parse(
    parse: Callable[[bytes], object], raw: bytes, context: grpc.aio.ServicerContext
) -> object:
    try:
        return parse(raw)
    except DecodeError as exc:  # its message names the type and the fault
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"invalid request: {exc}")
        raise  # not reached: abort raises


def server_interceptors(environ: Mapping[str, str] = os.environ) -> list:
    """The server's interceptors, outermost first: ``AuthInterceptor`` when
    ``LOCALAI_GRPC_AUTH_TOKEN`` is set and not blank (surrounding whitespace, e.g. a
    newline from a secrets file, is stripped), then ``DecodeErrorInterceptor``."""
    interceptors: list = [DecodeErrorInterceptor()]
    token = environ.get(AUTH_TOKEN_ENV, "").strip()
    if token:
        logger.info(
            "bearer-token auth on (all RPCs but %s)", ", ".join(sorted(AUTH_EXEMPT_METHODS))
        )
        interceptors.insert(0, AuthInterceptor(token))
    return interceptors
