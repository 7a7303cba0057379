"""Protobuf text format, written from plain dicts (Triton's `config.pbtxt`).

Writing the text ourselves keeps `bundle export triton` free of a protobuf/tritonclient
dependency; tests (and `check_model_config` where tritonclient is installed) parse every
file back with Triton's own `model_config.proto`, so a field or enum this writer gets wrong
is caught there rather than by a Triton server at load time.
"""

from __future__ import annotations

from typing import Any


class Enum(str):
    """An enum value (`TYPE_FP32`, `KIND_GPU`): written bare, not quoted."""


def _scalar(value: Any) -> str:
    if isinstance(value, Enum):
        return str(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        if any(ord(c) < 0x20 and c != "\n" for c in value):
            raise ValueError(f"control character in a text-format string: {value!r}")
        escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        return f'"{escaped}"'
    raise TypeError(f"cannot write {type(value).__name__} in protobuf text format")


def to_pbtxt(message: dict[str, Any], indent: int = 0) -> str:
    """A message as text: dict -> `key { ... }`, list -> the field repeated, else `key: v`.

    Map fields (`parameters`, `input_map`) are written as their repeated entries, a list
    of `{"key": ..., "value": ...}` dicts, which is how the text format spells maps.
    """
    pad = "  " * indent
    lines: list[str] = []
    for key, value in message.items():
        if value is None:
            continue
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, dict):
                lines.append(f"{pad}{key} {{")
                body = to_pbtxt(item, indent + 1)
                if body:
                    lines.append(body.rstrip("\n"))
                lines.append(f"{pad}}}")
            else:
                lines.append(f"{pad}{key}: {_scalar(item)}")
    return "\n".join(lines) + ("\n" if lines else "")


def map_entries(mapping: dict[str, Any]) -> list[dict[str, Any]]:
    """A dict as the text format's map entries, in key order (stable files)."""
    return [{"key": k, "value": mapping[k]} for k in sorted(mapping)]
