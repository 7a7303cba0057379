"""Preprocessing throughput: runtime_py's Preprocessor vs timm's own eval transform.

Boundary of both figures: JPEG file path in -> normalized float32 (3, H, W) array out,
one image per call, on one thread of this process (decode + RGB convert + resize + crop
+ normalize). timm's side is what timm's datasets and inference script do per image:
``transform(Image.open(path).convert("RGB"))``, with the transform from
``create_transform(**resolve_data_config({}, model=...), is_training=False)``.
Both run over the same JPEG files in one loop, alternating per image (A B, then B A),
so that load from other processes on a shared machine hits both; each repeat gives
one rate per side and the median over repeats is reported.

The JPEGs are real photographs (scikit-image's bundled data, needs scikit-image
installed) re-encoded at ImageNet-like sizes into a temporary folder.

    python benchmarks/preprocess_bench.py [--model xception41.tf_in1k] [--repeats 7]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import tempfile
import time
from pathlib import Path

from PIL import Image

PHOTOS = ["astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg", "motorcycle_left.png",
          "hubble_deep_field.jpg", "retina.jpg", "ihc.png"]
SIZES = [(500, 375), (375, 500), (500, 333), (640, 480), (800, 600), (1024, 768)]


def make_jpegs(folder: Path) -> list[Path]:
    """Re-encode the photographs at each size as JPEG quality 90 (like typical datasets)."""
    spec = importlib.util.find_spec("skimage")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("the benchmark needs scikit-image (its bundled photographs): pip install scikit-image")
    data = Path(spec.submodule_search_locations[0]) / "data"
    paths = []
    for name in PHOTOS:
        photo = Image.open(data / name).convert("RGB")
        for w, h in SIZES:
            path = folder / f"{Path(name).stem}_{w}x{h}.jpg"
            photo.resize((w, h), Image.Resampling.LANCZOS).save(path, "JPEG", quality=90)
            paths.append(path)
    return paths


def interleaved_rates(fn_a, fn_b, paths: list[Path]) -> tuple[float, float]:
    """images/s of each function over the same files, alternating A/B on every image
    (and which goes first), so that load from other processes lands on both sides."""
    spent = [0.0, 0.0]
    clock = time.perf_counter
    for i, path in enumerate(paths):
        order = (0, 1) if i % 2 == 0 else (1, 0)
        for side in order:
            fn = fn_a if side == 0 else fn_b
            start = clock()
            fn(path)
            spent[side] += clock() - start
    return len(paths) / spent[0], len(paths) / spent[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="xception41.tf_in1k")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads for timm's side (default 1: both single-threaded)")
    args = parser.parse_args()

    import timm
    import timm.data
    import torch

    from runtime_py.preprocess import Preprocessor, spec_from_timm_config

    torch.set_num_threads(args.threads)
    model = timm.create_model(args.model, pretrained=False)
    cfg = timm.data.resolve_data_config({}, model=model)
    transform = timm.data.create_transform(**cfg, is_training=False)
    pre = Preprocessor(spec_from_timm_config(cfg, "input"))

    def timm_one(path):
        return transform(Image.open(path).convert("RGB"))

    with tempfile.TemporaryDirectory() as tmp:
        paths = make_jpegs(Path(tmp))
        interleaved_rates(pre, timm_one, paths)     # warm-up: file cache, allocator, lazy imports
        ours, theirs = [], []
        for _ in range(args.repeats):
            a, b = interleaved_rates(pre, timm_one, paths)
            ours.append(a)
            theirs.append(b)

    ours_med, theirs_med = statistics.median(ours), statistics.median(theirs)
    print(f"model {args.model}: {cfg}")
    print(f"{len(paths)} JPEGs ({len(PHOTOS)} photographs x {len(SIZES)} sizes), "
          f"alternating per image, median of {args.repeats} repeats; torch threads {torch.get_num_threads()}")
    print("boundary: JPEG path -> normalized float32 (3,H,W), one image per call, this thread")
    print(f"runtime_py Preprocessor : {ours_med:8.1f} images/s")
    print(f"timm eval transform     : {theirs_med:8.1f} images/s")
    print(f"ratio (target >= 1.0)   : {ours_med / theirs_med:8.3f}")


if __name__ == "__main__":
    main()
