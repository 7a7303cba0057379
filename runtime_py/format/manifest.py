"""The manifest: canonical msgpack, decoded with limits, validated against its schema.

Canonical means: maps with string keys in sorted order, no floats, no extension types,
the smallest integer encodings (what msgpack-python emits). The bundle id is the sha256
of these bytes, so two writers that agree on the content agree on the id. The reader
re-encodes what it decoded and refuses bytes that differ: a manifest that is not
canonical would have an id that another writer cannot reproduce.

Every walk over a decoded manifest here is iterative and bounded by the limits below
(docs/format.md, "Limits"), so a hostile manifest costs at most milliseconds and can never
exhaust Python's recursion limit.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgpack

from runtime_py.errors import ManifestError
from runtime_py.format.layout import MAX_MANIFEST_BYTES
from runtime_py.schemas import schema_problems

# docs/format.md, "Limits": the C++ reader (cpp_stub/include/bundle/value.h) uses the same.
MAX_VALUES = 1 << 16              # values in the whole manifest (map keys not counted)
MAX_DEPTH = 64                    # the top-level map is depth 1
MAX_STRING_BYTES = 1 << 16        # UTF-8 bytes of one string (key or value)
MAX_ENTRIES = 1 << 16             # entries of one array or map

_LIMITS = dict(max_str_len=MAX_STRING_BYTES, max_bin_len=0, max_array_len=MAX_ENTRIES,
               max_map_len=MAX_ENTRIES, max_ext_len=0)


def _check_tree(value: Any) -> None:
    """Depth, value count, key types and order, no floats: one iterative pass.

    Depth counts containers: the top-level map is depth 1, a map or array inside a
    container of depth d is depth d + 1; scalars add no depth."""
    count = 0
    stack: list[tuple[Any, int, str]] = [(value, 1, "")]
    while stack:
        node, depth, path = stack.pop()
        count += 1
        if count > MAX_VALUES:
            raise ManifestError(f"manifest holds more than {MAX_VALUES} values")
        if isinstance(node, dict):
            if depth > MAX_DEPTH:
                raise ManifestError(f"manifest nests deeper than {MAX_DEPTH} levels at {path}")
            previous = None
            for key, child in node.items():
                if not isinstance(key, str):
                    raise ManifestError(f"manifest key {key!r} at {path or '/'} is not a string")
                # code-point order is UTF-8 byte order
                if previous is not None and key <= previous:
                    raise ManifestError("manifest is not in canonical form (map keys not "
                                        f"sorted at {path or '/'})")
                previous = key
                stack.append((child, depth + 1, f"{path}/{key}"))
        elif isinstance(node, list):
            if depth > MAX_DEPTH:
                raise ManifestError(f"manifest nests deeper than {MAX_DEPTH} levels at {path}")
            stack.extend((child, depth + 1, f"{path}/{i}") for i, child in enumerate(node))
        elif isinstance(node, float):
            raise ManifestError(
                f"manifest value at {path} is a float ({node!r}); write measured numbers as "
                "decimal strings so the manifest bytes are the same on every platform")
        elif not (node is None or isinstance(node, (bool, int, str))):
            raise ManifestError(
                f"manifest value at {path} has unsupported type {type(node).__name__}")


def _sorted_copy(value: Any) -> Any:
    """`value` with map keys sorted at every level (iterative: writers' manifests are
    checked by `_check_tree` after this, any depth must not crash here)."""
    root: list[Any] = [None]
    stack: list[tuple[Any, Any, Any]] = [(value, root, 0)]
    while stack:
        node, parent, slot = stack.pop()
        if isinstance(node, dict):
            for key in node:
                if not isinstance(key, str):
                    raise ManifestError(f"manifest key {key!r} is not a string")
            out: Any = {}
            parent[slot] = out
            for key in sorted(node):
                out[key] = None
                stack.append((node[key], out, key))
        elif isinstance(node, (list, tuple)):
            out = [None] * len(node)
            parent[slot] = out
            stack.extend((child, out, i) for i, child in enumerate(node))
        else:
            parent[slot] = node
    return root[0]


def encode_manifest(manifest: dict) -> bytes:
    """Canonical msgpack bytes of `manifest` (keys sorted at every level, no floats)."""
    canonical = _sorted_copy(manifest)
    _check_tree(canonical)
    return msgpack.packb(canonical, use_bin_type=True)


def decode_manifest(data: bytes) -> dict:
    """Decode with size limits; refuse anything that is not canonical msgpack of a map."""
    def no_ext(code: int, _data: bytes) -> None:
        raise ManifestError(f"manifest uses msgpack extension type {code}, which v1 forbids")

    if len(data) > MAX_MANIFEST_BYTES:
        raise ManifestError(f"manifest is {len(data)} bytes, over the {MAX_MANIFEST_BYTES}-byte "
                            "limit")
    try:
        manifest = msgpack.unpackb(data, raw=False, strict_map_key=True, ext_hook=no_ext,
                                   use_list=True, **_LIMITS)
    except ManifestError:
        raise
    except Exception as exc:  # msgpack raises a zoo of types for bad input
        raise ManifestError(f"manifest is not valid msgpack: {exc}") from None
    if not isinstance(manifest, dict):
        raise ManifestError("manifest is not a msgpack map")
    _check_tree(manifest)
    # Shortest encodings and no duplicate keys (a duplicate collapses in the dict, so the
    # re-encoding is shorter). _check_tree bounded the depth, so packb cannot recurse far.
    if msgpack.packb(manifest, use_bin_type=True) != data:
        raise ManifestError("manifest is not in canonical form (shortest encodings, "
                            "no duplicate keys)")
    return manifest


def _oversized(manifest: dict) -> list[str]:
    """The arrays and maps the schema bounds and descends into, checked by length first so
    that schema validation only ever walks a few thousand values."""
    problems = []

    def bound(where: str, value: Any, limit: int) -> None:
        if isinstance(value, (list, dict)) and len(value) > limit:
            problems.append(f"{where}: {len(value)} entries, more than {limit}")

    for side in ("inputs", "outputs"):
        tensors = manifest.get(side)
        bound(side, tensors, 64)
        if isinstance(tensors, list) and len(tensors) <= 64:
            for i, t in enumerate(tensors):
                if isinstance(t, dict):
                    bound(f"{side}/{i}/shape", t.get("shape"), 8)
    bound("members", manifest.get("members"), 256)
    build = manifest.get("build")
    if isinstance(build, dict):
        bound("build/packages", build.get("packages"), 1024)
    engine = manifest.get("engine")
    if isinstance(engine, dict) and isinstance(engine.get("details"), dict):
        bound("engine/details/batch_sizes", engine["details"].get("batch_sizes"), 1024)
        bound("engine/details/static_batches", engine["details"].get("static_batches"), 1024)
    return problems


def validate_manifest(manifest: dict, minor: int | None = None) -> None:
    """Raise ManifestError listing every schema violation and every broken rule of
    docs/format.md that a schema cannot say (runtime_py/format/semantics.py).

    A manifest of a newer minor (`minor` > this reader's) may carry keys this reader does
    not know, in any map; they are ignored, as docs/format.md promises.
    """
    from runtime_py.format.layout import FORMAT_MINOR
    from runtime_py.format.semantics import semantic_problems

    lenient = minor is not None and minor > FORMAT_MINOR
    problems = _oversized(manifest)
    if not problems:
        problems = schema_problems("manifest", manifest, lenient=lenient)
    if problems:
        raise ManifestError(
            "manifest does not match schemas/manifest.schema.json: " + "; ".join(problems),
            problems=[f"manifest {p}" for p in problems])
    problems = semantic_problems(manifest)
    if problems:
        raise ManifestError("manifest breaks the rules of docs/format.md: " + "; ".join(problems),
                            problems=[f"manifest {p}" for p in problems])


def bundle_id_of(manifest_bytes: bytes) -> str:
    """The bundle's identity: hex sha256 of the canonical manifest bytes."""
    return hashlib.sha256(manifest_bytes).hexdigest()
