"""The README's first example, run as written against a real idem serve."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import SHOP


def test_the_readme_example_runs(server, monkeypatch):
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    example = re.findall(r"```python\n(.*?)```", readme, re.S)[0]
    monkeypatch.setenv("IDEM_URL", server.url)
    monkeypatch.setenv("IDEM_TOKEN", SHOP)
    exec(compile(example, "README.md", "exec"), {})
