"""FP8 calibration: data selection, one-pass statistics, calibrators, stored scales."""

from __future__ import annotations

import hashlib
import io
import math
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

from bundler.calibration import calibrators as cal
from bundler.calibration.collect import calibrate, collect_statistics, result_from_statistics
from bundler.calibration.data import open_calibration_data, synthetic_calibration_set
from bundler.fp8 import fake_quantize, fp8_e4m3_round
from bundler.calibration.histogram import TensorStats
from bundler.calibration.store import calibration_from_safetensors, calibration_to_safetensors
from runtime_py.errors import BundleFormatError, CalibrationError, UsageError

PIL = pytest.importorskip("PIL.Image")


# --- fixtures ------------------------------------------------------------------------

def tiny_preprocess(image) -> np.ndarray:
    """Stand-in for the runtime's Preprocessor: fixed 8x8, [0,1], CHW float32."""
    return np.asarray(image.resize((8, 8)), dtype=np.float32).transpose(2, 0, 1) / 255.0


def png_bytes(seed: int, size: tuple[int, int] = (12, 10), fmt: str = "PNG") -> bytes:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    buffer = io.BytesIO()
    PIL.fromarray(pixels).save(buffer, format=fmt)
    return buffer.getvalue()


def write_tar(path: Path, members: list[tuple[str, bytes]]) -> Path:
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture
def image_folder(tmp_path: Path) -> Path:
    root = tmp_path / "imgs"
    for c, cls in enumerate(["cat", "ant", "bee"]):
        (root / cls).mkdir(parents=True)
        for k in range(3):
            (root / cls / f"{k}.png").write_bytes(png_bytes(10 * c + k))
    (root / "ant" / ".hidden.png").write_bytes(b"not an image")
    (root / "ant" / "notes.txt").write_text("ignored")
    return root


def conv_model(planted: float | None = None):
    """x -> Conv3x3 -> c1 -> Relu -> r1 -> Conv1x1 -> c2 -> Relu -> y (fp32, dynamic batch)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    w2 = rng.standard_normal((5, 4, 1, 1)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["c1"], ["r1"]),
            helper.make_node("Conv", ["r1", "w2"], ["c2"]),
            helper.make_node("Relu", ["c2"], ["y"]),
        ],
        "toy",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5, 8, 8])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")],
    )
    return onnx.helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)]), w1, w2


def reference_activations(x: np.ndarray, w1: np.ndarray, w2: np.ndarray) -> dict[str, np.ndarray]:
    """Plain numpy forward pass of conv_model."""
    n = x.shape[0]
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    patches = np.stack(
        [padded[:, :, i : i + 8, j : j + 8] for i in range(3) for j in range(3)], axis=2
    )  # N, C, 9, 8, 8
    c1 = np.einsum("nckhw,ock->nohw", patches, w1.reshape(4, 3, 9))
    r1 = np.maximum(c1, 0)
    c2 = np.einsum("ncij,oc->noij", r1, w2.reshape(5, 4))
    assert c1.shape == (n, 4, 8, 8)
    return {"c1": c1, "r1": r1, "c2": c2}


def stats_from(hist, bin_width: float, amax: float) -> TensorStats:
    hist = np.asarray(hist, dtype=np.int64)
    s = TensorStats("t", bins=len(hist), hist=hist.copy(), range=bin_width * len(hist), amax=amax)
    s.count = int(hist.sum())
    return s


# --- FP8 helper ----------------------------------------------------------------------

def _enumerate_e4m3() -> np.ndarray:
    """All non-negative finite E4M3FN values, enumerated from the format's definition."""
    sub = [m / 8 * 2.0**-6 for m in range(8)]
    normal = [(1 + m / 8) * 2.0 ** (e - 7) for e in range(1, 16) for m in range(8)]
    return np.array(sorted(set(sub + normal[:-1])))  # e=15, m=7 is NaN in E4M3FN


_GRID = _enumerate_e4m3()
_GRID_INDEX = {float(v): i for i, v in enumerate(_GRID)}


def e4m3_grid() -> np.ndarray:
    return _GRID


def reference_round(x: float) -> float:
    """Round-to-nearest-even onto the enumerated grid, saturating at 448."""
    grid = e4m3_grid()
    a = min(abs(x), 448.0)
    k = int(np.searchsorted(grid, a))
    if k < len(grid) and grid[k] == a:
        r = a
    else:
        lo, hi = grid[k - 1], grid[k]
        if a - lo < hi - a:
            r = lo
        elif hi - a < a - lo:
            r = hi
        else:  # tie: the one with an even mantissa (even index in the grid)
            r = lo if (k - 1) % 2 == 0 else hi
    return math.copysign(r, x)


def test_e4m3_grid_has_127_levels_up_to_448():
    grid = e4m3_grid()
    assert len(grid) == 127 and grid[-1] == 448.0 and grid[1] == 2.0**-9


@pytest.mark.parametrize(
    "x, expected",
    [(1.0625, 1.0), (1.1875, 1.25), (448.0, 448.0), (464.0, 448.0), (1e6, 448.0), (-500.0, -448.0),
     (2.0**-10, 0.0), (3 * 2.0**-10, 2.0**-8), (0.3, 0.3125), (-2.3, -2.25)],
)
def test_fp8_round_hand_values(x, expected):
    assert fp8_e4m3_round(np.float32(x)) == np.float32(expected)


def test_fp8_round_matches_enumerated_grid():
    xs = np.random.default_rng(1).standard_normal(2000).astype(np.float32) * 50
    xs = np.concatenate([xs, e4m3_grid().astype(np.float32), (e4m3_grid()[:-1] + np.diff(e4m3_grid()) / 2).astype(np.float32)])
    got = fp8_e4m3_round(xs)
    assert np.array_equal(got, np.array([reference_round(float(v)) for v in xs], dtype=np.float32))


def test_fake_quantize_scales_and_saturates():
    assert np.array_equal(fake_quantize(np.array([2.0, 3.0, -9.0], np.float32), 0.5 / 448 * 4),
                          np.array([2.0, 2.0, -2.0], np.float32) * 1.0)


# --- histogram -----------------------------------------------------------------------

def test_histogram_rebinning_equals_single_histogram():
    rng = np.random.default_rng(2)
    batches = [rng.standard_normal(1000).astype(np.float32) * s for s in (0.1, 1.0, 7.0)]
    s = TensorStats("t", bins=256)
    for b in batches:
        s.update(b)
    values = np.abs(np.concatenate(batches))
    assert values.max() < 32.0 <= 2 * values.max()  # range: smallest power of two above max
    assert s.range == 32.0 and s.amax == values.max() and s.count == values.size
    expected, _ = np.histogram(values, bins=256, range=(0.0, 32.0))
    assert np.array_equal(s.hist, expected)


def test_histogram_zeros_before_first_nonzero_go_to_bin_zero():
    s = TensorStats("t", bins=8)
    s.update(np.zeros(5, np.float32))
    assert s.range is None and cal.compute_amax(s, "entropy") == 0.0
    assert cal.scale_from_amax(0.0) == np.float32(1 / 448)
    s.update(np.array([0.0, 3.0], np.float32))
    assert s.range == 4.0 and s.hist[0] == 6 and s.hist[6] == 1


def test_histogram_refuses_nan():
    with pytest.raises(CalibrationError, match="NaN or Inf"):
        TensorStats("act").update(np.array([1.0, np.nan], np.float32))


# --- calibrators against hand-computed cases ----------------------------------------

def test_max_is_exact_max_with_planted_outlier():
    s = TensorStats("t")
    s.update(np.r_[np.linspace(-1, 1, 999), 37.25].astype(np.float32))
    assert cal.compute_amax(s, "max") == 37.25


def test_percentile_hand_computed():
    # 10 values in 16 bins of width 1; cumulative counts 5, 8, 9, 9, ..., 10.
    s = stats_from([5, 3, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0], 1.0, amax=9.7)
    assert cal.compute_amax(s, "percentile", 90) == 3.0  # 9 of 10 reached in bin 2: edge 3
    assert cal.compute_amax(s, "percentile", 50) == 1.0
    assert cal.compute_amax(s, "percentile", 95) == np.float32(9.7)  # edge 10, clamped to max
    assert cal.compute_amax(s, "percentile", 100) == np.float32(9.7)


def test_percentile_with_planted_outlier_ignores_it():
    s = TensorStats("t")
    s.update(np.r_[np.linspace(0, 1, 99_999, dtype=np.float32), np.float32(100.0)])
    amax = cal.compute_amax(s, "percentile", 99.99)
    assert 0.99 <= amax <= 1.0 + s.bin_width


def last_min(values: dict[int, float]) -> int:
    """Smallest value, ties (1e-9 relative) to the largest candidate: the documented rule."""
    best = min(values.values())
    return max(i for i, v in values.items() if v <= best + 1e-9 * abs(best) + 1e-300)


def brute_force_mse(hist, width, amax, start=128):
    """Literal loops over candidates and bins with the enumerated-grid rounding."""
    hist = list(hist)
    last = max(j for j, h in enumerate(hist) if h) + 1
    values = {}
    for i in range(min(start, last), last + 1):
        t = i * width
        scale = np.float32(t) / np.float32(448)
        err = 0.0
        for j, h in enumerate(hist):
            c = np.float32((j + 0.5) * width)
            q = np.float32(reference_round(float(np.float32(c / scale)))) * scale
            err += h * float(c - q) ** 2
        values[i] = err / sum(hist)
    return min(last_min(values) * width, amax)


def brute_force_kl(hist, width, amax, start=128, values=None):
    """TensorRT's classic entropy loop, quantization step by FP8 level, written literally."""
    last = max(j for j, h in enumerate(hist) if h) + 1
    values = {} if values is None else values
    for i in range(min(start, last), last + 1):
        p = [float(h) for h in hist[:i]]
        p[-1] += float(sum(hist[i:]))
        level = [_GRID_INDEX[reference_round(float(np.float32((j + 0.5) * 448.0 / i)))] for j in range(i)]
        q = [0.0] * i
        for lv in set(level):
            members = [j for j in range(i) if level[j] == lv]
            nonempty = [j for j in members if hist[j] > 0]
            for j in nonempty:
                q[j] = sum(hist[m] for m in members) / len(nonempty)
        sp, sq = sum(p), sum(q)
        kl = 0.0
        for pj, qj in zip(p, q):
            if pj > 0:
                kl = math.inf if qj == 0 else kl + pj / sp * math.log((pj / sp) / (qj / sq))
        values[i] = kl
    return min(last_min(values) * width, amax)


def outlier_histogram(bins=256):
    rng = np.random.default_rng(3)
    s = TensorStats("t", bins=bins)
    s.update(np.r_[rng.standard_normal(20_000), [30.0, -29.0]].astype(np.float32))
    return s


def test_mse_matches_brute_force():
    s = outlier_histogram()
    assert cal.amax_mse(s) == pytest.approx(brute_force_mse(s.hist, s.bin_width, s.amax), rel=1e-6)


def test_entropy_matches_brute_force_and_clips_outliers():
    s = outlier_histogram()
    amax = cal.amax_entropy(s)
    divergences = {}
    assert amax == pytest.approx(brute_force_kl(s.hist, s.bin_width, s.amax, values=divergences), rel=1e-6)
    candidates = np.array(sorted(divergences))
    vectorised = cal.kl_divergences_fp8(s.hist, candidates)
    assert np.allclose(vectorised, [divergences[i] for i in candidates], rtol=1e-9, atol=1e-12)
    assert amax < s.amax  # entropy gives up the few outliers


def test_entropy_without_clipping_benefit_keeps_the_max():
    # Mass only in the top bins: clipping anything moves mass, so the full range wins.
    hist = np.zeros(256, np.int64)
    hist[250:256] = 100
    s = stats_from(hist, 1 / 64, amax=4.0)
    assert cal.amax_entropy(s) == 4.0


def test_mse_hand_case_prefers_clipping_lone_far_value_only_when_cheap():
    # One value at bin 255's centre, many at bin 0: clipping the lone value costs more
    # than the precision gained near zero (FP8's relative precision), so the max stays.
    hist = np.zeros(256, np.int64)
    hist[0], hist[255] = 1000, 1
    s = stats_from(hist, 1.0, amax=255.7)
    assert cal.amax_mse(s) == np.float32(255.7)


def test_unknown_method_and_bad_percentile_refused():
    s = stats_from([1, 1], 1.0, 1.5)
    with pytest.raises(UsageError, match="choose one of max, percentile, entropy, mse"):
        cal.compute_amax(s, "minmax")
    with pytest.raises(UsageError, match=r"\(0, 100\]"):
        cal.compute_amax(s, "percentile", 0)


# --- one-pass collection -------------------------------------------------------------

def test_collection_reads_only_requested_tensors_and_matches_numpy_max(monkeypatch):
    import onnxruntime as ort

    model, w1, w2 = conv_model()
    sessions = []
    real_init = ort.InferenceSession.__init__

    def spy(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        sessions.append(self)

    monkeypatch.setattr(ort.InferenceSession, "__init__", spy)
    rng = np.random.default_rng(4)
    # Two batches of one shape (the reused-buffer path), then a shorter one.
    batches = [rng.standard_normal((n, 3, 8, 8)).astype(np.float32) for n in (3, 3, 1)]
    before = model.SerializeToString()
    stats = collect_statistics(model, ["r1", "c2"], iter(batches), histogram_bins=512)
    assert model.SerializeToString() == before  # the caller's model is untouched
    assert [o.name for o in sessions[0].get_outputs()] == ["y", "r1", "c2"]  # c1 not added
    assert set(stats) == {"r1", "c2"}
    reference = [reference_activations(b, w1, w2) for b in batches]
    for name in ("r1", "c2"):
        values = np.abs(np.concatenate([r[name] for r in reference]))
        assert stats[name].amax == pytest.approx(float(values.max()), rel=1e-5)
        assert stats[name].count == values.size
        expected, _ = np.histogram(values, bins=512, range=(0.0, stats[name].range))
        assert np.abs(stats[name].hist - expected).sum() <= 0.001 * values.size  # fp rounding at edges
    result = calibrate(model, ["r1", "c2"], ((b, None, []) for b in batches), method="max")
    assert result.images == 7 and result.scale["c2"] == np.float32(result.amax["c2"]) / np.float32(448)


def test_collection_refuses_unknown_tensor_and_empty_data():
    model, *_ = conv_model()
    with pytest.raises(CalibrationError, match="not activations of this graph: nope, w1"):
        collect_statistics(model, ["r1", "nope", "w1"], [])
    with pytest.raises(CalibrationError, match="no calibration images"):
        collect_statistics(model, ["r1"], [])


def test_one_pass_feeds_every_method():
    model, *_ = conv_model()
    data = synthetic_calibration_set((3, 8, 8), count=6, seed=1)
    stats = collect_statistics(model, ["r1"], data.iter_batches(4))
    results = {m: result_from_statistics(stats, m, len(data)).amax["r1"] for m in cal.METHODS}
    assert all(0 < results[m] <= results["max"] for m in cal.METHODS)


# --- stored scales: deterministic, schema-checked -----------------------------------

METADATA = {
    "data_digest": "sha256:" + "ab" * 32,
    "data_source": "folder:imgs",
    "recipe_digest": "sha256:" + "cd" * 32,
}


def make_calibration_bytes() -> bytes:
    model, *_ = conv_model()
    data = synthetic_calibration_set((3, 8, 8), count=5, seed=7)
    result = calibrate(model, ["c1", "r1"], data.iter_batches(2), method="percentile", percentile=99.9)
    weights = {"conv2": np.array([0.5, 0.25, 1.0, 2.0, 0.125], np.float32)}
    return calibration_to_safetensors(result, weights, {**METADATA, "data_digest": data.digest})


def test_calibration_bytes_reproducible_across_processes():
    first = make_calibration_bytes()
    assert make_calibration_bytes() == first
    code = (
        "import hashlib,sys; sys.path.insert(0, %r); sys.path.insert(0, %r);"
        "from test_calibration import make_calibration_bytes as m;"
        "print(hashlib.sha256(m()).hexdigest())"
    ) % (str(Path(__file__).resolve().parents[1]), str(Path(__file__).parent))
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert other.stdout.strip() == hashlib.sha256(first).hexdigest()


def test_calibration_round_trip():
    from safetensors.numpy import load

    data = make_calibration_bytes()
    decoded = calibration_from_safetensors(data)
    assert decoded.metadata["method"] == "percentile" and decoded.metadata["percentile"] == "99.9"
    assert decoded.metadata["images"] == "5" and decoded.metadata["format"] == "trt-bundle-calibration/1"
    assert decoded.result.percentile == 99.9 and set(decoded.result.amax) == {"c1", "r1"}
    assert np.array_equal(decoded.weight_scales["conv2"], [0.5, 0.25, 1.0, 2.0, 0.125])
    tensors = load(data)  # the library reads our bytes
    assert tensors["act.r1.scale"].shape == () and tensors["act.r1.scale"].dtype == np.float32
    assert float(tensors["act.r1.scale"]) == np.float32(decoded.result.amax["r1"]) / np.float32(448)


def test_store_refuses_bad_metadata_on_write_and_read():
    model, *_ = conv_model()
    result = result_from_statistics({"r1": outlier_histogram()}, "max", 3)
    with pytest.raises(CalibrationError, match="data_digest"):
        calibration_to_safetensors(result, {}, {**METADATA, "data_digest": "md5:00"})
    with pytest.raises(UsageError, match="unknown calibration metadata"):
        calibration_to_safetensors(result, {}, {**METADATA, "colour": "blue"})
    good = calibration_to_safetensors(result, {}, METADATA)
    tampered = good.replace(b'"method":"max"', b'"method":"avg"')
    with pytest.raises(BundleFormatError, match="method"):
        calibration_from_safetensors(tampered)
    with pytest.raises(BundleFormatError):
        calibration_from_safetensors(good[:20])


# --- data sources ----------------------------------------------------------------------

def test_folder_per_class_labels_order_and_hidden_files(image_folder):
    data = open_calibration_data(image_folder, tiny_preprocess, count=100)
    assert data.keys == tuple(f"{c}/{k}.png" for c in ("ant", "bee", "cat") for k in range(3))
    assert data.labels.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert len(data) == 9 and data.requested == 100 and data.source == "folder:imgs"
    batches = list(data.iter_batches(4))
    assert [b[0].shape for b in batches] == [(4, 3, 8, 8), (4, 3, 8, 8), (1, 3, 8, 8)]
    assert batches[2][1].tolist() == [2] and batches[2][2] == ["cat/2.png"]
    assert batches[0][0].dtype == np.float32


def test_flat_folder_has_no_labels(tmp_path):
    for k in range(3):
        (tmp_path / f"img{k}.JPG").write_bytes(png_bytes(k, fmt="JPEG"))
    data = open_calibration_data(tmp_path, tiny_preprocess)
    assert data.labels is None and data.keys == ("img0.JPG", "img1.JPG", "img2.JPG")


def test_stride_count_and_digest_stability(image_folder, tmp_path):
    a = open_calibration_data(image_folder, tiny_preprocess, count=3, stride=2)
    assert a.keys == ("ant/0.png", "ant/2.png", "bee/1.png")
    b = open_calibration_data(image_folder, tiny_preprocess, count=3, stride=2)
    assert a.digest == b.digest and a.digest.startswith("sha256:")
    assert open_calibration_data(image_folder, tiny_preprocess, count=4, stride=2).digest != a.digest
    # Same selected bytes elsewhere: same digest (keys are relative).
    moved = tmp_path / "moved"
    image_folder.rename(moved)
    assert open_calibration_data(moved, tiny_preprocess, count=3, stride=2).digest == a.digest
    # Changing one unselected image does not change it; a selected one does.
    (moved / "ant" / "1.png").write_bytes(png_bytes(99))
    assert open_calibration_data(moved, tiny_preprocess, count=3, stride=2).digest == a.digest
    (moved / "ant" / "2.png").write_bytes(png_bytes(99))
    assert open_calibration_data(moved, tiny_preprocess, count=3, stride=2).digest != a.digest


def test_digest_is_sha256_of_length_prefixed_keys_and_bytes(tmp_path):
    raw = png_bytes(1)
    (tmp_path / "a.png").write_bytes(raw)
    h = hashlib.sha256()
    for part in (b"a.png", raw):
        h.update(len(part).to_bytes(8, "little") + part)
    data = open_calibration_data(tmp_path, tiny_preprocess)
    assert data.digest == "sha256:" + h.hexdigest()
    assert data.item_digests == {hashlib.sha256(raw).hexdigest()}


def webdataset_shards(tmp_path: Path, n_shards=2, per_shard=3) -> list[Path]:
    shards = []
    for s in range(n_shards):
        members = []
        for k in range(per_shard):
            key = f"val_{s * per_shard + k:05d}"
            members += [(f"{key}.jpg", png_bytes(s * 10 + k, fmt="JPEG")), (f"{key}.cls", f"{k + s}\n".encode())]
        shards.append(write_tar(tmp_path / f"shard-{s:03d}.tar", members))
    return shards


def test_webdataset_single_folder_and_brace_pattern(tmp_path):
    shards = webdataset_shards(tmp_path)
    one = open_calibration_data(shards[0], tiny_preprocess)
    assert one.keys == ("val_00000", "val_00001", "val_00002") and one.labels.tolist() == [0, 1, 2]
    folder = open_calibration_data(tmp_path, tiny_preprocess, count=4, stride=1)
    braces = open_calibration_data(str(tmp_path / "shard-{000..001}.tar"), tiny_preprocess, count=4)
    assert folder.keys == braces.keys == ("val_00000", "val_00001", "val_00002", "val_00003")
    assert folder.digest == braces.digest and folder.labels.tolist() == [0, 1, 2, 1]
    x, labels, keys = next(braces.iter_batches(8))
    assert x.shape == (4, 3, 8, 8) and keys[-1] == "val_00003"
    # Same images as a folder give the same per-item digests (evaluation can refuse them).
    img_dir = tmp_path / "as_folder"
    img_dir.mkdir()
    (img_dir / "z.jpg").write_bytes(png_bytes(0, fmt="JPEG"))
    assert open_calibration_data(img_dir, tiny_preprocess).item_digests <= braces.item_digests


def test_webdataset_missing_shard_in_pattern(tmp_path):
    webdataset_shards(tmp_path)
    with pytest.raises(CalibrationError, match="shard-002.tar"):
        open_calibration_data(str(tmp_path / "shard-{000..002}.tar"), tiny_preprocess)


@pytest.mark.parametrize("name", ["../evil.jpg", "/etc/evil.jpg", "a/../../evil.jpg"])
def test_webdataset_path_traversal_refused(tmp_path, name):
    shard = write_tar(tmp_path / "bad.tar", [("ok.jpg", png_bytes(0, fmt="JPEG")), (name, png_bytes(1, fmt="JPEG"))])
    with pytest.raises(CalibrationError, match="parent-relative|absolute"):
        open_calibration_data(shard, tiny_preprocess)


def test_webdataset_symlink_member_refused(tmp_path):
    shard = tmp_path / "link.tar"
    with tarfile.open(shard, "w") as tar:
        info = tarfile.TarInfo("x.jpg")
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(info)
    with pytest.raises(CalibrationError, match="link or special file"):
        open_calibration_data(shard, tiny_preprocess)


def test_webdataset_bad_label_refused(tmp_path):
    shard = write_tar(tmp_path / "s.tar", [("k.jpg", png_bytes(0, fmt="JPEG")), ("k.cls", b"dog")])
    with pytest.raises(CalibrationError, match="integer class index"):
        open_calibration_data(shard, tiny_preprocess)


def test_safetensors_source(tmp_path):
    from safetensors.numpy import save_file

    images = np.random.default_rng(5).standard_normal((5, 3, 4, 4)).astype(np.float32)
    path = tmp_path / "calib.safetensors"
    save_file({"images": images, "labels": np.arange(5, dtype=np.int64)}, str(path))
    data = open_calibration_data(path, None, count=2, stride=2)
    assert data.keys == ("images[0]", "images[2]") and data.labels.tolist() == [0, 2]
    x, labels, _ = next(data.iter_batches(8))
    assert np.array_equal(x, images[[0, 2]])
    save_file({"images": images.astype(np.float16)}, str(path))
    with pytest.raises(CalibrationError, match="expected float32"):
        open_calibration_data(path, None)
    path.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}")
    with pytest.raises(CalibrationError, match="cannot read calib.safetensors"):
        open_calibration_data(path, None)


def test_synthetic_set_is_deterministic_structured_and_labelled_synthetic():
    a = synthetic_calibration_set((3, 32, 32), count=3, seed=5)
    b = synthetic_calibration_set((3, 32, 32), count=3, seed=5)
    xa, xb = next(a.iter_batches(3))[0], next(b.iter_batches(3))[0]
    assert np.array_equal(xa, xb) and a.digest == b.digest
    assert a.source == "synthetic:v1:seed=5:shape=3x32x32:count=3"
    assert synthetic_calibration_set((3, 32, 32), count=3, seed=6).digest != a.digest
    assert xa.min() >= -1.0 and xa.max() <= 1.0
    # Structured: neighbouring pixels are strongly correlated, unlike white noise.
    img = xa[0, 0]
    assert np.corrcoef(img[:, :-1].ravel(), img[:, 1:].ravel())[0, 1] > 0.8
    via_pre = synthetic_calibration_set((3, 32, 32), count=2, seed=5, preprocess=tiny_preprocess)
    assert next(via_pre.iter_batches(2))[0].shape == (2, 3, 8, 8)


# --- every CalibrationError of the data side ------------------------------------------

def test_missing_path(tmp_path):
    with pytest.raises(CalibrationError, match="does not exist"):
        open_calibration_data(tmp_path / "nowhere", tiny_preprocess)


def test_no_images_found(tmp_path):
    (tmp_path / "readme.txt").write_text("x")
    with pytest.raises(CalibrationError, match="no calibration images found"):
        open_calibration_data(tmp_path, tiny_preprocess)


def test_unreadable_image_is_named(tmp_path):
    (tmp_path / "a.png").write_bytes(png_bytes(0))
    (tmp_path / "b.jpg").write_bytes(b"\xff\xd8 definitely not a jpeg")
    with pytest.raises(CalibrationError, match="'b.jpg'"):
        open_calibration_data(tmp_path, tiny_preprocess)


def test_truncated_image_is_named_when_decoded(tmp_path):
    jpeg = png_bytes(0, size=(64, 64), fmt="JPEG")
    (tmp_path / "t.jpg").write_bytes(jpeg[: len(jpeg) * 2 // 3])
    data = open_calibration_data(tmp_path, tiny_preprocess)  # header is fine
    with pytest.raises(CalibrationError, match=r"'t.jpg' \(file .*/t.jpg\) cannot be decoded"):
        list(data.iter_batches(1))


def test_count_larger_than_available_uses_what_exists(image_folder):
    data = open_calibration_data(image_folder, tiny_preprocess, count=500, stride=4)
    assert len(data) == 3 and data.requested == 500


@pytest.mark.parametrize("count, stride", [(0, 1), (-3, 1), (5, 0)])
def test_count_and_stride_below_one_refused(image_folder, count, stride):
    with pytest.raises(CalibrationError, match="must be >= 1"):
        open_calibration_data(image_folder, tiny_preprocess, count=count, stride=stride)


def test_unknown_file_kind_and_mixed_folder(tmp_path):
    (tmp_path / "x.npy").write_bytes(b"")
    with pytest.raises(CalibrationError, match="neither a folder"):
        open_calibration_data(tmp_path / "x.npy", tiny_preprocess)
    webdataset_shards(tmp_path, n_shards=1)
    (tmp_path / "y.png").write_bytes(png_bytes(0))
    with pytest.raises(CalibrationError, match="both images and .tar shards"):
        open_calibration_data(tmp_path, tiny_preprocess)


def test_max_method_builds_no_histogram_and_records_none():
    model, *_ = conv_model()
    data = synthetic_calibration_set((3, 8, 8), count=4, seed=2)
    full = collect_statistics(model, ["r1"], data.iter_batches(2))
    result = calibrate(model, ["r1"], data.iter_batches(2), method="max")
    assert result.histogram_bins is None and result.amax["r1"] == np.float32(full["r1"].amax)
    meta = calibration_from_safetensors(calibration_to_safetensors(result, {}, METADATA)).metadata
    assert "histogram_bins" not in meta and "percentile" not in meta and meta["method"] == "max"
    stats = collect_statistics(model, ["r1"], data.iter_batches(2), histogram_bins=0)
    with pytest.raises(ValueError, match="needs a histogram"):
        cal.compute_amax(stats["r1"], "entropy")


def test_item_digests_metadata_round_trip(image_folder):
    data = open_calibration_data(image_folder, tiny_preprocess, count=2)
    result = result_from_statistics({"r1": outlier_histogram()}, "max", len(data))
    joined = ",".join(sorted(data.item_digests))
    blob = calibration_to_safetensors(result, {}, {**METADATA, "item_digests": joined})
    assert set(calibration_from_safetensors(blob).metadata["item_digests"].split(",")) == data.item_digests
    with pytest.raises(CalibrationError, match="item_digests"):
        calibration_to_safetensors(result, {}, {**METADATA, "item_digests": "not-a-digest"})
