"""The README's runnable examples (the first two, and the web
middleware's), run as written, in a folder of the test's own (they open
``sqlite:idem.db`` there)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest


def example(index: int) -> str:
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    return re.findall(r"```python\n(.*?)```", readme, re.S)[index]


@pytest.mark.parametrize("index", [0, 1])
def test_the_readme_examples_run(index, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exec(compile(example(index), "README.md", "exec"), {})
    if index == 0:
        assert (tmp_path / "idem.db").is_file()


def test_the_readme_middleware_example_answers_a_retry_from_the_store(tmp_path, monkeypatch):
    from starlette.testclient import TestClient

    monkeypatch.chdir(tmp_path)
    names: dict = {}
    exec(compile(example(3), "README.md", "exec"), names)
    with TestClient(names["app"]) as client:
        first = client.post("/charges", headers={"Idempotency-Key": "order-1"})
        again = client.post("/charges", headers={"Idempotency-Key": "order-1"})
    assert first.status_code == 200 and first.json()["charged"] is True
    assert again.headers["idempotent-replayed"] == "true" and again.content == first.content
