"""HTTP to idem serve: one keep-alive connection per thread, JSON both
ways, problems turned into exceptions, and retries of what is safe to send
again (every call of the API is: a write that already landed is answered
as done, and a claim sent twice finds its own claim in progress)."""

from __future__ import annotations

import json
import random
import socket
import ssl
import threading
import time
import urllib.parse
from typing import Any, Optional

from ._errors import ApiError, LeaseLost, Unavailable


class _Connection:
    """One keep-alive HTTP/1.1 connection. The API's answers are small JSON
    bodies with a Content-Length: reading them needs none of http.client's
    header machinery, which cost more than the rest of a call."""

    def __init__(self, host: str, port: int, https: bool, timeout: float) -> None:
        sock = socket.create_connection((host, port), timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if https:
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=host)
        self.sock = sock
        self.buffer = b""
        self.open = True

    def close(self) -> None:
        self.open = False
        self.sock.close()

    def _fill(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("idem serve closed the connection")
        self.buffer += chunk

    def exchange(self, request: bytes, timeout: float) -> tuple[int, dict[bytes, bytes], bytes]:
        self.sock.settimeout(timeout)
        self.sock.sendall(request)
        while b"\r\n\r\n" not in self.buffer:
            self._fill()
        head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split(b" ", 2)[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
        if b"content-length" in headers:
            length = int(headers[b"content-length"])
            while len(self.buffer) < length:
                self._fill()
            body, self.buffer = self.buffer[:length], self.buffer[length:]
        elif headers.get(b"transfer-encoding", b"").lower() == b"chunked":
            body = self._chunked()
        elif status == 204 or status == 304 or status < 200:
            body = b""
        else:
            while True:
                try:
                    self._fill()
                except ConnectionError:
                    break
            body, self.buffer = self.buffer, b""
            self.open = False
        if headers.get(b"connection", b"").lower() == b"close":
            self.close()
        return status, headers, body

    def _chunked(self) -> bytes:
        body = b""
        while True:
            while b"\r\n" not in self.buffer:
                self._fill()
            size_line, _, self.buffer = self.buffer.partition(b"\r\n")
            size = int(size_line.split(b";")[0], 16)
            while len(self.buffer) < size + 2:
                self._fill()
            body += self.buffer[:size]
            self.buffer = self.buffer[size + 2 :]
            if size == 0:
                return body


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
        head = f"Host: {parts.netloc}\r\nContent-Type: application/json\r\nAccept: application/json\r\n"
        if token:
            head += f"Authorization: Bearer {token}\r\n"
        self._head = head.encode()
        self._timeout = timeout
        self._retries = retries
        self._local = threading.local()

    def _connection(self) -> _Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None or not conn.open:
            conn = _Connection(self._host, self._port, self._https, self._timeout)
            self._local.conn = conn
        return conn

    def close(self) -> None:
        """Closes this thread's connection."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    def call(
        self,
        method: str,
        path: str,
        body: Optional[dict[str, Any]] = None,
        query: Optional[dict[str, str]] = None,
        extra_time: float = 0.0,
        retries: Optional[int] = None,
        timeout: Optional[float] = None,
    ) -> Any:
        """Sends one request, trying again (``retries`` times, the
        client's by default) after a lost connection or a 502, 503 or 504,
        and returns the decoded JSON answer (``None`` for 204)."""
        target = self._base + path
        if query:
            target += "?" + urllib.parse.urlencode(query)
        payload = (
            b""
            if body is None
            else json.dumps(body, separators=(",", ":"), allow_nan=False).encode()
        )
        retries = self._retries if retries is None else retries
        timeout = self._timeout if timeout is None else timeout
        request = (
            f"{method} {target} HTTP/1.1\r\n".encode()
            + self._head
            + f"Content-Length: {len(payload)}\r\n\r\n".encode()
            + payload
        )
        delay = 0.05
        for attempt in range(retries + 1):
            last = attempt == retries
            try:
                status, headers, data = self._connection().exchange(request, timeout + extra_time)
            except (OSError, ValueError, IndexError) as e:
                self.close()
                if last:
                    raise Unavailable(f"idem serve at {self._host}:{self._port}: {e}") from e
                time.sleep(delay * (1 + random.random()))
                delay = min(delay * 2, 2.0)
                continue
            if status == 204:
                return None
            try:
                answer = json.loads(data) if data else None
            except ValueError:
                # Not idem serve's own answer: a proxy's page, say.
                answer = None
            if status < 400 and answer is not None:
                return answer
            problem = (
                answer
                if isinstance(answer, dict)
                else {"detail": f"{status}: {data[:200].decode(errors='replace')!r}"}
            )
            error = ApiError(status, problem)
            if error.kind == "lease-lost":
                raise LeaseLost(error.detail)
            if status in (502, 503, 504) and not last:
                after = headers.get(b"retry-after", b"")
                time.sleep(max(float(after) if after.isdigit() else 0.0, delay))
                delay = min(delay * 2, 2.0)
                continue
            raise error
        raise AssertionError("unreachable")
