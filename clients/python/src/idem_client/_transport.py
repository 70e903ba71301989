"""HTTP to idem serve: one keep-alive connection per thread, JSON both
ways, problems turned into exceptions, and retries of what is safe to send
again (every call of the API is: a write that already landed is answered
as done, and a claim sent twice finds its own claim in progress)."""

from __future__ import annotations

import http.client
import json
import random
import threading
import time
import urllib.parse
from typing import Any, Optional

from ._errors import ApiError, LeaseLost, Unavailable


class Transport:
    """Calls idem serve at ``url`` with a bearer ``token``."""

    def __init__(
        self,
        url: str,
        token: Optional[str],
        timeout: float = 10.0,
        retries: int = 4,
    ) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"idem serve URL {url!r}: use http://HOST:PORT or https://HOST:PORT")
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._https else 80)
        self._base = parts.path.rstrip("/")
        self._headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._timeout = timeout
        self._retries = retries
        self._local = threading.local()

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            kind = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            conn = kind(self._host, self._port, timeout=timeout)
            self._local.conn = conn
        conn.timeout = timeout
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        return conn

    def _drop(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    def close(self) -> None:
        """Closes this thread's connection."""
        self._drop()

    def call(
        self,
        method: str,
        path: str,
        body: Optional[dict[str, Any]] = None,
        query: Optional[dict[str, str]] = None,
        extra_time: float = 0.0,
    ) -> Any:
        """Sends one request, trying again after a lost connection or a
        503, and returns the decoded JSON answer (``None`` for 204)."""
        target = self._base + path
        if query:
            target += "?" + urllib.parse.urlencode(query)
        payload = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        delay = 0.05
        for attempt in range(self._retries + 1):
            last = attempt == self._retries
            try:
                conn = self._connection(self._timeout + extra_time)
                conn.request(method, target, body=payload, headers=self._headers)
                response = conn.getresponse()
                data = response.read()
            except (OSError, http.client.HTTPException) as e:
                self._drop()
                if last:
                    raise Unavailable(f"idem serve at {self._host}:{self._port}: {e}") from e
                time.sleep(delay * (1 + random.random()))
                delay = min(delay * 2, 2.0)
                continue
            if response.status == 204:
                return None
            answer = json.loads(data) if data else None
            if response.status < 400:
                return answer
            problem = answer if isinstance(answer, dict) else {"detail": data.decode(errors="replace")}
            error = ApiError(response.status, problem)
            if error.kind == "lease-lost":
                raise LeaseLost(error.detail)
            if response.status == 503 and not last:
                after = response.getheader("Retry-After")
                time.sleep(max(float(after) if after and after.isdigit() else 0.0, delay))
                delay = min(delay * 2, 2.0)
                continue
            raise error
        raise AssertionError("unreachable")
