"""A real ``idem serve`` for the tests: the binary named by ``IDEM_BIN``
(built by ``scripts/clients``), on a free loopback port, over an SQLite
file in the test's own folder, with two tenants. Stopped with
``Popen.kill`` and ``wait`` when the test ends."""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

SHOP = "shop-token-0123456789abcdef"
BILLING = "billing-token-0123456789abcdef"


@dataclass
class Server:
    url: str
    store: str
    process: subprocess.Popen


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def idem_bin() -> str:
    path = os.environ.get("IDEM_BIN")
    if not path or not Path(path).is_file():
        pytest.fail("set IDEM_BIN to the idem binary (scripts/clients does)")
    return path


def start_server(folder: Path, *extra: str) -> Server:
    tokens = folder / "tokens.toml"
    tokens.write_text(f'[tenants]\nshop = ["{SHOP}"]\nbilling = ["{BILLING}"]\n')
    port = free_port()
    store = f"sqlite:{folder / 'idem.db'}"
    log = open(folder / "serve.log", "wb")
    process = subprocess.Popen(
        [idem_bin(), "--store", store, "serve", "--listen", f"127.0.0.1:{port}",
         "--tokens", str(tokens), *extra],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=1) as answer:
                if answer.status == 200:
                    return Server(url, store, process)
        except OSError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            process.wait()
            raise RuntimeError((folder / "serve.log").read_text())
        time.sleep(0.05)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    started = start_server(tmp_path)
    yield started
    started.process.kill()
    started.process.wait()
