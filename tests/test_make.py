"""`bundle make`: refusals before any heavy work, and the bundles it writes.

The bundles come from the session fixture `xception_bundles` (random weights, the real
timm_xception graphs, ONNX Runtime target)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from bundler.cli import cli
from bundler.families import load_family
from bundler.make import MakeRequest, make_bundle
from bundler.weights import resolve_weights
from runtime_py.errors import CalibrationError, FamilyError, UsageError, WeightsError
from runtime_py.format import open_bundle
from runtime_py.reference import read_reference


def run(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


# --- refusals: each before anything is exported or written ------------------------------

@pytest.mark.parametrize("precision,reason", [
    ("nvfp4", "not a precision trt-bundle builds"),
    ("int8", "not among timm_xception's precisions"),
    ("fp64", "is not built for family")])
def test_refused_precisions_say_why(tmp_path, precision, reason):
    with pytest.raises(UsageError, match=reason):
        make_bundle(MakeRequest(family="timm_xception", precision=precision,
                                random_weights=True, out_dir=tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_unknown_family_and_variant(tmp_path):
    with pytest.raises(FamilyError, match="timm_xception"):
        make_bundle(MakeRequest(family="resnet9000", precision="fp32", out_dir=tmp_path))
    with pytest.raises(FamilyError, match="fp8-depthwise"):
        make_bundle(MakeRequest(family="timm_xception", precision="fp8", variant="fp8-nope",
                                random_weights=True, out_dir=tmp_path))
    with pytest.raises(UsageError, match="--precision fp8"):
        make_bundle(MakeRequest(family="timm_xception", precision="fp16",
                                variant="fp8-depthwise", random_weights=True, out_dir=tmp_path))


def test_fp8_without_calibration_data_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    with pytest.raises(CalibrationError, match="--calib-data"):
        make_bundle(MakeRequest(family="timm_xception", precision="fp8", out_dir=tmp_path))


def test_no_weights_names_the_three_options(tmp_path, monkeypatch):
    for var in ("HF_HUB_CACHE", "HF_HOME"):
        monkeypatch.setenv(var, str(tmp_path / "empty"))
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(WeightsError) as info:
        resolve_weights(load_family("timm_xception"))
    message = str(info.value)
    assert "Hugging Face cache" in message and "--checkpoint" in message \
        and "--random-weights" in message


def test_weights_from_the_hf_cache_layout(tmp_path, monkeypatch):
    family = load_family("timm_xception")
    snap = (tmp_path / "models--timm--xception41.tf_in1k" / "snapshots"
            / family.checkpoint.revision)
    snap.mkdir(parents=True)
    from safetensors.numpy import save_file

    save_file({"w": np.ones(3, np.float32)}, str(snap / "model.safetensors"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    weights = resolve_weights(family)
    assert weights.source["kind"] == "checkpoint"
    assert weights.source["revision"] == family.checkpoint.revision
    assert weights.source["sha256"].startswith("sha256:") and "w" in weights.state_dict


def test_checkpoint_must_be_safetensors_and_exclusive(tmp_path):
    family = load_family("timm_xception")
    pickle_file = tmp_path / "model.pth"
    pickle_file.write_bytes(b"not read")
    with pytest.raises(WeightsError, match="safetensors"):
        resolve_weights(family, checkpoint=pickle_file)
    with pytest.raises(WeightsError, match="does not exist"):
        resolve_weights(family, checkpoint=tmp_path / "missing.safetensors")
    with pytest.raises(UsageError, match="exclude each other"):
        resolve_weights(family, checkpoint=pickle_file, random_weights=True)


def test_cli_refusal_is_one_line_and_exit_6(tmp_path):
    result = run("make", "timm_xception", "--precision", "nvfp4", "--random-weights",
                 "--out", str(tmp_path))
    assert result.exit_code == 6
    assert result.stderr.startswith("error: NVFP4") and "Traceback" not in result.output
    assert len(result.stderr.strip().splitlines()) == 1
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    result = run("make", "timm_xception", "--precision", "fp32", "--random-weights",
                 "--out", str(a_file))
    assert result.exit_code == 6 and "is a file, not a folder" in result.stderr


# --- the bundles ------------------------------------------------------------------------

def _graph(path):
    with open_bundle(path) as b:
        return onnx.load_from_string(b.read_member("model.onnx")), dict(b.manifest)


def test_fp8_bundle_has_the_recipe_graph(xception_bundles):
    model, manifest = _graph(xception_bundles["fp8"])
    inits = {i.name: i for i in model.graph.initializer}
    weight_dq = [n for n in model.graph.node if n.op_type == "DequantizeLinear"
                 and n.input[0] in inits
                 and inits[n.input[0]].data_type == onnx.TensorProto.FLOAT8E4M3FN]
    quantize = [n for n in model.graph.node if n.op_type == "QuantizeLinear"]
    assert len(weight_dq) == 43 and len(quantize) == 43
    assert len({n.input[0] for n in quantize}) == 43       # one shared Quantize per tensor
    assert manifest["recipe"]["quantized_layers"] == 43
    assert manifest["calibration"]["method"] == "max"
    assert manifest["source"] == {"kind": "random-weights", "seed": 0}


def test_calibration_member_equals_the_scales_the_graph_uses(xception_bundles):
    """One rule for scales (bundler.fp8.stored_scale): the calibration member records the
    fp16-stored, clamped values the graph holds, bit for bit, tiny channels included."""
    import numpy as np
    from onnx import numpy_helper

    from bundler.calibration.store import calibration_from_safetensors
    from bundler.fp8 import FP16_MIN_NORMAL

    with open_bundle(xception_bundles["fp8"]) as b:
        model = onnx.load_from_string(b.read_member("model.onnx"))
        calib = calibration_from_safetensors(b.read_member("calibration.safetensors"))
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    clamped = 0
    for node, scales in calib.weight_scales.items():
        in_graph = inits[f"{node}.weight_scale"].astype(np.float32)
        assert np.array_equal(in_graph, scales), node
        clamped += int((scales == np.float32(np.float16(FP16_MIN_NORMAL))).sum())
    assert clamped > 0       # random weights: some channels' amax/448 is below fp16's normals
    for tensor, scale in calib.result.scale.items():
        assert float(inits[f"{tensor}_fp8_scale"].astype(np.float32)) == scale, tensor


def test_fp16_graph_is_typed_with_fp32_io(xception_bundles):
    model, _ = _graph(xception_bundles["fp16"])
    io = list(model.graph.input) + list(model.graph.output)
    assert all(t.type.tensor_type.elem_type == onnx.TensorProto.FLOAT for t in io)
    assert all(i.data_type == onnx.TensorProto.FLOAT16 for i in model.graph.initializer
               if i.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)
               and len(i.dims) > 1)


@pytest.mark.parametrize("precision", ["fp32", "fp16", "fp8"])
def test_bundle_verifies_runs_and_matches_its_reference(xception_bundles, precision):
    import onnxruntime as ort

    result = run("verify", str(xception_bundles[precision]))
    assert result.exit_code == 0, result.output
    assert "RANDOM WEIGHTS" in result.output
    assert "RANDOM WEIGHTS" in run("inspect", str(xception_bundles[precision])).output
    from runtime_py.engines.onnxruntime import optimization_level

    with open_bundle(xception_bundles[precision]) as b:
        ref = read_reference(b)
        opts = ort.SessionOptions()
        opts.graph_optimization_level = optimization_level(ort, precision)
        session = ort.InferenceSession(b.read_member("model.onnx"), opts,
                                       providers=["CPUExecutionProvider"])
        quality = b.manifest["quality"]
    x = ref.inputs["input"]
    out = session.run(None, {"input": x})[0]
    np.testing.assert_allclose(out, ref.bundle["logits"], rtol=0, atol=1e-5)
    bound = {"fp32": 1e-5, "fp16": 2e-3, "fp8": 2e-2}[precision]
    assert float(np.abs(out - ref.fp32["logits"]).max()) <= bound
    assert quality["nan_count"] == 0 and float(quality["top1_agreement"]) == 1.0


def test_same_inputs_give_the_same_bundle_bytes(tmp_path):
    paths = []
    for name in ("a", "b"):
        out = tmp_path / name / "new"          # created when the bundle is written
        paths.append(make_bundle(MakeRequest(
            family="timm_xception", precision="fp16", backend="onnxruntime",
            random_weights=True, out_dir=out, reference_count=2)).path)
    assert paths[0].name == paths[1].name == "timm_xception-fp16-1.0.0-onnxruntime.bundle"
    assert paths[0].read_bytes() == paths[1].read_bytes()
    assert not [p for p in tmp_path.rglob("*.partial")]


def test_tensorrt_target_without_tensorrt_is_refused_before_any_work(tmp_path):
    import importlib.util
    import time

    from runtime_py.errors import EngineUnavailableError

    if importlib.util.find_spec("tensorrt") is not None:
        pytest.skip("TensorRT is installed here: the refusal path does not apply")
    started = time.monotonic()
    with pytest.raises(EngineUnavailableError, match=r"trt-bundle\[trt\]"):
        make_bundle(MakeRequest(family="timm_xception", precision="fp16", backend="tensorrt",
                                random_weights=True, out_dir=tmp_path))
    assert time.monotonic() - started < 10          # no export, no graph work first
    assert list(tmp_path.iterdir()) == []
