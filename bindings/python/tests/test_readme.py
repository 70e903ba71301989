"""The README's runnable examples (the first two), run as written, in a
folder of the test's own (the first opens ``sqlite:idem.db`` there)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest


@pytest.mark.parametrize("index", [0, 1])
def test_the_readme_examples_run(index, tmp_path, monkeypatch):
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    example = re.findall(r"```python\n(.*?)```", readme, re.S)[index]
    monkeypatch.chdir(tmp_path)
    exec(compile(example, "README.md", "exec"), {})
    if index == 0:
        assert (tmp_path / "idem.db").is_file()
