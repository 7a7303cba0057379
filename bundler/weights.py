"""Where a family's weights come from: a checkpoint file, the Hugging Face cache, or a seed.

Nothing is downloaded, ever: a build host is often offline and a bundle must record exactly
which bytes it was built from (the checkpoint's sha256 goes into the manifest). Checkpoints
are read as safetensors only; pickle-based files (.pth, .bin, .pt) are refused.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bundler.families import Family
from runtime_py.errors import UsageError, WeightsError

CHECKPOINT_FILENAME = "model.safetensors"


@dataclass
class Weights:
    """Resolved weights: a state dict (or None for seeded random) and the manifest record."""

    source: dict
    state_dict: dict[str, Any] | None = field(default=None, repr=False)
    seed: int | None = None

    @property
    def is_random(self) -> bool:
        return self.source["kind"] == "random-weights"


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def hf_cache_file(family: Family) -> Path | None:
    """The pinned checkpoint in the local Hugging Face cache, if it is there.

    Reads the cache layout directly (models--<org>--<name>/snapshots/<revision>/), which is
    what huggingface_hub's offline lookup does, so that no hub client is needed. A family
    pinned by sha256 instead of a revision takes the snapshot ``refs/main`` names (the
    digest check then says whether it is the pinned file).
    """
    ckpt = family.checkpoint
    roots = []
    if os.environ.get("HF_HUB_CACHE"):
        roots.append(Path(os.environ["HF_HUB_CACHE"]))
    if os.environ.get("HF_HOME"):
        roots.append(Path(os.environ["HF_HOME"]) / "hub")
    roots.append(Path.home() / ".cache" / "huggingface" / "hub")
    folder = "models--" + ckpt.hf_id.replace("/", "--")
    for root in roots:
        revision = ckpt.revision
        if revision is None:
            try:
                revision = (root / folder / "refs" / "main").read_text(encoding="utf-8").strip()
            except (OSError, UnicodeDecodeError):
                continue
        candidate = root / folder / "snapshots" / revision / CHECKPOINT_FILENAME
        if candidate.is_file():
            return candidate
    return None


def pins_dir() -> Path:
    """Where the sha256 pins of families without a hub revision are recorded:
    ``$TRT_BUNDLE_CACHE/pins`` if set, else ``~/.cache/trt-bundle/pins``."""
    base = os.environ.get("TRT_BUNDLE_CACHE")
    return (Path(base).expanduser() if base else Path.home() / ".cache" / "trt-bundle") / "pins"


def check_pin(family: Family, sha256: str) -> None:
    """Refuse a checkpoint whose sha256 is not the family's pin.

    A family with a hub revision is pinned by it (the cache path says which file it is);
    one with ``checkpoint.sha256`` is pinned by that digest; one with neither is pinned by
    the digest recorded at its first make (``pins_dir()/<family>.sha256``), checked on
    every later one.
    """
    ckpt = family.checkpoint
    if ckpt.revision is not None and ckpt.sha256 is None:
        return
    pinned, where = ckpt.sha256, f"{family.path / 'family.json'} (checkpoint.sha256)"
    record = pins_dir() / f"{family.name}.sha256"
    if pinned is None:
        where = str(record)
        try:
            pinned = record.read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            from bundler.writer import atomic_write

            record.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(record, [(sha256 + "\n").encode("ascii")])
            return
        except (OSError, UnicodeDecodeError) as exc:
            raise WeightsError(f"cannot read the weights pin {record}: {exc}") from None
    if pinned != sha256:
        raise WeightsError(
            f"the checkpoint's sha256 {sha256[:16]}... is not the one {family.name} is pinned "
            f"to ({pinned[:16]}..., in {where}): pass the checkpoint of {ckpt.hf_id} that was "
            f"used before, or delete {record} to pin this one")


def download_command(family: Family) -> str:
    """The huggingface_hub command that puts the pinned checkpoint into the cache."""
    ckpt = family.checkpoint
    revision = f" --revision {ckpt.revision}" if ckpt.revision else ""
    return f"hf download {ckpt.hf_id} {CHECKPOINT_FILENAME}{revision}"


def _load_safetensors(path: Path) -> dict[str, Any]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise WeightsError(f"cannot read checkpoint {path}: {exc}") from None


def resolve_weights(family: Family, checkpoint: str | os.PathLike | None = None,
                    random_weights: bool = False, seed: int = 0) -> Weights:
    """Pick the weights: --checkpoint FILE, else --random-weights, else the HF cache."""
    if checkpoint is not None and random_weights:
        raise UsageError("--checkpoint and --random-weights exclude each other: choose one")
    ckpt = family.checkpoint
    if checkpoint is not None:
        path = Path(checkpoint)
        if not path.is_file():
            raise WeightsError(f"checkpoint {path} does not exist or is not a file")
        if path.suffix != ".safetensors":
            raise WeightsError(
                f"checkpoint {path.name}: only .safetensors checkpoints are read (pickle-based "
                "files can run code when loaded); convert it with safetensors first")
        return _checkpoint(family, path, path.name)
    if random_weights:
        return Weights(source={"kind": "random-weights", "seed": int(seed)}, seed=int(seed))
    cached = hf_cache_file(family)
    if cached is None:
        raise WeightsError(
            f"no weights for {family.name}: {ckpt.hf_id}"
            f"{'@' + ckpt.revision[:12] if ckpt.revision else ''} is not in the "
            "Hugging Face cache (nothing is downloaded). Either put it there "
            f"(`{download_command(family)}`, the `hf` command of huggingface_hub), pass "
            "--checkpoint FILE.safetensors, or pass --random-weights for a smoke-test bundle")
    return _checkpoint(family, cached, CHECKPOINT_FILENAME)


def _checkpoint(family: Family, path: Path, file: str) -> Weights:
    digest = file_sha256(path)
    check_pin(family, digest)
    source = {"kind": "checkpoint", "id": family.checkpoint.hf_id, "file": file,
              "sha256": "sha256:" + digest}
    if family.checkpoint.revision is not None:
        source["revision"] = family.checkpoint.revision
    return Weights(source=source, state_dict=_load_safetensors(path))
