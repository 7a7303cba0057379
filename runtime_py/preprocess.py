"""The preprocessing spec applied to images: encoded image -> the model's input tensor.

The spec (``schemas/preprocess.schema.json``) is data: decode to RGB, resize the shorter
edge, center crop, rescale, normalize, NCHW float32. This module is its reference
implementation in the runtime, built on PIL + numpy only (no torch, no timm), and it gives
the same tensor as timm's eval transform (torchvision on PIL images) to <= 1e-5:

- decode: ``Image.open`` then ``img.convert("RGB")`` for every mode that is not RGB
  (grayscale, RGBA, palette, CMYK, 16-bit), which is what timm's datasets do before the
  transform. EXIF orientation is NOT applied: timm does not apply it, and a model
  evaluated through timm saw its images unrotated. Multi-frame files give their first frame.
- resize: torchvision's ``Resize(int)`` on a PIL image is ``img.resize`` with the size
  computed as ``short -> size, long -> int(size * long / short)``; PIL always antialiases.
  We call the very same PIL resize, so the pixels are identical. ``Image.draft`` (JPEG
  DCT scaling) would be faster but changes the pixels, so it is not used.
- crop: torchvision's offsets ``int(round((h - th) / 2.0))`` and its zero padding when the
  image is smaller than the crop; ``Image.crop`` outside the image fills with zeros, which
  is the same padding.
- rescale + normalize: one fused float32 ``x * (factor / std) - mean / std`` written
  straight into the (preallocated) output, instead of torch's convert, divide, subtract,
  divide passes. It differs from torch's arithmetic by a few float32 ulps (< 1e-6).

Safety: every decoding failure becomes a ``PreprocessError`` naming the input; images
over ``max_pixels`` (PIL's ``Image.MAX_IMAGE_PIXELS`` by default) are refused from their
header before any pixel is decoded, and so is a resize whose output would exceed it
(a 1 x 100000 image is small, its 331-pixel-high resize is not). Only the formats in
``formats`` are opened (PIL otherwise also tries EPS, which runs Ghostscript).
"""

from __future__ import annotations

import io
import math
import os
from collections.abc import Iterable, Sequence
from typing import Any, Union

import numpy as np
from PIL import Image

from runtime_py.errors import PreprocessError
from runtime_py.schemas import schema_problems

ImageInput = Union[str, "os.PathLike[str]", bytes, bytearray, memoryview, Image.Image]

#: Formats opened by default: what cameras, browsers and datasets produce (MPO comes with JPEG).
DEFAULT_FORMATS: tuple[str, ...] = ("JPEG", "PNG", "WEBP", "BMP", "GIF", "TIFF")

_RESAMPLE = {
    "bicubic": Image.Resampling.BICUBIC,
    "bilinear": Image.Resampling.BILINEAR,
    "nearest": Image.Resampling.NEAREST,
    "lanczos": Image.Resampling.LANCZOS,
}

#: timm's DEFAULT_CROP_PCT, used when a data config has crop_pct None.
_TIMM_DEFAULT_CROP_PCT = 0.875


def resized_size(width: int, height: int, size: int) -> tuple[int, int]:
    """(width, height) after torchvision's ``Resize(size)`` (shorter edge) of a PIL image.

    The long edge is truncated, not rounded: ``int(size * long / short)``.
    """
    if width <= height:
        return size, int(size * height / width)
    return int(size * width / height), size


def crop_box(width: int, height: int, crop_w: int, crop_h: int) -> tuple[int, int, int, int]:
    """PIL crop box (left, top, right, bottom) of torchvision's ``CenterCrop``.

    Where the image is smaller than the crop, torchvision pads ``(crop - size) // 2`` on the
    left/top (and the rest on the right/bottom) with zeros and takes the whole padded edge:
    a negative offset into the unpadded image.
    """
    if crop_w > width:
        left = -((crop_w - width) // 2)
    else:
        left = int(round((width - crop_w) / 2.0))
    if crop_h > height:
        top = -((crop_h - height) // 2)
    else:
        top = int(round((height - crop_h) / 2.0))
    return left, top, left + crop_w, top + crop_h


class Preprocessor:
    """Turns images (paths, bytes or PIL images) into the model's input tensor.

    Construction only validates the spec and precomputes constants (no I/O). Instances
    hold no mutable state, so one can be shared by threads.
    """

    def __init__(
        self,
        spec: dict[str, Any],
        *,
        max_pixels: int | None = None,
        formats: Sequence[str] | None = DEFAULT_FORMATS,
    ) -> None:
        problems = schema_problems("preprocess", spec)
        if problems:
            raise PreprocessError(
                "invalid preprocessing spec: " + "; ".join(problems)
                + " (see schemas/preprocess.schema.json)",
                problems=problems,
            )
        if not spec["resize"]["antialias"]:
            raise PreprocessError(
                "invalid preprocessing spec: resize.antialias is false, but PIL always "
                "antialiases when downscaling; this runtime can only apply antialias=true")
        self.spec = spec
        self.input_name: str = spec["input"]
        self.size: int = spec["resize"]["size"]
        self.resample = _RESAMPLE[spec["resize"]["interpolation"]]
        self.crop_h: int = spec["center_crop"]["height"]
        self.crop_w: int = spec["center_crop"]["width"]
        self.max_pixels = int(max_pixels if max_pixels is not None
                              else (Image.MAX_IMAGE_PIXELS or 2**31 - 1))
        self.formats = tuple(formats) if formats is not None else None
        mean = np.asarray(spec["normalize"]["mean"], dtype=np.float64)
        std = np.asarray(spec["normalize"]["std"], dtype=np.float64)
        factor = float(spec["rescale"]["factor"])
        # x * scale + bias == (x * factor - mean) / std, computed once in float64.
        self._scale = (factor / std).astype(np.float32).reshape(3, 1, 1)
        self._bias = (-mean / std).astype(np.float32).reshape(3, 1, 1)
        #: uint8 NHWC pixels out (the engine rescales and normalizes on the device)
        self.pixels_out = spec["dtype"] == "uint8"
        self.dtype = np.dtype(spec["dtype"])

    @property
    def output_shape(self) -> tuple[int, int, int]:
        """(C, H, W) of one preprocessed image, or (H, W, C) for uint8 pixels."""
        return (self.crop_h, self.crop_w, 3) if self.pixels_out else (3, self.crop_h, self.crop_w)

    @property
    def pixel_scale_bias(self) -> tuple[np.ndarray, np.ndarray]:
        """float32 (scale, bias) of shape (3,): the engine head computes
        ``float(pixel) * scale + bias`` per channel, exactly this class's host arithmetic."""
        return self._scale.reshape(3), self._bias.reshape(3)

    def normalize(self, pixels: np.ndarray) -> np.ndarray:
        """uint8 NHWC pixels -> the float32 NCHW tensor, as the engine's head computes it."""
        out = np.multiply(pixels.transpose(0, 3, 1, 2), self._scale[None], dtype=np.float32)
        out += self._bias[None]
        return out

    def __call__(self, image: ImageInput) -> np.ndarray:
        """One image -> float32 (3, H, W), or uint8 (H, W, 3) pixels for a uint8 spec."""
        out = np.empty(self.output_shape, dtype=self.dtype)
        self._into(image, out)
        return out

    def batch(self, images: Iterable[ImageInput]) -> np.ndarray:
        """Images -> (N, *output_shape), each written into its slot directly."""
        images = list(images)
        out = np.empty((len(images), *self.output_shape), dtype=self.dtype)
        for i, image in enumerate(images):
            try:
                self._into(image, out[i])
            except PreprocessError as exc:
                raise PreprocessError(f"image {i} of the batch: {exc}",
                                      problems=[f"image {i}: {p}" for p in exc.problems]) from exc
        return out

    # --- steps ----------------------------------------------------------------------

    def _into(self, image: ImageInput, out: np.ndarray) -> None:
        if isinstance(image, Image.Image):
            self._from_pil(image, _describe(image), out)
            return
        label = _describe(image)
        if isinstance(image, (bytes, bytearray, memoryview)):
            source: Any = io.BytesIO(image)
        elif isinstance(image, (str, os.PathLike)):
            source = os.fspath(image)
        else:
            raise PreprocessError(
                f"cannot preprocess {label}: give a file path, the encoded bytes or a PIL image")
        try:
            opened = Image.open(source, formats=self.formats)
        except FileNotFoundError:
            raise PreprocessError(f"cannot read {label}: no such file") from None
        except IsADirectoryError:
            raise PreprocessError(f"cannot read {label}: it is a directory, not an image file") from None
        except Image.DecompressionBombError as exc:
            raise PreprocessError(f"refusing {label}: {exc}") from None
        except Image.UnidentifiedImageError:
            allowed = ", ".join(self.formats) if self.formats else "any PIL format"
            raise PreprocessError(
                f"cannot decode {label}: not an image in a supported format ({allowed})") from None
        except OSError as exc:
            raise PreprocessError(f"cannot read {label}: {exc}") from None
        with opened:
            self._from_pil(opened, label, out)

    def _from_pil(self, img: Image.Image, label: str, out: np.ndarray) -> None:
        width, height = img.size
        if width <= 0 or height <= 0:
            raise PreprocessError(f"cannot preprocess {label}: the image has zero size ({width}x{height})")
        if width * height > self.max_pixels:
            raise PreprocessError(
                f"refusing {label}: {width}x{height} = {width * height} pixels is over the limit "
                f"of {self.max_pixels} (decompression-bomb safety); downscale the image first "
                "or raise max_pixels")
        new_w, new_h = resized_size(width, height, self.size)
        if new_w * new_h > self.max_pixels:
            raise PreprocessError(
                f"refusing {label}: resizing {width}x{height} to a shorter edge of {self.size} "
                f"gives {new_w}x{new_h}, over the limit of {self.max_pixels} pixels "
                "(an extreme aspect ratio makes a small image large once resized); crop it first")
        try:
            if img.mode == "L":
                # Resampling works per channel with the same integer arithmetic, so resizing
                # the one gray channel and repeating it equals convert("RGB") then resize.
                gray = True
            else:
                gray = False
                if img.mode != "RGB":
                    img = img.convert("RGB")
            if (new_w, new_h) != (width, height):
                img = img.resize((new_w, new_h), self.resample)
            img = img.crop(crop_box(new_w, new_h, self.crop_w, self.crop_h))
            pixels = np.asarray(img)
        except (OSError, ValueError, SyntaxError, EOFError, IndexError) as exc:
            raise PreprocessError(f"cannot decode {label}: {exc}") from None
        if self.pixels_out:
            out[...] = pixels[:, :, None] if gray else pixels
            return
        if gray:
            np.multiply(pixels[None, :, :], self._scale, out=out)
        else:
            np.multiply(pixels.transpose(2, 0, 1), self._scale, out=out)
        out += self._bias


def _describe(image: object) -> str:
    if isinstance(image, Image.Image):
        return f"PIL image ({image.width}x{image.height}, mode {image.mode})"
    if isinstance(image, (bytes, bytearray, memoryview)):
        return f"image bytes ({len(image)} bytes)"
    if isinstance(image, (str, os.PathLike)):
        return f"image file {os.fspath(image)!r}"
    return f"an object of type {type(image).__name__}"


def pixel_input_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """The same preprocessing with uint8 NHWC pixels handed to the engine, which does
    rescale, normalize, layout and cast at the head of its graph (4x fewer bytes through
    PCIe and over the wire than float32)."""
    return {**spec, "layout": "NHWC", "dtype": "uint8",
            "in_engine": ["rescale", "normalize", "layout", "cast"]}


def spec_from_timm_config(cfg: dict[str, Any], input_name: str) -> dict[str, Any]:
    """The spec that reproduces timm's eval transform for a resolved data config.

    ``cfg`` is what ``timm.data.resolve_data_config`` returns (``input_size``,
    ``interpolation``, ``crop_pct``, ``crop_mode``, ``mean``, ``std``); it is passed in as
    a plain dict so that this module never imports timm. The resize size is
    ``floor(img_size / crop_pct)``, exactly as timm's ``transforms_imagenet_eval``. Only
    timm's "center" crop mode maps onto the spec; the others are refused.
    """
    try:
        channels, height, width = (int(v) for v in cfg["input_size"])
    except (KeyError, TypeError, ValueError):
        raise PreprocessError(
            f"timm data config has no usable input_size (got {cfg.get('input_size')!r}); "
            "expected (3, height, width)") from None
    if channels != 3:
        raise PreprocessError(f"timm data config input_size has {channels} channels; the spec decodes RGB (3)")
    crop_mode = cfg.get("crop_mode") or "center"
    if crop_mode != "center":
        raise PreprocessError(
            f"timm crop_mode {crop_mode!r} is not supported: the preprocessing spec only "
            "expresses 'center' (resize the shorter edge, then center crop)")
    if cfg.get("crop_border_pixels"):
        raise PreprocessError("timm crop_border_pixels is not supported by the preprocessing spec")
    crop_pct = cfg.get("crop_pct") or _TIMM_DEFAULT_CROP_PCT
    scale_h, scale_w = math.floor(height / crop_pct), math.floor(width / crop_pct)
    if scale_h != scale_w:
        raise PreprocessError(
            f"timm input_size {height}x{width} with crop_pct {crop_pct} resizes to "
            f"{scale_h}x{scale_w} keeping the ratio (timm's ResizeKeepRatio), which the spec "
            "does not express; only square resize sizes are supported")
    interpolation = cfg.get("interpolation") or "bilinear"
    if interpolation not in _RESAMPLE:
        raise PreprocessError(
            f"timm interpolation {interpolation!r} is not supported; use one of {sorted(_RESAMPLE)}")
    mean = [float(v) for v in cfg.get("mean", ())]
    std = [float(v) for v in cfg.get("std", ())]
    if len(mean) != 3 or len(std) != 3:
        raise PreprocessError(f"timm data config needs 3 mean and 3 std values, got {mean} and {std}")
    return {
        "spec_version": 1,
        "decode": {"mode": "RGB"},
        "resize": {"size": scale_h, "edge": "shorter", "interpolation": interpolation, "antialias": True},
        "center_crop": {"height": height, "width": width},
        "rescale": {"factor": 1.0 / 255.0},
        "normalize": {"mean": mean, "std": std},
        "layout": "NCHW",
        "dtype": "float32",
        "input": input_name,
    }
