"""Load and apply the JSON Schemas in the repository's `schemas/` folder.

The folder ships as the package data `runtime_py.schema_files`; in a source checkout that is
not installed, the repository folder itself is read. Validators are cached: the manifest
is validated on every open.

Two things differ from stock `jsonschema`, both so that Python agrees with the C++ reader
and with the JSON Schema specification:

- `pattern` follows ECMA-262, as JSON Schema says: `$` matches only at the very end of the
  string. Python's `re.search` lets `$` match before a final newline, which accepted
  names such as ``"labels.msgpack\\n"``.
- `schema_problems(..., lenient=True)` validates against the schema with every
  ``additionalProperties: false`` dropped: how a manifest written by a newer minor is
  checked (docs/format.md: unknown keys are ignored in every map, at any level).
"""

from __future__ import annotations

import copy
import functools
import json
import re
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
def ecma_regex(pattern: str) -> re.Pattern:
    """`pattern` compiled so that a final unescaped `$` means end of string (ECMA-262
    without the multiline flag), not "end or before a final newline" as in Python."""
    if pattern.endswith("$") and not pattern.endswith("\\$"):
        pattern = pattern[:-1] + r"\Z"
    return re.compile(pattern)


def _ecma_pattern(validator, pattern, instance, schema):
    from jsonschema.exceptions import ValidationError

    if validator.is_type(instance, "string") and not ecma_regex(pattern).search(instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _without_closed_maps(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _without_closed_maps(v) for k, v in node.items()
                if not (k == "additionalProperties" and v is False)}
    if isinstance(node, list):
        return [_without_closed_maps(v) for v in node]
    return node


@functools.lru_cache(maxsize=None)
def _validator(name: str, lenient: bool = False):
    import jsonschema

    schema = load_schema(name)
    base = jsonschema.validators.validator_for(schema)
    base.check_schema(schema)
    cls = jsonschema.validators.extend(base, {"pattern": _ecma_pattern})
    if lenient:
        schema = _without_closed_maps(copy.deepcopy(schema))
    return cls(schema)


def schema_problems(name: str, document: Any, *, lenient: bool = False) -> list[str]:
    """Every way `document` breaks schema `name`, one readable line each (empty: valid).
    `lenient`: unknown keys are allowed in every map (a newer minor's manifest)."""
    errors = sorted(_validator(name, lenient).iter_errors(document),
                    key=lambda e: list(e.absolute_path))
    lines = []
    for err in errors:
        where = "/".join(str(p) for p in err.absolute_path) or "(top level)"
        lines.append(f"{where}: {err.message}")
    return lines
