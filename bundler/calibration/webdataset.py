"""Webdataset tar shards as calibration items, streamed with the stdlib ``tarfile``.

A webdataset shard is a plain tar whose members are grouped by key: ``<key>.jpg`` (or
``.jpeg``/``.png``) with an optional ``<key>.cls`` holding the integer label as text, as
ImageNet validation shards are commonly shipped. The key is the member path up to the
first dot of its file name (webdataset's rule). Nothing is extracted to disk; members are
read in stream order (``r|*``), so a shard is read once, front to back, and reading stops
as soon as enough items were selected.

Shards come from untrusted places: absolute names, ``..`` components, links and device
files are refused (naming the member) even though nothing is written to disk, because
such a shard is not a webdataset shard and its names must not end up anywhere as paths.
"""

from __future__ import annotations

import re
import tarfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from runtime_py.errors import CalibrationError

IMAGE_EXTENSIONS = ("jpg", "jpeg", "png")
MAX_MEMBER_BYTES = 64 * 1024 * 1024
_BRACE = re.compile(r"\{([^{}]*)\}")


def expand_braces(pattern: str) -> list[str]:
    """Expand ``{000..003}`` numeric ranges (zero padding kept) and ``{a,b}`` lists."""
    match = _BRACE.search(pattern)
    if match is None:
        return [pattern]
    body = match.group(1)
    head, tail = pattern[: match.start()], pattern[match.end():]
    range_match = re.fullmatch(r"(\d+)\.\.(\d+)", body)
    if range_match:
        lo_text, hi_text = range_match.groups()
        lo, hi = int(lo_text), int(hi_text)
        if hi < lo:
            raise CalibrationError(f"shard pattern {pattern!r}: range {{{body}}} is empty")
        width = len(lo_text) if lo_text.startswith("0") else 0
        choices = [str(n).zfill(width) for n in range(lo, hi + 1)]
    elif "," in body:
        choices = body.split(",")
    else:
        raise CalibrationError(
            f"shard pattern {pattern!r}: cannot expand {{{body}}}; use {{000..009}} or {{a,b}}"
        )
    return [expanded for c in choices for expanded in expand_braces(head + c + tail)]


def split_key(name: str) -> tuple[str, str]:
    """``'a/b/x.seg.png'`` -> ``('a/b/x', 'seg.png')``: webdataset's key/extension rule."""
    path = PurePosixPath(name)
    stem, _, ext = path.name.partition(".")
    key = str(path.parent / stem) if str(path.parent) != "." else stem
    return key, ext.lower()


def _check_member(shard: Path, member: tarfile.TarInfo) -> None:
    name = member.name
    parts = PurePosixPath(name).parts
    if name.startswith(("/", "\\")) or ".." in parts or "\\" in name or re.match(r"^[A-Za-z]:", name):
        raise CalibrationError(
            f"{shard.name}: member {name!r} is an absolute or parent-relative path; "
            "refusing this shard (not a webdataset shard, possibly malicious)"
        )
    if not (member.isfile() or member.isdir()):
        raise CalibrationError(
            f"{shard.name}: member {name!r} is a link or special file; refusing this shard "
            "(webdataset shards hold regular files only)"
        )
    if member.isfile() and member.size > MAX_MEMBER_BYTES:
        raise CalibrationError(
            f"{shard.name}: member {name!r} is {member.size} bytes, more than the "
            f"{MAX_MEMBER_BYTES} allowed for one image"
        )


def _parse_label(shard: Path, name: str, raw: bytes) -> int:
    try:
        return int(raw.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        raise CalibrationError(
            f"{shard.name}: {name!r} must hold an integer class index as text, "
            f"got {raw[:32]!r}"
        ) from None


def iter_shard_samples(shards: list[Path]) -> Iterator[tuple[str, bytes, int | None, str]]:
    """Yield ``(key, image bytes, label or None, origin)`` per sample, in shard then stream
    order; ``origin`` names the image member and its shard for messages.

    Consecutive members with the same key form one sample (webdataset's grouping). A key
    seen again after another key is refused: it would make keys (and the data digest)
    ambiguous.
    """
    seen: set[str] = set()
    for shard in shards:
        try:
            tar = tarfile.open(shard, mode="r|*")
        except (tarfile.TarError, OSError) as exc:
            raise CalibrationError(f"cannot read tar shard {shard.name}: {exc}") from None
        with tar:
            group_key: str | None = None
            group: dict[str, tuple[str, bytes]] = {}
            try:
                for member in tar:
                    _check_member(shard, member)
                    if not member.isfile():
                        continue
                    key, ext = split_key(member.name)
                    if ext not in IMAGE_EXTENSIONS and ext != "cls":
                        continue
                    if key != group_key:
                        if group_key is not None:
                            sample = _finish(shard, group_key, group)
                            if sample is not None:
                                yield sample
                        if key in seen:
                            raise CalibrationError(
                                f"{shard.name}: key {key!r} appears twice in the shards; "
                                "webdataset keys must be unique and their members adjacent"
                            )
                        seen.add(key)
                        group_key, group = key, {}
                    fileobj = tar.extractfile(member)
                    raw = fileobj.read() if fileobj is not None else b""
                    group[ext] = (member.name, raw)
            except tarfile.TarError as exc:
                raise CalibrationError(f"tar shard {shard.name} is corrupt: {exc}") from None
            if group_key is not None:
                sample = _finish(shard, group_key, group)
                if sample is not None:
                    yield sample


def _finish(
    shard: Path, key: str, group: dict[str, tuple[str, bytes]]
) -> tuple[str, bytes, int | None, str] | None:
    images = [ext for ext in IMAGE_EXTENSIONS if ext in group]
    if not images:
        return None
    if len(images) > 1:
        raise CalibrationError(
            f"{shard.name}: sample {key!r} has more than one image ({', '.join(images)})"
        )
    member_name, raw = group[images[0]]
    label = None
    if "cls" in group:
        name, cls_raw = group["cls"]
        label = _parse_label(shard, name, cls_raw)
    return key, raw, label, f"member {member_name!r} of shard {shard}"
