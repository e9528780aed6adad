"""A request body over the server's limit is refused (413) before a route parses it: at once when its
Content-Length says so, else as soon as the chunks received pass the limit. Nothing of it is parsed, tokenised or
kept (TGI's `--payload-limit`, 2 MB by default, does the same)."""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class BodyLimit:
    """ASGI middleware: the route reading a body over `limit` bytes gets a 413 (the app's handler words it)."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length", "")
        too_large = HTTPException(
            413, f"the request body is larger than this server takes ({self.limit:,} bytes): shorten it"
        )
        received = 0

        async def limited() -> Message:
            nonlocal received
            if declared.isdigit() and int(declared) > self.limit:
                raise too_large
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise too_large
            return message

        await self.app(scope, limited, send)
