"""Load and apply the JSON Schemas in the repository's `schemas/` folder.

The folder ships as the package data `runtime_py.schema_files`; in a source checkout that is
not installed, the repository folder itself is read. Validators are cached: the manifest
is validated on every open.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from pathlib import Path
from typing import Any

_REPO_SCHEMAS = Path(__file__).resolve().parent.parent / "schemas"


@functools.lru_cache(maxsize=None)
def load_schema(name: str) -> dict:
    """Return the parsed schema `name` (e.g. "manifest"), from package data or the repo."""
    filename = f"{name}.schema.json"
    try:
        text = resources.files("runtime_py.schema_files").joinpath(filename).read_text("utf-8")
    except (ModuleNotFoundError, FileNotFoundError, NotADirectoryError):
        text = (_REPO_SCHEMAS / filename).read_text("utf-8")
    return json.loads(text)


@functools.lru_cache(maxsize=None)
def _validator(name: str):
    import jsonschema

    schema = load_schema(name)
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def schema_problems(name: str, document: Any) -> list[str]:
    """Every way `document` breaks schema `name`, one readable line each (empty: valid)."""
    errors = sorted(_validator(name).iter_errors(document), key=lambda e: list(e.absolute_path))
    lines = []
    for err in errors:
        where = "/".join(str(p) for p in err.absolute_path) or "(top level)"
        lines.append(f"{where}: {err.message}")
    return lines
