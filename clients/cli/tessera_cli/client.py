"""The REST API over HTTP: one session, retries with backoff on transient faults, errors as
:class:`~tessera_cli.errors.CliError` with the exit code they deserve.

A write the server redirects (an ``http://`` URL sent on to ``https://``) is an error, not
followed: following it would turn a POST into a GET of the list. A 2xx answer must be the API's
JSON, of the shape the call expects (an object, unless told otherwise): anything else (a proxy's
sign-in page, the portal at a wrong ``TESSERA_URL``, a body cut short) is the server failing (exit
202), never printed as if it were the answer.

Retried: connection errors, timeouts, 502/503/504 and 429 (after its ``Retry-After``). Never
retried: any other 4xx (the request itself is wrong: repeating it changes nothing) and a POST
that may have reached the server, unless it carries an ``Idempotency-Key`` (then the server
answers a repeat with the first job).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import requests

from tessera_cli import __version__, outcome
from tessera_cli.errors import CliError, describe_api_error

TRANSIENT = frozenset({502, 503, 504})
RETRIES = 5
BACKOFF_S = 0.5
BACKOFF_MAX_S = 8.0
TIMEOUT_S = 30.0
GRACE_S = 5.0  # what a request made at (or near) the deadline still gets, once


class DeadlinePassed(CliError):
    """The caller's deadline (:attr:`Client.deadline`) passed before the server answered."""


class Client:
    def __init__(
        self, url: str, token: str, retries: int = RETRIES, sleep=time.sleep, timeout: float = TIMEOUT_S
    ) -> None:
        self.base = url.rstrip("/") + "/api/v1"
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Token {token}"
        self.session.headers["User-Agent"] = f"tessera-cli/{__version__}"
        self.retries = retries
        self.sleep = sleep
        self.timeout = timeout  # each request's, unless it asks for its own (a long-poll's)
        # Monotonic time after which no request is retried and each has at most GRACE_S, or
        # what is left: --wait-timeout bounds the command even against a server that hangs.
        self.deadline: float | None = None
        self.clock = time.monotonic

    def _within_deadline(self, timeout: float) -> float:
        """``timeout``, cut to what is left before the deadline (at least GRACE_S)."""
        if self.deadline is None:
            return timeout
        return min(timeout, max(self.deadline - self.clock(), GRACE_S))

    def _check_deadline(self, why: str) -> None:
        """:class:`DeadlinePassed` if the deadline has passed (``why``: what failed last)."""
        if self.deadline is not None and self.clock() >= self.deadline:
            raise DeadlinePassed(f"{self.base}: {why}, and the deadline passed", outcome.WAIT_TIMEOUT)

    def url(self, path: str) -> str:
        return self.base + "/" + path.lstrip("/")

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
        safe_to_repeat: bool | None = None,
        expect: type | tuple[type, ...] = dict,
    ) -> tuple[int, Any]:
        """``(status, body)`` of a 2xx answer whose JSON body is an ``expect`` (204: None); a
        :class:`CliError` for anything else."""
        if safe_to_repeat is None:
            safe_to_repeat = method in ("GET", "HEAD") or bool(headers and headers.get("Idempotency-Key"))
        attempt = 0
        while True:
            attempt_timeout = self._within_deadline(self.timeout if timeout is None else timeout)
            try:
                response = self.session.request(
                    method,
                    self.url(path),
                    json=json,
                    params=params,
                    headers=headers,
                    timeout=attempt_timeout,
                    allow_redirects=method in ("GET", "HEAD"),  # a redirected POST becomes a GET
                )
            except requests.ConnectionError as exc:
                sent = not _refused_before_sending(exc)
                self._check_deadline(_short(exc))
                if (sent and not safe_to_repeat) or attempt >= self.retries:
                    raise CliError(f"cannot reach {self.base}: {_short(exc)}", outcome.UNREACHABLE) from None
            except requests.Timeout:
                self._check_deadline(f"no answer in {attempt_timeout:g} s")
                if not safe_to_repeat or attempt >= self.retries:
                    raise CliError(
                        f"{self.base} did not answer in {attempt_timeout:g} s", outcome.UNREACHABLE
                    ) from None
            except requests.exceptions.InvalidJSONError:  # before sending: the body is ours
                raise CliError(
                    "the request's body has a number JSON cannot carry (NaN or infinity)", outcome.BAD_INPUT
                ) from None
            except requests.RequestException as exc:
                raise CliError(f"request to {self.base} failed: {_short(exc)}", outcome.UNREACHABLE) from None
            else:
                status = response.status_code
                if response.is_redirect:
                    raise CliError(_redirected(response, method), outcome.UNREACHABLE)
                retry = (status in TRANSIENT and safe_to_repeat) or status == 429
                if retry and attempt < self.retries:
                    self._check_deadline(f"HTTP {status}")
                if not retry or attempt >= self.retries:
                    return status, _answer(response, expect)
                wait = _retry_after(response)
                if wait is not None:
                    self.sleep(min(wait, BACKOFF_MAX_S * 4))
                    attempt += 1
                    continue
            self.sleep(min(BACKOFF_S * 2**attempt, BACKOFF_MAX_S))
            attempt += 1

    def get(self, path: str, **kwargs: Any) -> Any:
        return self.request("GET", path, **kwargs)[1]

    def post(self, path: str, body: Any = None, **kwargs: Any) -> tuple[int, Any]:
        return self.request("POST", path, json=body, **kwargs)

    def pages(
        self, path: str, params: dict[str, Any] | None = None, limit: int | None = None
    ) -> Iterator[Any]:
        """Every item of a paginated list (``count``, ``results``, ``next``), up to ``limit``, each
        once, following each page's ``next``: the jobs list and a job's events carry a cursor
        there, so that a job that starts or arrives meanwhile moves no other; an older server's
        ``next`` carries an offset, and a job submitted meanwhile (lists are newest first) pushes
        the items below it one place down, so an item whose ``id`` was given is skipped. Only the
        query of ``next`` is used, sent to this client's own server: a proxy in front may have
        told the server another host name."""
        params = dict(params or {})
        params.setdefault("limit", 200 if limit is None else min(limit, 200))
        seen = 0
        given: set[Any] = set()
        while True:
            body = self.get(path, params=params, expect=(dict, list))
            results = body if isinstance(body, list) else body.get("results")  # a list: unpaginated
            if not isinstance(results, list) or not all(isinstance(item, dict) for item in results):
                raise CliError(
                    f"the answer of {self.url(path)} is not a page of the API's objects: is TESSERA_URL"
                    " the Tessera server?",
                    outcome.UNREACHABLE,
                )
            for item in results:
                if "id" in item:
                    if item["id"] in given:
                        continue
                    given.add(item["id"])
                yield item
                seen += 1
                if limit is not None and seen >= limit:
                    return
            if isinstance(body, list):
                return
            following = body.get("next")
            if not following or not results:
                return
            if not isinstance(following, str):
                raise CliError(
                    f"the answer of {self.url(path)} has a `next` that is not a link", outcome.UNREACHABLE
                )
            params = dict(parse_qsl(urlsplit(following).query, keep_blank_values=True))


@dataclass(frozen=True)
class ServerEvent:
    """One Server-Sent Events message: its ``event`` name, ``data`` (parsed JSON) and ``id``."""

    event: str
    data: Any
    id: str | None


class StreamBroken(Exception):
    """The stream ended or failed before its last message: reconnect from the last id."""


def read_events(client: Client, path: str, last_id: str | None, params: dict[str, Any], read_timeout: float):
    """The messages of the stream at ``path`` from ``last_id`` on; :class:`StreamBroken` when the
    connection drops, a :class:`CliError` when the server refuses the request."""
    headers = {"Accept": "text/event-stream"}
    if last_id is not None:
        headers["Last-Event-ID"] = last_id
    try:
        response = client.session.get(
            client.url(path), params=params, headers=headers, stream=True, timeout=(10, read_timeout)
        )
    except requests.RequestException as exc:
        raise StreamBroken(_short(exc)) from None
    with response:
        if response.status_code != 200:
            if response.status_code in TRANSIENT or response.status_code == 429:
                raise StreamBroken(f"HTTP {response.status_code}")
            _answer(response, object)  # raises the CliError it deserves
        response.encoding = "utf-8"  # what Server-Sent Events always are
        event, id_ = "message", None
        data: list[str] = []
        try:
            for line in response.iter_lines(decode_unicode=True):
                if line == "":
                    if data:
                        yield ServerEvent(event, _json("\n".join(data)), id_)
                    event, data = "message", []
                elif line.startswith(":"):
                    yield ServerEvent("keepalive", None, None)
                else:
                    name, _, value = line.partition(":")
                    value = value.removeprefix(" ")
                    if name == "event":
                        event = value
                    elif name == "data":
                        data.append(value)
                    elif name == "id":
                        id_ = value
        except (requests.RequestException, OSError) as exc:
            raise StreamBroken(_short(exc)) from None
    raise StreamBroken("the server closed the stream")


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _answer(response: requests.Response, expect: type | tuple[type, ...]) -> Any:
    status = response.status_code
    if status == 204:
        return None
    try:
        body = response.json()
    except ValueError:
        if 200 <= status < 300:
            raise CliError(_not_the_api(response, "is not JSON"), outcome.UNREACHABLE) from None
        body = response.text
    if 200 <= status < 300:
        if not isinstance(body, expect):
            shape = f"is JSON of another shape ({type(body).__name__})"
            raise CliError(_not_the_api(response, shape), outcome.UNREACHABLE)
        return body
    message = describe_api_error(status, body)
    if status == 401:  # a token revoked, expired with its user, or mistyped: what to do next
        raise CliError(f"{message} (HTTP 401; `tessera login` stores a new token)", outcome.AUTH, body)
    if status == 403:
        raise CliError(f"{message} (HTTP 403)", outcome.AUTH, body)
    if status in (404, 409, 422):
        raise CliError(f"{message} (HTTP {status})", outcome.REFUSED_STATE, body)
    if status in (400, 413):
        raise CliError(message, outcome.BAD_INPUT, body)
    raise CliError(f"the server answered HTTP {status}: {message}", outcome.UNREACHABLE, body)


def _redirected(response: requests.Response, method: str) -> str:
    where = response.headers.get("Location", "elsewhere")
    return (
        f"{response.url} redirected the {method} to {where}, which would not repeat it:"
        " set TESSERA_URL to where the server is (https://, its own host)"
    )


def _not_the_api(response: requests.Response, what: str) -> str:
    kind = response.headers.get("Content-Type", "no content type").split(";")[0]
    return (
        f"the answer of {response.url} (HTTP {response.status_code}, {kind}) {what}, not the API's:"
        " is TESSERA_URL the Tessera server, with no sign-in page in front?"
    )


def _retry_after(response: requests.Response) -> float | None:
    raw = response.headers.get("Retry-After")
    try:
        return max(0.0, float(raw)) if raw is not None else None
    except ValueError:
        return None


def _refused_before_sending(exc: requests.ConnectionError) -> bool:
    """Whether the connection failed before the request could have reached the server."""
    text = str(exc)
    return any(s in text for s in ("Connection refused", "Name or service not known", "NewConnectionError"))


def _short(exc: Exception) -> str:
    text = str(exc)
    for marker in ("Connection refused", "Name or service not known", "timed out", "Connection reset"):
        if marker in text:
            return marker.lower()
    return text.splitlines()[0][:200] if text else type(exc).__name__
