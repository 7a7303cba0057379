"""The README's service example runs as written (against the main job's fp8 bundle)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


@pytest.mark.slow
def test_the_service_example_runs_as_written(xception_bundles, tmp_path, monkeypatch, capsys):
    text = README.read_text("utf-8")
    section = text[text.index("## Load a bundle in a service"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    (tmp_path / "bundles").mkdir()
    shutil.copy(xception_bundles["fp8"], tmp_path / "bundles" / xception_bundles["fp8"].name)
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md", "exec"), {})
    assert capsys.readouterr().out.strip().endswith("(1, 1000)")
