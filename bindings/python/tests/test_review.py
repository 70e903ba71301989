"""The review's scenarios, where the clients that re-implemented the
executor leaked: ``idem serve`` restarted while ``complete`` is pending,
slow lease extensions beside a healthy run, forked children, and a step
begun twice (in test_idem)."""

from __future__ import annotations

import os
import socket
import threading
import time
import traceback

import pytest

from conftest import TOKEN
from idem_engine import Idem, InProgress


def test_a_completion_pending_while_idem_serve_restarts_lands_and_is_replayed(serve):
    idem = Idem(serve.url, token=TOKEN, lease=10.0)
    with idem.claim("charges", "order-1") as run:
        serve.kill()
        done = []
        completing = threading.Thread(target=lambda: done.append(run.complete({"charged": 1})))
        completing.start()
        time.sleep(2.0)
        assert done == [], "complete returned while idem serve was down"
        serve.start()
        completing.join(timeout=15)
        assert done == [None]
    with idem.claim("charges", "order-1") as again:
        assert again.replayed and again.result == {"charged": 1}
    assert idem.record("charges", "order-1")["attempt"] == 1


class SlowExtends:
    """A TCP proxy in front of idem serve that holds every
    ``/v1/extend`` of a key starting ``slow-`` for ``delay`` seconds;
    other requests pass at once."""

    def __init__(self, target_port: int, delay: float) -> None:
        self.delay = delay
        self.target = ("127.0.0.1", target_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            threading.Thread(target=self._requests, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._answers, args=(upstream, client), daemon=True).start()

    def _requests(self, client: socket.socket, upstream: socket.socket) -> None:
        buffered = b""
        while True:
            try:
                chunk = client.recv(65536)
            except OSError:
                chunk = b""
            if not chunk:
                upstream.close()
                return
            buffered += chunk
            while b"\r\n\r\n" in buffered:
                head, rest = buffered.split(b"\r\n\r\n", 1)
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                if len(rest) < length:
                    break
                request, buffered = head + b"\r\n\r\n" + rest[:length], rest[length:]
                if b"/v1/extend" in head and b'"key":"slow-' in request:
                    time.sleep(self.delay)
                try:
                    upstream.sendall(request)
                except OSError:
                    return

    @staticmethod
    def _answers(upstream: socket.socket, client: socket.socket) -> None:
        while True:
            try:
                chunk = upstream.recv(65536)
            except OSError:
                chunk = b""
            if not chunk:
                client.close()
                return
            try:
                client.sendall(chunk)
            except OSError:
                return

    def close(self) -> None:
        self.listener.close()


def test_slow_extends_of_five_runs_do_not_starve_a_healthy_one(serve):
    proxy = SlowExtends(serve.port, delay=3.0)
    try:
        idem = Idem(f"http://127.0.0.1:{proxy.port}", token=TOKEN, lease=1.2)
        other = Idem(serve.url, token=TOKEN, lease=1.2)
        slow = [idem.claim("mixed", f"slow-{i}") for i in range(5)]
        slow_runs = [claim.__enter__() for claim in slow]
        with idem.claim("mixed", "healthy") as run:
            for _ in range(6):
                time.sleep(0.5)
                with pytest.raises(InProgress):
                    with other.claim("mixed", "healthy"):
                        pass
                assert not run.lease_lost
            run.complete("healthy")
        assert other.record("mixed", "healthy")["attempt"] == 1
        # The slow ones were slow: no extension came back within a lease.
        assert all(slow_run.lease_lost for slow_run in slow_runs)
    finally:
        proxy.close()


@pytest.mark.parametrize("kind", ["sqlite", "redis", "serve"])
def test_forked_children_open_their_own_engine_and_run_each_key_once(kind, request, tmp_path):
    if kind == "sqlite":
        idem = Idem(f"sqlite:{tmp_path / 'idem.db'}")
    elif kind == "redis":
        idem = Idem(f"{request.getfixturevalue('redis_url')}/0?namespace=fork{os.getpid()}")
    else:
        idem = Idem(request.getfixturevalue("serve").url, token=TOKEN)
    # The parent's engine is open and has connections before the fork.
    with idem.claim("fork", "parent") as run:
        run.complete("parent")
    ledger = os.open(tmp_path / "ledger", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    children = []
    for child in range(4):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                order = list(range(200))
                if child % 2:
                    order.reverse()
                for i in order:
                    while True:
                        try:
                            with idem.claim("fork", f"k{i}", wait=10.0) as run:
                                if not run.replayed:
                                    os.write(ledger, f"k{i} {os.getpid()}\n".encode())
                                    run.complete({"key": f"k{i}"})
                            break
                        except InProgress:
                            continue
                code = 0
            except BaseException:  # noqa: BLE001
                traceback.print_exc()
            finally:
                os._exit(code)
        children.append(pid)
    for pid in children:
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    os.close(ledger)
    ran = [line.split()[0] for line in (tmp_path / "ledger").read_text().splitlines()]
    assert sorted(ran) == sorted(f"k{i}" for i in range(200))
    for i in range(200):
        assert idem.record("fork", f"k{i}")["response"] == {"key": f"k{i}"}
    # The parent's engine still works: no child touched its connections.
    with idem.claim("fork", "parent-after") as run:
        run.complete("still here")
    assert idem.record("fork", "parent-after")["response"] == "still here"
