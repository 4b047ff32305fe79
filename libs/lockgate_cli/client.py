"""JSON over HTTP to the admin API (and the trace store), with errors a user can act on.

Why httpx: one client with timeouts, connection reuse across a `--watch`'s polls, proper URL
and query encoding, and a transport tests can swap for a recorded one (unit tests only: the
integration tests run the CLI against a real queue-store).
"""

from __future__ import annotations

import json
import urllib.parse
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # httpx is imported when the first request is made: the CLI starts faster
    import httpx

TIMEOUT_SECONDS = 30.0


class CliError(Exception):
    """A failure to report on stderr with exit status 1."""


class ApiError(CliError):
    """The API answered with an error status; `status` is the HTTP code."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def quote(part: str) -> str:
    return urllib.parse.quote(part, safe="")


class JsonClient:
    """GET/POST/PATCH/DELETE with a JSON body and answer, against one base URL."""

    def __init__(self, base_url: str, *, token: str | None = None, what: str,
                 hint: str, transport: httpx.BaseTransport | None = None,
                 timeout: float = TIMEOUT_SECONDS) -> None:
        parsed = urllib.parse.urlsplit(base_url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise CliError(f"the {what} URL must be http(s)://HOST[:PORT], not {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.what, self.hint = what, hint
        import httpx

        headers = {"Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout,
                                  transport=transport)

    def close(self) -> None:
        self._http.close()

    def request(self, method: str, path: str, body: object = None,
                query: dict[str, str] | None = None) -> Any:
        import httpx

        try:
            response = self._http.request(
                method, path, params=query,
                content=None if body is None else json.dumps(body).encode(),
                headers={"Content-Type": "application/json"} if body is not None else None)
        except httpx.TimeoutException as error:
            raise CliError(f"the {self.what} at {self.base_url} did not answer in time "
                           f"({type(error).__name__})") from error
        except httpx.HTTPError as error:
            raise CliError(f"cannot reach the {self.what} at {self.base_url}: {error} "
                           f"({self.hint})") from error
        if response.status_code >= 400:
            raise ApiError(f"{_error_text(response)} (HTTP {response.status_code})",
                           response.status_code)
        if not response.content:
            return None
        try:
            return response.json()
        except ValueError as error:
            raise CliError(f"the {self.what} at {self.base_url} answered {method} {path} with "
                           "something that is not JSON (is the URL right?)") from error


def _error_text(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.reason_phrase or "error"
    if isinstance(body, dict) and body.get("error"):
        return str(body["error"])
    if isinstance(body, dict) and body.get("errors"):  # Jaeger's query API
        return "; ".join(str(e.get("msg", e)) for e in body["errors"])
    return response.reason_phrase or "error"


def admin_client(api: str, token: str | None, transport: httpx.BaseTransport | None = None,
                 *, timeout: float = TIMEOUT_SECONDS) -> JsonClient:
    return JsonClient(api, token=token, what="lockgate API", transport=transport,
                      timeout=timeout,
                      hint="is queue-store running? set --api, LOCKGATE_API or a context in "
                           "the config file")


def traces_client(url: str, transport: httpx.BaseTransport | None = None) -> JsonClient:
    return JsonClient(url, what="trace store", transport=transport,
                      hint="is Jaeger running? set --traces, LOCKGATE_TRACES_URL or a "
                           "context's 'traces' in the config file")
