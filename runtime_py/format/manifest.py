"""The manifest: canonical msgpack, decoded with limits, validated against its schema.

Canonical means: maps with string keys in sorted order, no floats, no extension types,
the smallest integer encodings (what msgpack-python emits). The bundle id is the sha256
of these bytes, so two writers that agree on the content agree on the id. The reader
re-encodes what it decoded and refuses bytes that differ: a manifest that is not
canonical would have an id that another writer cannot reproduce.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgpack

from runtime_py.errors import ManifestError
from runtime_py.schemas import schema_problems

# Generous for a manifest, small enough that a hostile file cannot make us allocate much.
_LIMITS = dict(max_str_len=1 << 20, max_bin_len=0, max_array_len=1 << 16,
               max_map_len=1 << 16, max_ext_len=0)


def _canonical(value: Any, path: str = "") -> Any:
    if isinstance(value, dict):
        out = {}
        for key in sorted(value):
            if not isinstance(key, str):
                raise ManifestError(f"manifest key {key!r} at {path or '/'} is not a string")
            out[key] = _canonical(value[key], f"{path}/{key}")
        return out
    if isinstance(value, (list, tuple)):
        return [_canonical(v, f"{path}/{i}") for i, v in enumerate(value)]
    if isinstance(value, float):
        raise ManifestError(
            f"manifest value at {path} is a float ({value!r}); write measured numbers as "
            "decimal strings so the manifest bytes are the same on every platform")
    if value is None or isinstance(value, (bool, int, str)):
        return value
    raise ManifestError(f"manifest value at {path} has unsupported type {type(value).__name__}")


def encode_manifest(manifest: dict) -> bytes:
    """Canonical msgpack bytes of `manifest` (keys sorted at every level, no floats)."""
    return msgpack.packb(_canonical(manifest), use_bin_type=True)


def decode_manifest(data: bytes) -> dict:
    """Decode with size limits; refuse anything that is not canonical msgpack of a map."""
    def no_ext(code: int, _data: bytes) -> None:
        raise ManifestError(f"manifest uses msgpack extension type {code}, which v1 forbids")

    try:
        manifest = msgpack.unpackb(data, raw=False, strict_map_key=True, ext_hook=no_ext,
                                   use_list=True, **_LIMITS)
    except ManifestError:
        raise
    except Exception as exc:  # msgpack raises a zoo of types for bad input
        raise ManifestError(f"manifest is not valid msgpack: {exc}") from None
    if not isinstance(manifest, dict):
        raise ManifestError("manifest is not a msgpack map")
    if encode_manifest(manifest) != data:
        raise ManifestError("manifest is not in canonical form (sorted keys, no floats)")
    return manifest


def known_fields(manifest: dict) -> dict:
    """`manifest` without the top-level and member-entry fields this reader's schema does
    not know: what a reader checks of a manifest written by a newer minor version, which
    may only add optional fields."""
    from runtime_py.schemas import load_schema

    schema = load_schema("manifest")
    top = schema["properties"]
    member_keys = top["members"]["items"]["properties"]
    pruned = {k: v for k, v in manifest.items() if k in top}
    if isinstance(pruned.get("members"), list):
        pruned["members"] = [{k: v for k, v in m.items() if k in member_keys}
                             if isinstance(m, dict) else m for m in pruned["members"]]
    return pruned


def validate_manifest(manifest: dict, minor: int | None = None) -> None:
    """Raise ManifestError listing every schema violation.

    A manifest of a newer minor (`minor` > this reader's) is checked on the fields this
    reader knows; unknown fields are ignored, as docs/format.md promises.
    """
    from runtime_py.format.layout import FORMAT_MINOR

    if minor is not None and minor > FORMAT_MINOR:
        manifest = known_fields(manifest)
    problems = schema_problems("manifest", manifest)
    if problems:
        raise ManifestError(
            "manifest does not match schemas/manifest.schema.json: " + "; ".join(problems),
            problems=[f"manifest {p}" for p in problems])


def bundle_id_of(manifest_bytes: bytes) -> str:
    """The bundle's identity: hex sha256 of the canonical manifest bytes."""
    return hashlib.sha256(manifest_bytes).hexdigest()
