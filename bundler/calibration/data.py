"""Calibration (and evaluation) data: which images, in which order, with which digest.

``open_calibration_data(path, preprocess, count=500, stride=1)`` accepts

* a folder of images (recursive; ``.jpg .jpeg .png .bmp .webp``, any case; hidden files
  skipped), ordered by relative POSIX path. When the folder holds no images directly but
  sub-folders, it is a folder-per-class layout and an image's label is its top-level
  sub-folder's class index: by default its index among all (non-hidden) sub-folders
  sorted by name, as torchvision's ``ImageFolder`` does (labels do not matter for
  calibration); ``class_folders`` gives another rule (``bundle eval``: see
  ``bundler.class_labels``);
* webdataset tar shards: one ``.tar``, a folder of ``.tar`` files (sorted by name), or a
  brace pattern such as ``shard-{000..003}.tar`` (see :mod:`.webdataset`);
* a ``.safetensors`` file of preprocessed tensors: ``images`` [N, C, H, W] float32 and
  optional ``labels`` [N] integer. The preprocessing callable is not used for it.

Selection is deterministic: items are enumerated in the order above, every ``stride``-th
item is taken (item 0, stride, 2*stride, ...) until ``count`` are taken. Fewer available
than ``count`` is fine: ``len(set)`` says how many were used (``requested`` keeps the ask).

The digest is ``"sha256:" + sha256(for each selected item, in order: len(key) as 8-byte
little-endian, key in UTF-8, len(raw) as 8-byte little-endian, raw)``, where ``raw`` is
the encoded file bytes for images and the item's float32 little-endian C-order bytes for
safetensors. The length prefixes make it unambiguous; keys are relative (path inside the
folder, webdataset key, or ``images[i]``), so moving the data does not change it.
``keys`` and ``item_digests`` (sha256 of each raw item) let evaluation refuse to evaluate
on calibration images.

Images are decoded with Pillow (JPEG, PNG, BMP, WebP decoders only) to RGB and handed to the ``preprocess`` callable (the
runtime's ``Preprocessor``), which must return a CHW float32 array. Encoded bytes of the
selected images are held in memory (about 130 KB per ImageNet JPEG) so that the data
used is exactly the data digested; safetensors items are re-read lazily and re-checked
against their digest.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

from runtime_py.errors import CalibrationError, UsageError

from . import synthetic, webdataset

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp")
# Only these decoders are tried: PIL would otherwise also try EPS (Ghostscript) and others.
PIL_FORMATS = ("JPEG", "PNG", "BMP", "WEBP")
DEFAULT_COUNT = 500

@dataclass(frozen=True)
class DataRole:
    """What a data set is for, so that messages name the job and the options the user gave
    (`bundle eval --data` is not calibration, and has no --calib-data)."""

    purpose: str           # "calibration", "evaluation", "reference"
    option: str            # the option that named the data
    count_option: str
    stride_option: str


CALIBRATION = DataRole("calibration", "--calib-data", "--calib-count", "--calib-stride")
EVALUATION = DataRole("evaluation", "--data", "--count", "--stride")
REFERENCE = DataRole("reference", "--reference-data", "--reference-count", "--stride")
STUDY_EVALUATION = DataRole("evaluation", "--eval-data", "--eval-count", "--eval-stride")

#: Sorted per-class folder names -> {folder name: class index}, or None for no labels;
#: raises for names it cannot map (see ``bundler.class_labels``).
ClassFolders = Callable[[list[str]], Optional[dict[str, int]]]

Preprocess = Callable[[Any], np.ndarray]
"""Takes a PIL RGB image, returns CHW float32 (``runtime_py.preprocess.Preprocessor`` fits)."""
Batch = tuple[np.ndarray, Optional[np.ndarray], list[str]]


@dataclass(frozen=True)
class _Item:
    key: str
    label: int | None
    sha256: str
    raw: bytes | None  # None: loaded lazily by the set's loader
    origin: str = ""   # where it is, for messages: a file path, or a shard's member


class CalibrationSet:
    """A selected, digested, ordered list of items; decodes them in batches on demand."""

    def __init__(
        self,
        source: str,
        items: list[_Item],
        requested: int,
        digest: str,
        loader: Callable[[int, _Item], np.ndarray],
        role: DataRole = CALIBRATION,
    ) -> None:
        self.source = source
        self.role = role
        self._items = items
        self.requested = requested
        self.digest = digest
        self._loader = loader

    def __len__(self) -> int:
        return len(self._items)

    @property
    def keys(self) -> tuple[str, ...]:
        """Keys of the selected items, in order."""
        return tuple(item.key for item in self._items)

    @property
    def item_digests(self) -> frozenset[str]:
        """sha256 hex of each selected item's raw bytes (matches the same image anywhere)."""
        return frozenset(item.sha256 for item in self._items if item.sha256)

    @property
    def labels(self) -> np.ndarray | None:
        """int64 [N] labels when every selected item has one, else None."""
        if not self._items or any(item.label is None for item in self._items):
            return None
        return np.array([item.label for item in self._items], dtype=np.int64)

    def iter_batches(self, batch_size: int) -> Iterator[Batch]:
        """Yield ``(images NCHW float32, labels int64 [n] or None, keys)`` per batch."""
        if batch_size < 1:
            raise UsageError(f"batch size must be >= 1, got {batch_size}")
        labels = self.labels
        for start in range(0, len(self._items), batch_size):
            chunk = self._items[start : start + batch_size]
            arrays = [self._checked(start + k, item) for k, item in enumerate(chunk)]
            shapes = {a.shape for a in arrays}
            if len(shapes) > 1:
                raise CalibrationError(
                    f"{self.role.purpose} items have different shapes {sorted(shapes)} "
                    f"(batch starting at {chunk[0].key!r}); the preprocessing must give "
                    "one fixed shape"
                )
            batch_labels = None if labels is None else labels[start : start + len(chunk)]
            yield np.stack(arrays), batch_labels, [item.key for item in chunk]

    def _checked(self, index: int, item: _Item) -> np.ndarray:
        array = np.asarray(self._loader(index, item))
        if array.ndim != 3:
            raise CalibrationError(
                f"preprocessing of {item.key!r} gave shape {array.shape}, expected C x H x W"
            )
        if array.dtype == np.uint8:   # pixels for a uint8-input bundle's references
            return array
        return array.astype(np.float32, copy=False)


def _digest(keys_and_raw: list[tuple[str, bytes]]) -> str:
    h = hashlib.sha256()
    for key, raw in keys_and_raw:
        k = key.encode("utf-8")
        h.update(len(k).to_bytes(8, "little"))
        h.update(k)
        h.update(len(raw).to_bytes(8, "little"))
        h.update(raw)
    return "sha256:" + h.hexdigest()


def _check_selection(count: int, stride: int, role: DataRole = CALIBRATION) -> None:
    if count < 1:
        raise CalibrationError(f"{role.count_option} must be >= 1, got {count}")
    if stride < 1:
        raise CalibrationError(f"{role.stride_option} must be >= 1, got {stride}")


def _select(enumerated, count: int, stride: int):
    """Every ``stride``-th element, up to ``count``; stops consuming once done."""
    taken = 0
    for index, element in enumerate(enumerated):
        if taken >= count:
            break
        if index % stride == 0:
            taken += 1
            yield element


def _image_problem(exc: BaseException) -> str:
    """Pillow's reason, without its in-memory file object's repr (`<_io.BytesIO ...>`)."""
    from PIL import UnidentifiedImageError

    if isinstance(exc, UnidentifiedImageError):
        return "not a " + ", ".join(PIL_FORMATS[:-1]) + f" or {PIL_FORMATS[-1]} image"
    text = str(exc)
    return "unreadable" if "BytesIO" in text or not text else text


def _describe(role: DataRole, item: _Item) -> str:
    return f"{role.purpose} image {item.key!r}" + (f" ({item.origin})" if item.origin else "")


def _preprocessed(item: _Item, preprocess: Preprocess, role: DataRole) -> np.ndarray:
    """Decode to RGB and preprocess; any failure names the image and where it is."""
    from PIL import Image

    from runtime_py.errors import PreprocessError

    try:
        with Image.open(io.BytesIO(item.raw), formats=PIL_FORMATS) as image:
            rgb = image.convert("RGB")
        return preprocess(rgb)
    except (OSError, SyntaxError, ValueError, EOFError, Image.DecompressionBombError,
            PreprocessError) as exc:
        raise CalibrationError(
            f"{_describe(role, item)} cannot be decoded ({_image_problem(exc)}); remove or "
            "replace it"
        ) from None


def _check_image_header(item: _Item, role: DataRole) -> None:
    """Cheap early check (header only) so that a non-image fails before any inference."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(item.raw), formats=PIL_FORMATS):
            pass
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        raise CalibrationError(
            f"{_describe(role, item)} is {_image_problem(exc)}; remove or replace it"
        ) from None


def _image_set(
    source: str,
    samples: list[tuple[str, bytes, int | None, str]],
    requested: int,
    preprocess: Preprocess | None,
    where: str,
    role: DataRole,
) -> CalibrationSet:
    if not samples:
        raise CalibrationError(
            f"no {role.purpose} images found in {where} (looked for "
            f"{', '.join(IMAGE_EXTENSIONS)} files or webdataset .jpg/.png samples)"
        )
    if preprocess is None:
        raise UsageError(f"image {role.purpose} data needs the family's preprocessing callable")
    items = []
    for key, raw, label, origin in samples:
        item = _Item(key, label, hashlib.sha256(raw).hexdigest(), raw, origin)
        _check_image_header(item, role)
        items.append(item)

    def load(_: int, item: _Item) -> np.ndarray:
        return _preprocessed(item, preprocess, role)

    digest = _digest([(key, raw) for key, raw, _, _ in samples])
    return CalibrationSet(source, items, requested, digest, load, role)


def _is_image(name: str) -> bool:
    return name.lower().endswith(IMAGE_EXTENSIONS) and not name.startswith(".")


def _folder_files(root: Path, class_folders: ClassFolders | None = None
                  ) -> list[tuple[str, Path, int | None]]:
    files: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for name in filenames:
            if _is_image(name):
                path = Path(dirpath) / name
                files.append((path.relative_to(root).as_posix(), path))
    files.sort(key=lambda f: f[0])
    top_level_images = any("/" not in rel for rel, _ in files)
    classes = sorted(
        e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith(".")
    )
    if top_level_images or not classes:
        return [(rel, path, None) for rel, path in files]
    index = (class_folders(classes) if class_folders is not None
             else {name: i for i, name in enumerate(classes)})
    if index is None:                                  # the caller wants no labels
        return [(rel, path, None) for rel, path in files]
    return [(rel, path, index[rel.split("/", 1)[0]]) for rel, path in files]


def _read(path: Path, key: str, role: DataRole) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise CalibrationError(f"cannot read {role.purpose} image {key!r}: {exc}") from None


def _shard_paths(path_text: str, role: DataRole) -> list[Path] | None:
    """Shards named by ``path_text``, or None when it does not name tar shards."""
    if "{" in path_text:
        shards = [Path(p) for p in webdataset.expand_braces(path_text)]
        missing = [str(p) for p in shards if not p.is_file()]
        if missing:
            raise CalibrationError(
                f"{role.purpose} shards not found: {', '.join(missing[:5])}"
                + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
            )
        return shards
    path = Path(path_text)
    if path.is_file() and path.suffix.lower() == ".tar":
        return [path]
    if path.is_dir():
        tars = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() == ".tar")
        return tars or None
    return None


def open_calibration_data(
    path: str | os.PathLike[str],
    preprocess: Preprocess | None,
    *,
    count: int = DEFAULT_COUNT,
    stride: int = 1,
    role: DataRole = CALIBRATION,
    class_folders: ClassFolders | None = None,
) -> CalibrationSet:
    """Select ``count`` items (every ``stride``-th) from ``path``; see the module docstring.

    ``role`` names the job and its options in messages. ``class_folders`` maps the names
    of per-class folders to class indices (default: their sorted order, which is only
    right when the folders are named so; ``bundle eval`` passes an explicit rule).
    """
    _check_selection(count, stride, role)
    path_text = os.fspath(path)
    shards = _shard_paths(path_text, role)
    if shards is not None:
        if Path(path_text).is_dir() and _folder_files(Path(path_text)):
            raise CalibrationError(
                f"{path_text} holds both images and .tar shards; point {role.option} at one "
                "of them"
            )
        samples = list(_select(webdataset.iter_shard_samples(shards), count, stride))
        name = Path(path_text).name
        return _image_set(f"webdataset:{name}", samples, count, preprocess, path_text, role)
    p = Path(path_text)
    if not p.exists():
        raise CalibrationError(
            f"{role.purpose} data {path_text} does not exist; give {role.option} a folder of "
            "images, webdataset .tar shards or a .safetensors file"
        )
    if p.is_dir():
        chosen = list(_select(_folder_files(p, class_folders), count, stride))
        samples = [(rel, _read(file, rel, role), label, f"file {file}")
                   for rel, file, label in chosen]
        return _image_set(f"folder:{p.name}", samples, count, preprocess, path_text, role)
    if p.suffix.lower() == ".safetensors":
        return _safetensors_set(p, count, stride, role)
    raise CalibrationError(
        f"{role.purpose} data {path_text} is neither a folder, a .tar shard nor a "
        ".safetensors file"
    )


def _safetensors_set(path: Path, count: int, stride: int, role: DataRole) -> CalibrationSet:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="np") as f:
            keys = set(f.keys())
            if "images" not in keys:
                raise CalibrationError(
                    f"{path.name} has no 'images' tensor (expected images [N,C,H,W] float32 "
                    "and optional labels [N] int64)"
                )
            images = f.get_slice("images")
            shape, dtype = images.get_shape(), images.get_dtype()
            if len(shape) != 4 or dtype != "F32":
                raise CalibrationError(
                    f"{path.name}: 'images' is {dtype} {shape}, expected float32 [N,C,H,W]"
                )
            labels = None
            if "labels" in keys:
                labels = f.get_tensor("labels")
                if labels.shape != (shape[0],) or labels.dtype.kind not in "iu":
                    raise CalibrationError(
                        f"{path.name}: 'labels' is {labels.dtype} {list(labels.shape)}, "
                        f"expected integer [{shape[0]}]"
                    )
            if shape[0] == 0:
                raise CalibrationError(f"no {role.purpose} images found in {path} (N = 0)")
            chosen = list(_select(range(shape[0]), count, stride))
            raws = [images[i : i + 1].tobytes() for i in chosen]
    except SafetensorError as exc:
        raise CalibrationError(f"cannot read {path.name} as safetensors: {exc}") from None
    items = [
        _Item(
            f"images[{i}]",
            None if labels is None else int(labels[i]),
            hashlib.sha256(raw).hexdigest(),
            None,
        )
        for i, raw in zip(chosen, raws)
    ]
    digest = _digest([(item.key, raw) for item, raw in zip(items, raws)])
    item_shape = tuple(shape[1:])

    def load(position: int, item: _Item) -> np.ndarray:
        index = chosen[position]
        with safe_open(str(path), framework="np") as f:
            array = f.get_slice("images")[index : index + 1]
        if hashlib.sha256(array.tobytes()).hexdigest() != item.sha256:
            raise CalibrationError(f"{path.name} changed while reading it for {role.purpose} "
                                   f"({item.key}); run again")
        return array.reshape(item_shape)

    return CalibrationSet(f"safetensors:{path.name}", items, count, digest, load, role)


def synthetic_calibration_set(
    shape: tuple[int, int, int],
    count: int,
    seed: int = 0,
    preprocess: Preprocess | None = None,
) -> CalibrationSet:
    """Seeded synthetic pictures (see :mod:`.synthetic`) for builds without data.

    ``shape`` is the model input's (C, H, W), C = 3. With ``preprocess`` each picture
    (H x W) goes through it as a PIL image, like real data; without, the uint8 picture is
    mapped to [-1, 1] CHW. The digest is the sha256 of the source string, which names the
    generator version, seed, shape and count: the same string is the same images.
    """
    _check_selection(count, 1)
    c, h, w = (int(v) for v in shape)
    if c != 3 or h < 1 or w < 1:
        raise UsageError(f"synthetic calibration makes RGB images: shape must be (3, H, W), got {shape}")
    source = synthetic.describe((c, h, w), count, seed)
    items = [_Item(f"synthetic/{i:06d}", None, "", None) for i in range(count)]

    def load(position: int, _: _Item) -> np.ndarray:
        picture = synthetic.synthetic_image(h, w, seed, position)
        if preprocess is not None:
            from PIL import Image

            return preprocess(Image.fromarray(picture))
        return (picture.astype(np.float32) / np.float32(127.5) - 1.0).transpose(2, 0, 1)

    digest = "sha256:" + hashlib.sha256(source.encode("utf-8")).hexdigest()
    return CalibrationSet(source, items, count, digest, load)
