"""A family loaded from an edited copy of its folder, for tests of family.json settings
(the shipped folders stay untouched)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path


def family_with(tmp_path: Path, name: str, **torch_aoti):
    """Family ``name`` loaded from a copy under ``tmp_path`` whose family.json has these
    ``torch_aoti`` settings on top of its own (a second call edits the same copy; a bad
    setting raises ``FamilyError`` as ``load_family`` does)."""
    from bundler.families import families_root, load_family

    shutil.copytree(families_root() / name, tmp_path / name, dirs_exist_ok=True)
    spec_path = tmp_path / name / "family.json"
    spec = json.loads(spec_path.read_text())
    spec.setdefault("torch_aoti", {}).update(torch_aoti)
    spec_path.write_text(json.dumps(spec))
    return load_family(name, root=tmp_path)
