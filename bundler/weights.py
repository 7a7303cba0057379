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
    """The pinned revision's checkpoint in the local Hugging Face cache, if it is there.

    Reads the cache layout directly (models--<org>--<name>/snapshots/<revision>/), which is
    what huggingface_hub's offline lookup does, so that no hub client is needed.
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
        candidate = root / folder / "snapshots" / ckpt.revision / CHECKPOINT_FILENAME
        if candidate.is_file():
            return candidate
    return None


def download_command(family: Family) -> str:
    """The huggingface_hub command that puts the pinned checkpoint into the cache."""
    ckpt = family.checkpoint
    return f"hf download {ckpt.hf_id} {CHECKPOINT_FILENAME} --revision {ckpt.revision}"


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
        return Weights(source={"kind": "checkpoint", "id": ckpt.hf_id, "revision": ckpt.revision,
                               "file": path.name, "sha256": "sha256:" + file_sha256(path)},
                       state_dict=_load_safetensors(path))
    if random_weights:
        return Weights(source={"kind": "random-weights", "seed": int(seed)}, seed=int(seed))
    cached = hf_cache_file(family)
    if cached is None:
        raise WeightsError(
            f"no weights for {family.name}: {ckpt.hf_id}@{ckpt.revision[:12]} is not in the "
            "Hugging Face cache (nothing is downloaded). Either put it there "
            f"(`{download_command(family)}`, the `hf` command of huggingface_hub), pass "
            "--checkpoint FILE.safetensors, or pass --random-weights for a smoke-test bundle")
    return Weights(source={"kind": "checkpoint", "id": ckpt.hf_id, "revision": ckpt.revision,
                           "file": CHECKPOINT_FILENAME, "sha256": "sha256:" + file_sha256(cached)},
                   state_dict=_load_safetensors(cached))
