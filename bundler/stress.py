"""A fixed set of stress inputs: the inputs where low precision breaks first.

Reduced-precision engines (fp16 overflow, FP8 saturation at +-448 times the scale) go
wrong on inputs far from the calibration data: constant images (every activation of a
channel equal), channels pinned to the ends of the range, high-frequency patterns,
amplitudes beyond what any real image preprocesses to. `bundle eval` and `bundle study`
count NaN/Inf on this set and compare it with the fp32 reference, so that a bundle that
is fine on photographs but produces Inf on a white frame is caught.

The inputs are in the model's preprocessed space (NCHW float32), so they are fed to the
engine directly. "min" and "max" of a channel are what a black (0) and a white (255) pixel
preprocess to under the bundle's spec (rescale, then normalize); without a spec they are
-1 and +1 (the timm Inception-style normalization, mean = std = 0.5). Deterministic: the
same shape and spec give the same bytes (the noise is seeded).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Seed of the large-amplitude noise input (fixed: the set must be the same everywhere).
NOISE_SEED = 20_240_607
#: Amplitude of the noise input: well beyond the normalized range of any real image.
NOISE_AMPLITUDE = 10.0
#: Square sizes (pixels) of the two checkerboards: the highest frequency, and a coarse one.
CHECKER_SIZES = (1, 16)
MID_GRAY = 128


@dataclass(frozen=True)
class StressSet:
    """Named stress inputs; `inputs[i]` is the input called `names[i]`."""

    names: tuple[str, ...]
    inputs: np.ndarray  # float32 [N, C, H, W], or uint8 [N, H, W, C] (stress_pixels)

    def __len__(self) -> int:
        return len(self.names)


def channel_range(channels: int, spec: dict | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel (min, max): what pixel values 0 and 255 preprocess to under `spec`."""
    if spec is None:
        return np.full(channels, -1.0), np.full(channels, 1.0)
    return _pixel_value(0.0, channels, spec), _pixel_value(255.0, channels, spec)


def _pixel_value(pixel: float, channels: int, spec: dict) -> np.ndarray:
    factor = float((spec.get("rescale") or {}).get("factor", 1.0))
    norm = spec.get("normalize") or {}
    mean = np.asarray(norm.get("mean", [0.0] * channels), dtype=np.float64)
    std = np.asarray(norm.get("std", [1.0] * channels), dtype=np.float64)
    return (pixel * factor - mean) / std


def _checkerboard(h: int, w: int, size: int) -> np.ndarray:
    """1.0 where (row // size + col // size) is even, else 0.0; [H, W]."""
    yy, xx = np.mgrid[0:h, 0:w]
    return (((yy // size) + (xx // size)) % 2 == 0).astype(np.float64)


def stress_inputs(shape: tuple[int, int, int], spec: dict | None = None) -> StressSet:
    """The stress set for an input of shape (C, H, W), in preprocessed space.

    zeros, ones, minus_ones: constant tensors of 0, +1, -1.
    saturated_c<k>: channel k at its max, every other channel at its min.
    noise_pm10: uniform noise in [-10, 10] (seeded), beyond the normalized range.
    checker_<s>px: a checkerboard of s x s squares alternating max and min (all channels).
    mid_gray: a constant gray image (pixel 128 preprocessed).
    bright_pixel: black (min) everywhere except one pixel at the centre at max.
    """
    c, h, w = (int(v) for v in shape)
    lo, hi = channel_range(c, spec)
    lo_img = np.broadcast_to(lo[:, None, None], (c, h, w))
    hi_img = np.broadcast_to(hi[:, None, None], (c, h, w))
    items: list[tuple[str, np.ndarray]] = [
        ("zeros", np.zeros((c, h, w))),
        ("ones", np.ones((c, h, w))),
        ("minus_ones", -np.ones((c, h, w))),
    ]
    for k in range(c):
        img = lo_img.copy()
        img[k] = hi[k]
        items.append((f"saturated_c{k}", img))
    rng = np.random.default_rng(NOISE_SEED)
    items.append((f"noise_pm{NOISE_AMPLITUDE:g}",
                  rng.uniform(-NOISE_AMPLITUDE, NOISE_AMPLITUDE, (c, h, w))))
    for size in CHECKER_SIZES:
        board = _checkerboard(h, w, size)[None]
        items.append((f"checker_{size}px", lo_img + (hi_img - lo_img) * board))
    gray = _pixel_value(MID_GRAY, c, spec) if spec is not None else np.full(c, MID_GRAY / 127.5 - 1)
    items.append(("mid_gray", np.broadcast_to(gray[:, None, None], (c, h, w))))
    bright = lo_img.copy()
    bright[:, h // 2, w // 2] = hi
    items.append(("bright_pixel", bright))
    names = tuple(name for name, _ in items)
    inputs = np.stack([img for _, img in items]).astype(np.float32)
    return StressSet(names, inputs)


def stress_set(shape: tuple[int, int, int], spec: dict | None) -> StressSet:
    """The stress set of an input of ``shape`` under preprocessing ``spec``: pixels
    (`stress_pixels`, shape (H, W, C)) where the spec hands the engine uint8 pixels, else
    preprocessed tensors (`stress_inputs`, shape (C, H, W))."""
    if spec and spec.get("dtype") == "uint8":
        return stress_pixels(shape)
    return stress_inputs(shape, spec)


def stress_pixels(shape: tuple[int, int, int]) -> StressSet:
    """The stress set of a uint8-input bundle, as pixels (N, H, W, C): the engine's input
    domain is 0..255, so only the pixel-expressible cases apply: black and white frames,
    each channel saturated, the checkerboards, mid gray, one bright pixel, and uniform
    noise over the whole range (seeded)."""
    h, w, c = (int(v) for v in shape)
    items: list[tuple[str, np.ndarray]] = [
        ("black", np.zeros((h, w, c))),
        ("white", np.full((h, w, c), 255.0)),
    ]
    for k in range(c):
        img = np.zeros((h, w, c))
        img[..., k] = 255
        items.append((f"saturated_c{k}", img))
    rng = np.random.default_rng(NOISE_SEED)
    items.append(("noise_0_255", rng.integers(0, 256, (h, w, c)).astype(np.float64)))
    for size in CHECKER_SIZES:
        items.append((f"checker_{size}px", 255.0 * _checkerboard(h, w, size)[..., None]
                      * np.ones(c)))
    items.append(("mid_gray", np.full((h, w, c), float(MID_GRAY))))
    bright = np.zeros((h, w, c))
    bright[h // 2, w // 2, :] = 255
    items.append(("bright_pixel", bright))
    names = tuple(name for name, _ in items)
    return StressSet(names, np.stack([img for _, img in items]).astype(np.uint8))
