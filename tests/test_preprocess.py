"""Preprocessing: the spec, its runtime implementation, and parity with timm's eval transform.

Every parity case is a real photograph: scikit-image ships a few inside its wheel
(``skimage/data``); they are re-encoded here into tmp_path at several sizes, aspect
ratios and modes. The reference is what timm does per image:
``create_transform(**resolve_data_config({}, model=m), is_training=False)`` applied to
``Image.open(path).convert("RGB")``.
"""

from __future__ import annotations

import importlib.util
import io
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from runtime_py.errors import PreprocessError
from runtime_py.preprocess import Preprocessor, spec_from_timm_config

TOLERANCE = 1e-5
XCEPTION = "xception41.tf_in1k"


def _skimage_data() -> Path | None:
    # find_spec does not import skimage (and its scipy stack): we only read its data files.
    spec = importlib.util.find_spec("skimage")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(spec.submodule_search_locations[0]) / "data"
    return folder if (folder / "astronaut.png").is_file() else None


PHOTO_DIR = _skimage_data()
needs_photos = pytest.mark.skipif(
    PHOTO_DIR is None,
    reason="needs scikit-image installed (test dependency): its wheel ships the real "
           "photographs used as the parity corpus (pip install scikit-image)")


def xception_spec(input_name: str = "input") -> dict:
    """The spec of the family, written out (what spec_from_timm_config must produce)."""
    return {
        "spec_version": 1,
        "decode": {"mode": "RGB"},
        "resize": {"size": 331, "edge": "shorter", "interpolation": "bicubic", "antialias": True},
        "center_crop": {"height": 299, "width": 299},
        "rescale": {"factor": 1 / 255},
        "normalize": {"mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5]},
        "layout": "NCHW",
        "dtype": "float32",
        "input": input_name,
    }


# --- the corpus: real photographs, re-encoded -------------------------------------------

def _photo(name: str) -> Image.Image:
    return Image.open(PHOTO_DIR / name)


def _save(img: Image.Image, path: Path, fmt: str, **kw) -> Path:
    img.save(path, fmt, **kw)
    return path


def _build_corpus(folder: Path) -> dict[str, Path]:
    cases: dict[str, Path] = {}
    rgb = {n: _photo(n).convert("RGB") for n in ("astronaut.png", "chelsea.png", "coffee.png",
                                                  "rocket.jpg", "motorcycle_left.png")}
    sizes = [(500, 375), (375, 500), (1024, 200), (200, 1024), (120, 90), (331, 331),
             (299, 299), (640, 427), (333, 500), (1000, 750)]
    for name, img in rgb.items():
        stem = Path(name).stem
        for w, h in sizes:
            key = f"{stem}-rgb-{w}x{h}.jpg"
            cases[key] = _save(img.resize((w, h), Image.Resampling.LANCZOS), folder / key, "JPEG", quality=90)
    # the bundled files as they are (PNG and JPEG, their own sizes)
    for name in ("astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg", "hubble_deep_field.jpg",
                 "camera.png", "moon.png", "horse.png"):
        cases[f"bundled-{name}"] = PHOTO_DIR / name
    # grayscale (mode L): native gray photographs and converted colour ones
    gray = {"camera": _photo("camera.png"), "moon": _photo("moon.png"), "coins": _photo("coins.png"),
            "coffee": rgb["coffee.png"].convert("L")}
    for stem, img in gray.items():
        for w, h in [(500, 375), (375, 500), (120, 90), (1024, 200)]:
            key = f"{stem}-gray-{w}x{h}.jpg"
            cases[key] = _save(img.resize((w, h), Image.Resampling.LANCZOS), folder / key, "JPEG", quality=90)
        cases[f"{stem}-gray.png"] = _save(img, folder / f"{stem}-gray.png", "PNG")
    # RGBA PNG: a photograph with a real alpha gradient
    for stem in ("chelsea", "astronaut"):
        img = rgb[f"{stem}.png"].resize((500, 375))
        alpha = Image.linear_gradient("L").resize(img.size)
        rgba = img.copy()
        rgba.putalpha(alpha)
        cases[f"{stem}-rgba.png"] = _save(rgba, folder / f"{stem}-rgba.png", "PNG")
    # palette (P), with and without a transparent index; LA; CMYK JPEG; 16-bit gray PNG
    pal = rgb["coffee.png"].resize((375, 500)).convert("P", palette=Image.Palette.ADAPTIVE, colors=200)
    cases["coffee-palette.png"] = _save(pal, folder / "coffee-palette.png", "PNG")
    cases["coffee-palette-trns.png"] = _save(pal, folder / "coffee-palette-trns.png", "PNG", transparency=0)
    cases["coffee-palette.gif"] = _save(pal, folder / "coffee-palette.gif", "GIF")
    cases["camera-la.png"] = _save(gray["camera"].convert("LA"), folder / "camera-la.png", "PNG")
    cases["rocket-cmyk.jpg"] = _save(rgb["rocket.jpg"].convert("CMYK"), folder / "rocket-cmyk.jpg", "JPEG",
                                     quality=90)
    g16 = Image.fromarray((np.asarray(gray["moon"], dtype=np.uint16) * 257))
    cases["moon-16bit.png"] = _save(g16, folder / "moon-16bit.png", "PNG")
    cases["astronaut.webp"] = _save(rgb["astronaut.png"], folder / "astronaut.webp", "WEBP", quality=90)
    return cases


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, Path]:
    if PHOTO_DIR is None:
        pytest.skip("needs scikit-image installed (test dependency) for its bundled photographs")
    return _build_corpus(tmp_path_factory.mktemp("photos"))


@pytest.fixture(scope="module")
def timm_eval():
    """(data config, eval transform) of the family's timm model, weights not needed."""
    timm = pytest.importorskip("timm", reason="parity needs timm (export extra) as the reference")
    import timm.data

    model = timm.create_model(XCEPTION, pretrained=False)
    cfg = timm.data.resolve_data_config({}, model=model)
    return cfg, timm.data.create_transform(**cfg, is_training=False)


def _timm_reference(transform, path: Path) -> np.ndarray:
    with Image.open(path) as img:
        return transform(img.convert("RGB")).numpy()


# --- parity ------------------------------------------------------------------------------

@needs_photos
def test_parity_with_timm_eval_transform(corpus, timm_eval):
    cfg, transform = timm_eval
    pre = Preprocessor(spec_from_timm_config(cfg, "input"))
    diffs = {}
    for key, path in corpus.items():
        ours = pre(path)
        ref = _timm_reference(transform, path)
        assert ours.shape == ref.shape == (3, 299, 299), key
        diffs[key] = float(np.abs(ours - ref).max())
    worst = max(diffs, key=diffs.get)
    print("\nmax abs diff per case:\n" + "\n".join(f"  {k}: {v:.3g}" for k, v in sorted(diffs.items())))
    assert diffs[worst] <= TOLERANCE, f"{worst}: max abs diff {diffs[worst]}"
    assert len(diffs) >= 60


@needs_photos
@pytest.mark.parametrize("interpolation", ["bicubic", "bilinear", "nearest", "lanczos"])
@pytest.mark.parametrize("size,crop", [(256, (224, 224)), (200, (224, 224)), (240, (200, 230))])
def test_parity_with_torchvision_other_specs(interpolation, size, crop):
    """Other interpolations, ImageNet mean/std, non-square crops, and crops larger than the
    resized image (torchvision pads with zeros)."""
    T = pytest.importorskip("torchvision.transforms", reason="reference needs torchvision")
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    spec = xception_spec()
    spec["resize"].update(size=size, interpolation=interpolation)
    spec["center_crop"] = {"height": crop[0], "width": crop[1]}
    spec["normalize"] = {"mean": mean, "std": std}
    ref_t = T.Compose([T.Resize(size, interpolation=T.InterpolationMode(interpolation)),
                       T.CenterCrop(crop), T.ToTensor(), T.Normalize(mean, std)])
    pre = Preprocessor(spec)
    photo = _photo("chelsea.png").convert("RGB")
    for w, h in [(451, 300), (300, 451), (203, 517), (517, 203), (90, 120)]:
        img = photo.resize((w, h))
        diff = np.abs(pre(img) - ref_t(img).numpy()).max()
        assert diff <= TOLERANCE, (w, h, diff)


@needs_photos
def test_path_bytes_and_pil_give_identical_tensors(corpus):
    pre = Preprocessor(xception_spec())
    for key in ("chelsea-rgb-500x375.jpg", "camera-gray-375x500.jpg", "chelsea-rgba.png",
                "coffee-palette.png"):
        path = corpus[key]
        data = path.read_bytes()
        with Image.open(path) as img:
            from_pil = pre(img)
        for other in (pre(str(path)), pre(data), pre(bytearray(data)), pre(memoryview(data))):
            assert np.array_equal(from_pil, other), key
        assert np.array_equal(pre(path), from_pil)


@needs_photos
def test_batch_shape_dtype_and_slots(corpus):
    pre = Preprocessor(xception_spec())
    items = [corpus["astronaut-rgb-500x375.jpg"], corpus["moon-gray-120x90.jpg"].read_bytes(),
             _photo("coffee.png")]
    out = pre.batch(items)
    assert out.shape == (3, 3, 299, 299) and out.dtype == np.float32 and out.flags.c_contiguous
    for i, item in enumerate(items):
        assert np.array_equal(out[i], pre(item))
    single = pre(items[0])
    assert single.shape == pre.output_shape == (3, 299, 299) and single.dtype == np.float32
    assert pre.batch([]).shape == (0, 3, 299, 299)


@needs_photos
def test_batch_error_names_the_image(corpus):
    pre = Preprocessor(xception_spec())
    with pytest.raises(PreprocessError, match=r"image 1 of the batch.*not an image"):
        pre.batch([corpus["astronaut-rgb-500x375.jpg"], b"not an image at all"])


# --- spec from timm's config -------------------------------------------------------------

def test_spec_from_timm_config_xception():
    cfg = {"input_size": (3, 299, 299), "interpolation": "bicubic", "mean": (0.5, 0.5, 0.5),
           "std": (0.5, 0.5, 0.5), "crop_pct": 0.903, "crop_mode": "center"}
    assert spec_from_timm_config(cfg, "input") == xception_spec()


@pytest.mark.parametrize("model_name", [XCEPTION, "resnet50.a1_in1k", "vit_base_patch16_224.augreg_in21k_ft_in1k",
                                        "convnext_tiny.fb_in1k", "efficientnet_b0.ra_in1k"])
def test_spec_resize_matches_timm_transform(model_name):
    """floor(img_size / crop_pct) as timm computes it, checked against timm's own Resize."""
    timm = pytest.importorskip("timm", reason="needs timm as the reference")
    import timm.data

    cfg = timm.data.resolve_data_config({}, model=timm.create_model(model_name, pretrained=False))
    resize, crop = timm.data.create_transform(**cfg, is_training=False).transforms[:2]
    spec = spec_from_timm_config(cfg, "x")
    assert spec["resize"]["size"] == resize.size
    assert (spec["center_crop"]["height"], spec["center_crop"]["width"]) == tuple(crop.size)
    assert spec["resize"]["interpolation"] == resize.interpolation.value
    Preprocessor(spec)  # valid against the schema


def test_spec_from_timm_config_defaults_and_refusals():
    base = {"input_size": (3, 224, 224), "interpolation": "bilinear", "mean": (0.1, 0.2, 0.3),
            "std": (0.4, 0.5, 0.6), "crop_pct": None, "crop_mode": None}
    spec = spec_from_timm_config(base, "pixels")
    assert spec["resize"]["size"] == 256 and spec["input"] == "pixels"  # crop_pct None -> 0.875
    with pytest.raises(PreprocessError, match="crop_mode 'squash' is not supported"):
        spec_from_timm_config({**base, "crop_mode": "squash"}, "x")
    with pytest.raises(PreprocessError, match="crop_mode 'border'"):
        spec_from_timm_config({**base, "crop_mode": "border"}, "x")
    with pytest.raises(PreprocessError, match="ResizeKeepRatio"):
        spec_from_timm_config({**base, "input_size": (3, 224, 320), "crop_pct": 0.9}, "x")
    with pytest.raises(PreprocessError, match="interpolation 'random'"):
        spec_from_timm_config({**base, "interpolation": "random"}, "x")
    with pytest.raises(PreprocessError, match="channels"):
        spec_from_timm_config({**base, "input_size": (1, 224, 224)}, "x")


def test_preprocess_module_stays_light():
    code = ("import sys, runtime_py.preprocess; "
            "bad = [m for m in ('torch', 'timm', 'torchvision', 'bundler') if m in sys.modules]; "
            "print('imported:', bad); sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=Path(__file__).resolve().parent.parent)
    assert result.returncode == 0, result.stderr or result.stdout


# --- spec validation ---------------------------------------------------------------------

@pytest.mark.parametrize("mutate,expected", [
    (lambda s: s.pop("normalize"), "'normalize' is a required property"),
    (lambda s: s.update(extra=1), "Additional properties"),
    (lambda s: s["resize"].update(interpolation="cubic"), "resize/interpolation"),
    (lambda s: s["resize"].update(edge="longer"), "resize/edge"),
    (lambda s: s["resize"].update(size=0), "resize/size"),
    (lambda s: s["resize"].update(max_size=512), "resize: Additional properties"),
    (lambda s: s["normalize"].update(std=[0.5, 0.0, 0.5]), "normalize/std/1"),
    (lambda s: s["normalize"].update(mean=[0.5, 0.5]), "normalize/mean"),
    (lambda s: s.update(layout="NHWC"), "layout"),
    (lambda s: s.update(dtype="float16"), "dtype"),
    (lambda s: s.update(spec_version=2), "spec_version"),
    (lambda s: s["decode"].update(mode="L"), "decode/mode"),
    (lambda s: s["rescale"].update(factor="1/255"), "rescale/factor"),
    (lambda s: s.update(input=""), "input"),
])
def test_invalid_specs_are_refused(mutate, expected):
    spec = xception_spec()
    mutate(spec)
    with pytest.raises(PreprocessError, match="invalid preprocessing spec") as info:
        Preprocessor(spec)
    assert expected in str(info.value)


def test_spec_validation_lists_every_problem():
    spec = xception_spec()
    spec["layout"] = "NHWC"
    spec["center_crop"]["width"] = -1
    del spec["input"]
    with pytest.raises(PreprocessError) as info:
        Preprocessor(spec)
    assert len(info.value.problems) == 3


def test_antialias_false_is_refused_with_the_reason():
    spec = xception_spec()
    spec["resize"]["antialias"] = False
    with pytest.raises(PreprocessError, match="PIL always antialiases"):
        Preprocessor(spec)


# --- decode errors -----------------------------------------------------------------------

def _jpeg_bytes(size=(500, 375)) -> bytes:
    buf = io.BytesIO()
    img = _photo("chelsea.png").convert("RGB").resize(size) if PHOTO_DIR else Image.new("RGB", size, "gray")
    img.save(buf, "JPEG", quality=90)
    return buf.getvalue()


def test_decode_errors_name_the_input(tmp_path):
    pre = Preprocessor(xception_spec())
    garbage = tmp_path / "garbage.jpg"
    garbage.write_bytes(b"\x00\x01not an image" * 100)
    truncated = tmp_path / "truncated.jpg"
    truncated.write_bytes(_jpeg_bytes()[:3000])
    empty = tmp_path / "empty.png"
    empty.write_bytes(b"")
    cases = {
        garbage: "garbage.jpg.*not an image in a supported format",
        truncated: "truncated.jpg.*truncated",
        empty: "empty.png.*not an image",
        tmp_path: "is a directory",
        tmp_path / "missing.jpg": "missing.jpg.*no such file",
    }
    for path, pattern in cases.items():
        with pytest.raises(PreprocessError, match=pattern):
            pre(path)
        with pytest.raises(PreprocessError, match=pattern):
            pre(str(path))
    with pytest.raises(PreprocessError, match=r"image bytes \(0 bytes\).*not an image"):
        pre(b"")
    with pytest.raises(PreprocessError, match=r"image bytes \(3000 bytes\).*truncated"):
        pre(_jpeg_bytes()[:3000])


def test_unsupported_inputs(tmp_path):
    pre = Preprocessor(xception_spec())
    with pytest.raises(PreprocessError, match="zero size"):
        pre(Image.new("RGB", (0, 10)))
    with pytest.raises(PreprocessError, match="type int.*file path, the encoded bytes or a PIL image"):
        pre(42)
    # A real format that is not in the allowed list (PIL would otherwise open it).
    tga = tmp_path / "photo.tga"
    Image.new("RGB", (50, 40), "red").save(tga, "TGA")
    with pytest.raises(PreprocessError, match="photo.tga.*supported format.*JPEG"):
        pre(tga)
    assert pre.__class__(xception_spec(), formats=None)(tga).shape == (3, 299, 299)


# --- decompression-bomb safety -------------------------------------------------------------

def _png_header_only(width: int, height: int) -> bytes:
    """A PNG that claims width x height 8-bit RGB with no pixel data: opening it reads only
    the header, so the check must happen before any decoding allocates."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b"")


def test_pixel_limit_is_an_explicit_error():
    pre = Preprocessor(xception_spec(), max_pixels=160_000)
    with pytest.raises(PreprocessError, match=r"500x375 = 187500 pixels is over the limit of 160000"):
        pre(_jpeg_bytes((500, 375)))
    assert pre(_jpeg_bytes((400, 300))).shape == (3, 299, 299)


def test_decompression_bomb_refused_from_the_header():
    pre = Preprocessor(xception_spec())  # default limit: PIL's Image.MAX_IMAGE_PIXELS
    assert pre.max_pixels == Image.MAX_IMAGE_PIXELS
    with pytest.raises(PreprocessError, match="refusing image bytes"):
        pre(_png_header_only(30000, 30000))        # over 2x PIL's limit: PIL's own error
    with pytest.warns(Image.DecompressionBombWarning), \
            pytest.raises(PreprocessError, match="over the limit"):
        pre(_png_header_only(10000, 10000))        # between 1x and 2x: PIL only warns, we refuse


def test_extreme_aspect_ratio_refused_before_resizing():
    buf = io.BytesIO()
    Image.new("L", (20000, 1)).save(buf, "PNG")    # 20000 pixels, but 6.6M x 331 once resized
    with pytest.raises(PreprocessError, match="extreme aspect ratio"):
        Preprocessor(xception_spec())(buf.getvalue())
