"""The in-process data path: host copies, asynchronous inference, the pipelined batcher.

GPU runners are covered on the H200 (tests marked ``gpu`` in test_torch_aoti.py); here the
same contracts run on CPU stand-ins: ``AsyncToyModel`` starts batches on a private thread
that reads its inputs late, as a device copy does.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from runtime_py.batcher import Batcher
from runtime_py.pending import Pending
from runtime_py.hostcopy import HostBufferRegistry, copy_held, copy_rows, gather_rows
from runtime_py.testing import AsyncToyModel, ToyModel

TIMEOUT = 30


@pytest.mark.parametrize("threads", [1, 3, 8])
def test_threaded_copies_equal_numpy(threads):
    rng = np.random.default_rng(0)
    src = rng.standard_normal((17, 3, 64, 64)).astype(np.float32)   # 835 KB
    dst = np.zeros_like(src)
    import runtime_py.hostcopy as hc

    old = hc.PARALLEL_MIN_BYTES
    try:
        hc.PARALLEL_MIN_BYTES = 1   # split even this small copy
        copy_rows(dst, src, threads=threads)
        np.testing.assert_array_equal(dst, src)
    finally:
        hc.PARALLEL_MIN_BYTES = old
    with pytest.raises(ValueError, match="shapes differ"):
        copy_rows(dst[:3], src)
    with pytest.raises(TypeError):
        copy_rows(dst, src.astype(np.float64))          # never a silent cast


def test_copy_rows_hands_out_each_chunk_in_row_order_once_it_is_copied():
    """``on_chunk`` (what the torch-aoti runner enqueues each chunk's H2D copy from): called
    in row order, each time for rows that are already in ``dst`` together with every row
    before them, covering the batch once; when it raises, the copy still finishes before
    the error comes out (no thread writes ``dst`` after the call)."""
    rng = np.random.default_rng(1)
    src = rng.standard_normal((16, 3, 160, 160)).astype(np.float32)   # 4.9 MB: split
    for threads in (1, 4):
        dst = np.zeros_like(src)
        seen = []

        def on_chunk(first, rows):
            seen.append((first, rows))
            np.testing.assert_array_equal(dst[:first + rows], src[:first + rows])
        copy_rows(dst, src, threads=threads, on_chunk=on_chunk)
        assert [f for f, _ in seen] == sorted(f for f, _ in seen)
        assert sum(r for _, r in seen) == 16 and seen[0][0] == 0
        assert len(seen) == threads
        np.testing.assert_array_equal(dst, src)

    dst = np.zeros_like(src)

    def fails(first, rows):
        raise RuntimeError("cudaMemcpyAsync failed")
    with pytest.raises(RuntimeError, match="cudaMemcpyAsync"):
        copy_rows(dst, src, threads=4, on_chunk=fails)
    np.testing.assert_array_equal(dst, src)


@pytest.mark.parametrize("kind", ["writable", "read-only", "strided"])
def test_gather_rows_equals_concatenate(kind):
    """Both ways ``gather_rows`` copies (memcpy under the GIL; np.copyto for a part that
    is not contiguous) give numpy's concatenation, and leave the rest of the buffer alone."""
    rng = np.random.default_rng(0)
    src = rng.integers(0, 255, (17, 5, 6, 3), dtype=np.uint8)
    pieces = [src[:5], src[5:6], src[6:17], src[:1]]
    if kind == "read-only":
        pieces = [p.copy() for p in pieces]
        for p in pieces:
            p.setflags(write=False)
    elif kind == "strided":
        pieces[1] = src[5:6, :, ::-1]                   # not C-contiguous
    out = np.full((40, 5, 6, 3), 7, np.uint8)
    got = gather_rows(out, pieces)
    assert got.shape == (18, 5, 6, 3) and np.shares_memory(got, out)
    np.testing.assert_array_equal(got, np.concatenate(pieces))
    assert (out[18:] == 7).all()


def test_copy_held_is_an_own_contiguous_copy():
    src = np.arange(24, dtype=np.float16).reshape(2, 3, 4)
    for arr in (src, src[:, ::-1], np.float32(3.0) * np.ones(())):
        got = copy_held(arr)
        np.testing.assert_array_equal(got, arr)
        assert got.dtype == arr.dtype and got.flags.c_contiguous
        assert not np.shares_memory(got, arr)


def test_gather_rows_refuses_what_does_not_fit():
    out = np.zeros((4, 3), np.float32)
    with pytest.raises(ValueError, match="do not fit a buffer of 4"):
        gather_rows(out, [np.zeros((3, 3), np.float32), np.zeros((2, 3), np.float32)])
    with pytest.raises(ValueError, match="does not fit buffer rows"):
        gather_rows(out, [np.zeros((1, 3), np.float64)])      # never a silent cast
    with pytest.raises(ValueError, match="does not fit buffer rows"):
        gather_rows(out, [np.zeros((1, 4), np.float32)])
    assert gather_rows(out, []).shape == (0, 3)
    assert gather_rows(out, [np.zeros((0, 3), np.float32)]).shape == (0, 3)
    cols = np.zeros((3, 4), np.float32)[:, :3]                # a buffer that is not contiguous
    np.testing.assert_array_equal(gather_rows(cols, [np.ones((2, 3), np.float32)]),
                                  np.ones((2, 3)))


def test_registry_recognises_views_of_its_blocks_only():
    reg = HostBufferRegistry()
    block = np.empty((8, 4), np.float32)
    reg.add(block)
    assert reg.owner_of(block[2:5]) is block
    assert reg.owner_of(np.empty((2, 4), np.float32)) is None
    partly = np.lib.stride_tricks.as_strided(block, shape=(9, 4))   # runs past the end
    assert reg.owner_of(partly) is None
    # A buffer stays known while only a view of it is held (the caller kept buf[:n]) ...
    view = np.empty((8, 4), np.float32)
    reg.add(view)
    kept = view[:3]
    del view
    assert reg.owner_of(kept) is not None
    # ... and is forgotten once nothing holds it.
    del kept, partly
    import gc

    gc.collect()
    assert len([b for b in reg._blocks if b[2]() is not None]) == 1


def test_pending_waits_once_and_reraises():
    calls = []

    def wait():
        calls.append(1)
        return {"y": np.ones(2)}

    p = Pending(wait)
    threads = [threading.Thread(target=p.result) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == [1] and p.result()["y"].sum() == 2
    bad = Pending.failed(ValueError("boom"))
    for _ in range(2):
        with pytest.raises(ValueError, match="boom"):
            bad.result()


def _client_batches(rng, count: int, size: int = 8):
    return [rng.standard_normal((int(rng.integers(1, 6)), 3, size, size)).astype(np.float32)
            for _ in range(count)]


def test_pipelined_batcher_matches_infer_under_64_clients_and_never_reuses_a_live_buffer():
    """64 concurrent clients, batch sizes 1..5: every result equals the model's own answer
    for those rows. The model reads each batch's input late (on its "stream", after a
    delay): a batcher that rewrote a slot before the batch finished would fail this."""
    model = AsyncToyModel(max_batch_size=16, read_delay_ms=2.0)
    requests = _client_batches(np.random.default_rng(1), 64 * 4)
    results: list = [None] * len(requests)
    with Batcher(model, max_delay_ms=1.0) as batcher:
        def client(c: int) -> None:
            for i in range(c, len(requests), 64):
                results[i] = batcher.submit(requests[i]).result(TIMEOUT)["logits"]

        threads = [threading.Thread(target=client, args=(c,)) for c in range(64)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIMEOUT)
    for x, got in zip(requests, results):
        np.testing.assert_array_equal(got, model.reference(x))
    assert max(model.calls) > 1, "no request was ever merged"
    assert model.max_in_flight == 2, "the batcher never had two batches in flight"
    assert model.in_place > 0, "merged batches never used the model's own input buffers"
    model.close()


def test_outputs_handed_to_clients_stay_valid_after_later_batches():
    """A result read after many later batches ran still holds its own values (outputs are
    never views of a buffer the batcher or the engine reuses)."""
    model = AsyncToyModel(max_batch_size=4)
    rng = np.random.default_rng(2)
    with Batcher(model, max_delay_ms=0.5) as batcher:
        first_x = rng.standard_normal((3, 3, 8, 8)).astype(np.float32)
        first = batcher.submit(first_x).result(TIMEOUT)["logits"]
        kept = first.copy()
        for _ in range(20):
            batcher.infer(rng.standard_normal((4, 3, 8, 8)).astype(np.float32), TIMEOUT)
    np.testing.assert_array_equal(first, kept)
    model.close()


def test_a_failing_request_fails_alone_in_the_pipeline():
    from runtime_py.testing import FAIL_VALUE, ToyModelError

    model = AsyncToyModel(max_batch_size=8, read_delay_ms=1.0)
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal((2, 3, 8, 8)).astype(np.float32) for _ in range(12)]
    xs[5][1, 0, 0, 0] = FAIL_VALUE
    with Batcher(model, max_delay_ms=5.0) as batcher:
        futures = [batcher.submit(x) for x in xs]
        for i, (x, f) in enumerate(zip(xs, futures)):
            if i == 5:
                with pytest.raises(ToyModelError):
                    f.result(TIMEOUT)
            else:
                np.testing.assert_array_equal(f.result(TIMEOUT)["logits"], model.reference(x))
    assert batcher.failed_requests == 1
    model.close()


def test_pipeline_depth_one_runs_one_batch_at_a_time():
    model = AsyncToyModel(max_batch_size=4, read_delay_ms=1.0)
    with Batcher(model, max_delay_ms=0.5, pipeline_depth=1) as batcher:
        fs = [batcher.submit(np.ones((3, 3, 8, 8), np.float32)) for _ in range(10)]
        for f in fs:
            f.result(TIMEOUT)
    assert model.max_in_flight == 1
    model.close()
    from runtime_py.errors import UsageError

    with pytest.raises(UsageError, match="pipeline depth"):
        Batcher(ToyModel(), pipeline_depth=0)


def test_close_drains_batches_in_flight():
    model = AsyncToyModel(max_batch_size=4, read_delay_ms=3.0)
    batcher = Batcher(model, max_delay_ms=0.5)
    x = np.random.default_rng(4).standard_normal((4, 3, 8, 8)).astype(np.float32)
    fs = [batcher.submit(x) for _ in range(6)]
    batcher.close(drain=True, timeout=TIMEOUT)
    for f in fs:
        np.testing.assert_array_equal(f.result(0)["logits"], model.reference(x))
    model.close()


def test_runner_input_buffers_and_async_on_onnxruntime(tmp_path):
    """The ONNX Runtime runner keeps working under the async API: buffers are plain
    numpy, infer_async computes on the calling thread and returns a finished Pending."""
    import runtime_py
    from synthetic_bundles import write_source_bundle

    with runtime_py.load(write_source_bundle(tmp_path)) as model:
        buffers = model.input_buffers()
        spec = model.inputs[0]
        buf = buffers[spec.name]
        assert buf.shape[0] == model.max_batch_size and buf.dtype == np.dtype(spec.dtype)
        rng = np.random.default_rng(5)
        buf[:2] = rng.standard_normal(buf[:2].shape).astype(buf.dtype)
        expected = model.infer(buf[:2].copy())
        got = model.infer_async({spec.name: buf[:2]}).result()
        for name in expected:
            np.testing.assert_array_equal(got[name], expected[name])
        big = rng.standard_normal((model.max_batch_size * 2 + 1, *buf.shape[1:])).astype(buf.dtype)
        whole = model.infer(big)[model.outputs[0].name]
        first = model.infer(big[:model.max_batch_size])[model.outputs[0].name]
        np.testing.assert_allclose(whole[:model.max_batch_size], first, rtol=1e-5, atol=1e-5)


def test_pixel_preprocessing_normalizes_to_the_float_path_bit_for_bit():
    from PIL import Image

    from runtime_py.errors import PreprocessError
    from runtime_py.preprocess import Preprocessor, pixel_input_spec, spec_from_timm_config

    spec = spec_from_timm_config({"input_size": (3, 299, 299), "interpolation": "bicubic",
                                  "crop_pct": 0.903, "mean": (0.5,) * 3, "std": (0.5,) * 3},
                                 "input")
    rng = np.random.default_rng(6)
    rgb = Image.fromarray(rng.integers(0, 256, (360, 480, 3), dtype=np.uint8))
    images = [rgb, rgb.convert("L"), rgb.convert("RGBA")]
    floats = Preprocessor(spec).batch(images)
    pixel = Preprocessor(pixel_input_spec(spec))
    pixels = pixel.batch(images)
    assert pixels.dtype == np.uint8 and pixels.shape == (3, 299, 299, 3)
    np.testing.assert_array_equal(pixel.normalize(pixels), floats)
    broken = {**pixel_input_spec(spec)}
    del broken["in_engine"]
    with pytest.raises(PreprocessError, match="in_engine"):
        Preprocessor(broken)
    with pytest.raises(PreprocessError):
        Preprocessor({**spec, "in_engine": ["rescale", "normalize", "layout", "cast"]})


@pytest.mark.slow
def test_a_uint8_input_bundle_gives_the_float_bundles_logits(xception_bundles, tmp_path):
    """`bundle make --input uint8`: the engine takes pixels and does rescale, normalize,
    layout and cast at the head of its graph; on the same images it gives the float
    bundle's logits, and its reference member (uint8 inputs) verifies."""
    import io

    from PIL import Image

    import runtime_py
    from bundler.calibration.synthetic import synthetic_image
    from bundler.make import MakeRequest, make_bundle

    result = make_bundle(MakeRequest(
        family="timm_xception", precision="fp16", backend="onnxruntime", random_weights=True,
        out_dir=tmp_path, calib_count=16, reference_count=4, input_dtype="uint8"))
    assert result.path.name == "timm_xception-fp16-uint8-1.0.0-onnxruntime.bundle"
    assert result.manifest["inputs"] == [{"name": "input", "dtype": "uint8",
                                          "shape": ["batch", 299, 299, 3]}]
    images = []
    for i in range(3):
        buf = io.BytesIO()
        Image.fromarray(synthetic_image(340 + 40 * i, 500, 11, i)).save(buf, "PNG")
        images.append(buf.getvalue())
    with runtime_py.load(result.path) as pixels, runtime_py.load(xception_bundles["fp16"]) as floats:
        assert pixels.preprocessor.spec["in_engine"] == ["rescale", "normalize", "layout", "cast"]
        batch = pixels.preprocess(images)
        assert batch.dtype == np.uint8 and batch.shape == (3, 299, 299, 3)
        got = pixels.infer(batch)["logits"]
        want = floats.infer(floats.preprocess(images))["logits"]
        assert np.abs(got - want).max() <= 1e-5
        assert pixels.classify(images[0], top_k=3) == pixels.classify([images[0]], top_k=3)
    from click.testing import CliRunner

    from bundler.cli import cli

    out = CliRunner().invoke(cli, ["verify", str(result.path), "--numerics"])
    assert out.exit_code == 0, out.output
    # bundle eval: the fp32 reference (float input) is fed the normalized pixels, and the
    # stress set is pixels (black, white, saturated channels, ...), not float tensors.
    from bundler.evaluate import evaluate_bundle

    report = evaluate_bundle(result.path, None, backend="onnxruntime")
    assert report["quality"]["top1_agreement"] == 1.0
    assert report["reference"]["input"] == "uint8 pixels, normalized on the host"
    assert {"black", "white", "saturated_c0", "noise_0_255"} <= set(report["stress"]["inputs"])


def test_an_unbatched_image_is_refused_with_the_shape_to_send():
    from runtime_py.errors import InferenceInputError

    model = ToyModel(size=8)
    with Batcher(model) as batcher:
        with pytest.raises(InferenceInputError, match=r"x\[None\] \(shape \[1, 3, 8, 8\]\)"):
            batcher.submit(np.zeros((3, 8, 8), np.float32))
