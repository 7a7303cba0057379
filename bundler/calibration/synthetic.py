"""Seeded synthetic calibration images for ``--random-weights`` builds without data.

Why structured and not white noise: activations of a conv net on white noise have
statistics unlike those of pictures (no large smooth regions, no edges), so scales from
noise would exercise the pipeline but calibrate nothing like a real image. Each image
here is a smooth colour gradient, a low-frequency wave, a few flat rectangles and discs
(edges), and mild noise, as uint8 RGB, made from its own seed ``(seed, index)`` so that any
item can be regenerated alone and the set is the same on every run.

``GENERATOR_VERSION`` is part of the source string and digest: change it whenever the
pictures change, so that metadata never claims the same data for different images.
"""

from __future__ import annotations

import numpy as np

GENERATOR_VERSION = 1


def synthetic_image(height: int, width: int, seed: int, index: int) -> np.ndarray:
    """One synthetic picture, uint8 HWC RGB, deterministic in ``(seed, index)``."""
    rng = np.random.default_rng([seed, index])
    yy, xx = np.meshgrid(
        np.linspace(0.0, 1.0, height, dtype=np.float32),
        np.linspace(0.0, 1.0, width, dtype=np.float32),
        indexing="ij",
    )
    image = np.empty((height, width, 3), dtype=np.float32)
    for c in range(3):
        gx, gy, base = rng.uniform(-0.6, 0.6), rng.uniform(-0.6, 0.6), rng.uniform(0.2, 0.8)
        fx, fy, phase = rng.uniform(0.5, 4.0), rng.uniform(0.5, 4.0), rng.uniform(0, 2 * np.pi)
        wave = 0.15 * np.sin(2 * np.pi * (fx * xx + fy * yy) + phase)
        image[..., c] = base + gx * (xx - 0.5) + gy * (yy - 0.5) + wave
    for _ in range(int(rng.integers(2, 6))):
        colour = rng.uniform(0.0, 1.0, 3).astype(np.float32)
        y0, x0 = rng.uniform(0, 0.8, 2)
        h, w = rng.uniform(0.1, 0.5, 2)
        if rng.random() < 0.5:
            mask = (yy >= y0) & (yy < y0 + h) & (xx >= x0) & (xx < x0 + w)
        else:
            mask = ((yy - y0 - h / 2) / (h / 2)) ** 2 + ((xx - x0 - w / 2) / (w / 2)) ** 2 <= 1
        image[mask] = colour
    image += rng.normal(0.0, 0.03, image.shape).astype(np.float32)
    return (np.clip(image, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)


def describe(shape: tuple[int, int, int], count: int, seed: int) -> str:
    """The source string recorded in calibration metadata."""
    c, h, w = shape
    return f"synthetic:v{GENERATOR_VERSION}:seed={seed}:shape={c}x{h}x{w}:count={count}"
