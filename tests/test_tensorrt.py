"""TensorRT: plans built from tiny typed ONNX graphs, run and compared with ONNX Runtime.

Needs TensorRT (10.x or 11.x), cuda-python and an NVIDIA GPU: `pip install -e '.[dev,trt]'`
then `pytest -m tensorrt`. Skipped elsewhere, with the reason.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.tensorrt

trt = pytest.importorskip(
    "tensorrt", reason="TensorRT is not installed here: on a GPU host run "
                       "`pip install -e '.[dev,trt]'` then `pytest -m tensorrt`")
pytest.importorskip("cuda.bindings", reason="cuda-python is not installed (pip install cuda-python)")
pytest.importorskip("onnxruntime", reason="the comparisons need onnxruntime")

from runtime_py.compat import probe_host  # noqa: E402

HOST = probe_host(import_tensorrt=True)
if not HOST.gpus:
    pytest.skip("no NVIDIA GPU visible: " + "; ".join(HOST.notes), allow_module_level=True)

sys.path.insert(0, str(Path(__file__).parent))
from synthetic_bundles import (  # noqa: E402
    manifest_body,
    ort_outputs,
    reference_member,
    tiny_onnx,
)

from bundler.rebuild import rebuild_bundle  # noqa: E402
from bundler.targets.tensorrt import (  # noqa: E402
    OnnxParseError,
    build_tensorrt_plan,
    target_tag,
)
from bundler.writer import write_bundle  # noqa: E402
from runtime_py.engines.tensorrt import TensorRTRunner  # noqa: E402
from runtime_py.errors import CompatibilityError  # noqa: E402
from runtime_py.format import open_bundle  # noqa: E402
from runtime_py.numerics import check_numerics  # noqa: E402

GPU = HOST.gpus[0]
BATCH = {"min": 1, "opt": 2, "max": 4}


def needs_fp8():
    if GPU.compute_capability < (8, 9):
        pytest.skip(f"FP8 needs compute capability 8.9 or later; GPU 0 is {GPU.sm}")


def build(precision="fp32", **kw):
    return build_tensorrt_plan(tiny_onnx(precision), min_batch=1, opt_batch=2, max_batch=4, **kw)


def plan_bundle(folder: Path, precision="fp32", details_override=None, **kw) -> Path:
    onnx_bytes = tiny_onnx(precision)
    result = build_tensorrt_plan(onnx_bytes, min_batch=1, opt_batch=2, max_batch=4, **kw)
    details = dict(result.details, **(details_override or {}))
    body = manifest_body(precision=precision, name=f"tiny-{precision}-1-{target_tag(details)}",
                         engine={"backend": "tensorrt", "member": "engine.plan",
                                 "details": details})
    members = {"model.onnx": onnx_bytes, "engine.plan": result.plan,
               "reference.safetensors": reference_member(onnx_bytes, n=6)}
    path, _ = write_bundle(folder / f"{body['name']}.bundle", body, members)
    return path


@pytest.mark.parametrize("precision", ["fp32", "fp16", "fp8"])
def test_build_records_the_manifest_details(precision):
    if precision == "fp8":
        needs_fp8()
    result = build(precision)
    d = result.details
    assert d["tensorrt_version"] == trt.__version__
    assert d["compute_capability"] == f"{GPU.compute_capability[0]}.{GPU.compute_capability[1]}"
    assert d["device_name"] == GPU.name and d["strongly_typed"] is True
    assert d["profile"] == BATCH and d["optimization_level"] == 3
    assert d["layer_count"] >= 1
    assert len(result.plan) > 1000 and result.timing_cache_bytes is None


def test_timing_cache_is_written_back_and_recorded(tmp_path):
    cache = tmp_path / "timing.cache"
    first = build(timing_cache=cache)
    assert cache.is_file() and first.details["timing_cache_sha256"] is None
    second = build(timing_cache=cache)
    assert second.details["timing_cache_sha256"].startswith("sha256:")


def test_parser_error_names_the_node():
    from onnx import TensorProto, helper

    node = helper.make_node("NoSuchOp", ["input"], ["logits"], name="bad_node", domain="x.y")
    graph = helper.make_graph(
        [node], "bad",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19),
                                                    helper.make_opsetid("x.y", 1)])
    with pytest.raises(OnnxParseError) as e:
        build_tensorrt_plan(model.SerializeToString(), min_batch=1, opt_batch=2, max_batch=4)
    assert any("bad_node" in p and "NoSuchOp" in p for p in e.value.problems)


@pytest.mark.parametrize("precision", ["fp32", "fp16", "fp8"])
def test_runner_matches_onnxruntime_within_tolerance(tmp_path, precision):
    if precision == "fp8":
        needs_fp8()
    path = plan_bundle(tmp_path, precision)
    with open_bundle(path) as b:
        report = check_numerics(b)
    assert report.backend == "tensorrt" and report.ran
    assert report.passed, report.reasons


@pytest.mark.parametrize("batch", [1, 3, 4])
def test_cuda_graphs_on_and_off_give_equal_outputs(tmp_path, batch):
    path = plan_bundle(tmp_path)
    x = np.random.default_rng(batch).standard_normal((batch, 3, 8, 8)).astype(np.float32)
    with open_bundle(path) as b:
        with TensorRTRunner(b, cuda_graphs=False) as plain:
            want = plain.infer({"input": x})["logits"]
        with TensorRTRunner(b, cuda_graphs=True) as graphed:
            first = graphed.infer({"input": x})["logits"]      # captures
            again = graphed.infer({"input": x})["logits"]      # replays
            other = graphed.infer({"input": x[:1]})["logits"]  # another batch size
            assert graphed.graph_failures == {}
    np.testing.assert_array_equal(first, want)
    np.testing.assert_array_equal(again, want)
    np.testing.assert_allclose(other, want[:1], atol=1e-3)
    np.testing.assert_allclose(want, ort_outputs(tiny_onnx(), x), atol=1e-3)


def test_device_timings_time_the_plan_then_the_copies(tmp_path):
    from runtime_py.bench import device_timings
    from runtime_py.errors import InferenceInputError

    path = plan_bundle(tmp_path)
    x = np.random.default_rng(0).uniform(-1, 1, (3, 3, 8, 8)).astype(np.float32)
    with open_bundle(path) as b, TensorRTRunner(b) as r:
        timings = device_timings(r, 3, iterations=20, warmup=2)
        with pytest.raises(InferenceInputError, match="outside this plan's range"):
            r.device_timings(5, 1, 0)
        assert 3 in r._graphs and r.graph_failures == {}     # graph launches were timed
        got = r.infer({"input": x})["logits"]                 # the split _infer still works
    assert set(timings) == {"graph_replay", "with_copies"}
    assert all(len(t) == 20 and min(t) > 0 for t in timings.values())
    np.testing.assert_allclose(got, ort_outputs(tiny_onnx(), x), atol=1e-3)


@pytest.mark.parametrize("cuda_graphs", [False, True])
def test_batches_in_flight_and_pinned_feeds_give_infers_outputs(tmp_path, cuda_graphs):
    """infer_async (two batches in flight, engines/cuda_pipeline.py) and feeds written into
    input_buffers() (pinned, read in place) give what infer gives, batch sizes mixed, results
    read two behind as the batcher reads them; the batcher over the runner too."""
    import runtime_py
    from runtime_py.batcher import Batcher

    path = plan_bundle(tmp_path)
    rng = np.random.default_rng(7)
    xs = [rng.standard_normal((n, 3, 8, 8)).astype(np.float32) for n in (1, 4, 3, 4, 2, 1, 4)]
    with open_bundle(path) as b, TensorRTRunner(b, cuda_graphs=cuda_graphs) as r:
        want = [r.infer({"input": x})["logits"] for x in xs]
        buffers = [r.input_buffers()["input"] for _ in range(3)]
        assert all(r._pipeline.pinned_pointer(buf) is not None for buf in buffers)
        pending = []
        for i, x in enumerate(xs):
            feed = x
            if i % 2:                                    # pinned, read in place
                feed = buffers[i % 3][:len(x)]
                feed[...] = x
            pending.append(r.infer_async({"input": feed}))
            if i >= 2:
                np.testing.assert_allclose(pending[i - 2].result()["logits"], want[i - 2],
                                           atol=1e-5)
        for p, w in zip(pending[-2:], want[-2:]):
            np.testing.assert_allclose(p.result()["logits"], w, atol=1e-5)
        pinned_infer = buffers[0][:4]
        pinned_infer[...] = xs[1]
        np.testing.assert_allclose(r.infer({"input": pinned_infer})["logits"], want[1], atol=1e-5)
    with runtime_py.load(path, backend="tensorrt") as model, Batcher(model) as batcher:
        futures = [batcher.submit(x[:1]) for x in xs]
        for f, w in zip(futures, want):
            np.testing.assert_allclose(f.result(timeout=30)["logits"], w[:1], atol=1e-5)


def test_runner_refuses_a_batch_over_the_plan_max(tmp_path):
    from runtime_py.errors import InferenceInputError

    path = plan_bundle(tmp_path)
    with open_bundle(path) as b, TensorRTRunner(b) as r:
        with pytest.raises(InferenceInputError, match="outside this plan's range 1..4"):
            r.infer({"input": np.zeros((5, 3, 8, 8), np.float32)})


def test_hand_edited_manifest_mismatch_is_refused_before_deserializing(tmp_path):
    path = plan_bundle(tmp_path, details_override={"compute_capability": "5.0"})
    with open_bundle(path) as b:
        runner = TensorRTRunner(b)
        with pytest.raises(CompatibilityError, match=r"plan built for sm_50 .* this host has "
                                                     + GPU.sm):
            runner.activate()
        assert not runner.is_active


def test_other_tensorrt_version_is_refused(tmp_path):
    major = int(trt.__version__.split(".")[0])
    path = plan_bundle(tmp_path, details_override={"tensorrt_version": f"{major}.999.0"})
    with open_bundle(path) as b, pytest.raises(CompatibilityError, match=r"TensorRT \d+\.999"):
        TensorRTRunner(b).activate()


def test_rebuild_an_onnxruntime_bundle_for_this_gpu(tmp_path):
    from synthetic_bundles import write_source_bundle

    (tmp_path / "src").mkdir()
    (tmp_path / "out").mkdir()
    src = write_source_bundle(tmp_path / "src")
    path, new_id = rebuild_bundle(src, "tensorrt", tmp_path / "out", optimization_level=2)
    with open_bundle(path) as new, open_bundle(src) as old:
        new.verify()
        assert new.manifest["engine"]["backend"] == "tensorrt"
        assert new.manifest["rebuilt_from"] == old.id and new.id == new_id
        assert "engine.plan" in new.member_names
        assert check_numerics(new).passed


def test_hardware_compatible_plan_runs(tmp_path):
    if GPU.compute_capability < (8, 0):
        pytest.skip("ampere+ plans need an Ampere or newer GPU to build")
    path = plan_bundle(tmp_path, hardware_compat="ampere+")
    with open_bundle(path) as b:
        assert b.manifest["engine"]["details"]["hardware_compatibility"] == "ampere+"
        assert check_numerics(b).passed
