"""Real stores for the tests, each started as a child process on a free
loopback port and stopped with ``Popen.kill`` and ``wait``: ``idem serve``
(the binary named by ``IDEM_BIN``, built by ``scripts/clients``) over an
SQLite file, and ``redis-server``. The ``store`` fixture runs a test on
each of SQLite (the default store), Redis and a remote ``idem serve``;
``local_store`` on the first two."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest

TOKEN = "shop-token-0123456789abcdef"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.kill()
    process.wait()


@dataclass
class Serve:
    """An ``idem serve`` over an SQLite file, restartable on its port."""

    folder: Path
    port: int
    process: subprocess.Popen

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def kill(self) -> None:
        stop(self.process)

    def start(self) -> None:
        self.process = _spawn_serve(self.folder, self.port)


def _idem_bin() -> str:
    path = os.environ.get("IDEM_BIN")
    if not path or not Path(path).is_file():
        pytest.fail("set IDEM_BIN to the idem binary (scripts/clients does)")
    return path


def _spawn_serve(folder: Path, port: int) -> subprocess.Popen:
    tokens = folder / "tokens.toml"
    tokens.write_text(f'[tenants]\nshop = ["{TOKEN}"]\n')
    log = open(folder / "serve.log", "ab")
    process = subprocess.Popen(
        [_idem_bin(), "--store", f"sqlite:{folder / 'serve.db'}", "serve",
         "--listen", f"127.0.0.1:{port}", "--tokens", str(tokens)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as answer:
                if answer.status == 200:
                    return process
        except OSError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            stop(process)
            raise RuntimeError((folder / "serve.log").read_text())
        time.sleep(0.05)


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Serve]:
    port = free_port()
    started = Serve(tmp_path, port, _spawn_serve(tmp_path, port))
    yield started
    started.kill()


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed (scripts/clients installs it)")
    port = free_port()
    folder = tmp_path_factory.mktemp("redis")
    process = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(folder)],
        stdout=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                stop(process)
                raise
            time.sleep(0.05)
    yield f"redis://127.0.0.1:{port}"
    stop(process)


@dataclass
class Store:
    """How to open the store under test: ``Idem(store.url, **store.options)``."""

    name: str
    url: str
    options: dict[str, Any]


def _open(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if request.param == "sqlite":
        return Store("sqlite", f"sqlite:{tmp_path / 'idem.db'}", {})
    if request.param == "redis":
        # One server for the session; each test its own key prefix.
        url = request.getfixturevalue("redis_url")
        return Store("redis", f"{url}/0?namespace=t{free_port()}", {})
    served = request.getfixturevalue("serve")
    return Store("serve", served.url, {"token": TOKEN})


@pytest.fixture(params=["sqlite", "redis", "serve"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    return _open(request, tmp_path)


@pytest.fixture(params=["sqlite", "redis"])
def local_store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    """The stores the HTTP middleware opens itself (not ``idem serve``,
    whose claim API keeps JSON results only)."""
    return _open(request, tmp_path)



RABBITMQ = "/usr/lib/rabbitmq/bin/rabbitmq-server"


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


@pytest.fixture(scope="session")
def amqp_url() -> Iterator[str]:
    """The AMQP URL of a RabbitMQ broker: ``IDEM_TEST_AMQP_URL``, the
    machine's own on 127.0.0.1:5672, or one started here on free ports
    (stopped with SIGTERM, which its start script turns into a clean
    stop, and ``wait``). Tests isolate themselves by queue names."""
    if os.environ.get("IDEM_TEST_AMQP_URL"):
        yield os.environ["IDEM_TEST_AMQP_URL"]
        return
    if _listening(5672):
        yield "amqp://guest:guest@127.0.0.1:5672/"
        return
    if not Path(RABBITMQ).is_file():
        pytest.fail("rabbitmq-server is not installed (scripts/test installs it)")
    port, dist = free_port(), free_port()
    folder = Path(tempfile.mkdtemp(prefix=f"idem-rabbitmq-{port}-"))
    for name, text in [("enabled_plugins", "[].\n"), ("advanced.config", "[].\n"),
                       ("rabbitmq-env.conf", ""),
                       ("rabbitmq.conf", f"listeners.tcp.default = 127.0.0.1:{port}\n")]:
        (folder / name).write_text(text)
    env = dict(
        os.environ,
        RABBITMQ_NODENAME=f"idem-{port}@localhost",
        RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
        RABBITMQ_NODE_PORT=str(port),
        RABBITMQ_DIST_PORT=str(dist),
        ERL_EPMD_ADDRESS="127.0.0.1",
        RABBITMQ_MNESIA_BASE=str(folder / "mnesia"),
        RABBITMQ_LOG_BASE=str(folder / "log"),
        RABBITMQ_ENABLED_PLUGINS_FILE=str(folder / "enabled_plugins"),
        RABBITMQ_CONFIG_FILE=str(folder / "rabbitmq.conf"),
        RABBITMQ_CONF_ENV_FILE=str(folder / "rabbitmq-env.conf"),
        RABBITMQ_ADVANCED_CONFIG_FILE=str(folder / "advanced.config"),
    )
    process = subprocess.Popen([RABBITMQ], env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not _listening(port):
        if process.poll() is not None or time.monotonic() > deadline:
            stop(process)
            pytest.fail("rabbitmq-server did not start")
        time.sleep(0.2)
    yield f"amqp://guest:guest@127.0.0.1:{port}/"
    process.terminate()
    process.wait()
    shutil.rmtree(folder, ignore_errors=True)
