"""`bundle eval` and `bundle study` on real (random-weights) timm_xception bundles.

Uses the session fixture `xception_bundles`; one fp8 bundle calibrated on a small image
folder is made here by make's own fp8 stage (`bundler.make.fp8_graph`) from the fixture's
fp32/fp16 graphs, so that the calibration-image refusal is tested on what make records.
"""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from bundler.cli import cli
from runtime_py.errors import UsageError


def _write_images(folder, count, seed):
    from PIL import Image

    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:72, 0:96]
    for i in range(count):
        base = np.stack([(xx * (i + 2)) % 256, (yy * 3 + 40 * i) % 256, (xx + yy) % 256], -1)
        img = np.clip(base + rng.normal(0, 20, base.shape), 0, 255).astype(np.uint8)
        Image.fromarray(img).save(folder / f"img{i:02d}.png")


@pytest.fixture(scope="module")
def image_data(tmp_path_factory):
    """calib/: 3 flat images; classes/: 2 classes x 2 images (labels 0, 0, 1, 1)."""
    root = tmp_path_factory.mktemp("eval_images")
    _write_images(root / "calib", 3, seed=1)
    _write_images(root / "classes" / "a_first", 2, seed=2)
    _write_images(root / "classes" / "b_second", 2, seed=3)
    return root


@pytest.fixture(scope="module")
def calibrated_fp8(xception_bundles, image_data, tmp_path_factory):
    """An fp8 bundle whose graph and calibration member make's fp8 stage made from calib/."""
    import onnx

    from bundler.families import load_family
    from bundler.make import MakeRequest, fp8_graph
    from bundler.writer import write_bundle
    from runtime_py.format import open_bundle
    from runtime_py.preprocess import Preprocessor

    family = load_family("timm_xception")
    graphs = {}
    for precision in ("fp32", "fp16"):
        with open_bundle(xception_bundles[precision]) as b:
            graphs[precision] = onnx.load_from_string(b.read_member("model.onnx"))
    with open_bundle(xception_bundles["fp8"]) as b:
        members = {name: b.read_member(name) for name in b.member_names}
        body = {k: v for k, v in b.manifest.items() if k not in ("format", "members")}
        preprocess = Preprocessor(b.preprocess)
    req = MakeRequest(family="timm_xception", precision="fp8", random_weights=True,
                      calib_data=image_data / "calib", calib_count=3, calib_batch=3)
    model, calibration, recipe, record, _layers = fp8_graph(
        family, req, graphs["fp32"], graphs["fp16"],
        preprocess, lambda stage, msg: None)
    members.update({"model.onnx": model, "calibration.safetensors": calibration})
    body.update(recipe=recipe, calibration=record)
    out = tmp_path_factory.mktemp("calibrated_fp8")
    path, _ = write_bundle(out / f"{body['name']}.bundle", body, members)
    return path


def _png_digests(folder):
    import hashlib

    return sorted(hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*.png"))


def test_make_records_each_calibration_image(calibrated_fp8, image_data):
    from bundler.evaluate import calibration_item_digests
    from runtime_py.format import open_bundle

    with open_bundle(calibrated_fp8) as b:
        meta, digests = calibration_item_digests(b)
    assert meta["data_source"] == "folder:calib" and meta["images"] == "3"
    assert sorted(digests) == _png_digests(image_data / "calib")


def test_synthetic_calibration_records_no_items(xception_bundles):
    from bundler.evaluate import calibration_item_digests
    from runtime_py.format import open_bundle

    with open_bundle(xception_bundles["fp8"]) as b:
        meta, digests = calibration_item_digests(b)
    assert meta["data_source"].startswith("synthetic:") and digests is None


def test_eval_refuses_calibration_images(calibrated_fp8, image_data):
    from bundler.evaluate import evaluate_bundle

    with pytest.raises(UsageError, match=r"3 of the 3 selected .*--allow-calibration-images"):
        evaluate_bundle(calibrated_fp8, image_data / "calib")
    # a copy of one calibration image among new ones is caught (identity is the content)
    mixed = image_data / "mixed"
    shutil.copytree(image_data / "classes" / "a_first", mixed)
    shutil.copy(image_data / "calib" / "img01.png", mixed / "zz_copy.png")
    with pytest.raises(UsageError, match="1 of the 3 selected"):
        evaluate_bundle(calibrated_fp8, mixed)
    # stride picks the images to check: every 2nd of calib/ is img00, img02 -> both refused
    with pytest.raises(UsageError, match="2 of the 2 selected"):
        evaluate_bundle(calibrated_fp8, image_data / "calib", stride=2)


def test_cli_refuses_then_allows_calibration_images(calibrated_fp8, image_data, xception_bundles):
    runner = CliRunner()
    refused = runner.invoke(cli, ["eval", str(calibrated_fp8), "--data", str(image_data / "calib")])
    assert refused.exit_code == 6, refused.output
    assert "--allow-calibration-images" in refused.output

    from bundler.evaluate import evaluate_bundle

    report = evaluate_bundle(calibrated_fp8, image_data / "calib", count=1, stress=False,
                             allow_calibration_overlap=True, reference=xception_bundles["fp32"])
    assert report["calibration_overlap"]["overlap"] == 1
    assert report["calibration_overlap"]["allowed"] is True
    assert report["data"]["images"] == 1


def test_eval_on_labelled_folder_per_class(xception_bundles, image_data):
    """CLI --json, fp32 reference rebuilt from the bundle's recorded random-weights seed."""
    # a_first/b_second are not synsets: their labels are asked for by folder order
    result = CliRunner().invoke(cli, ["eval", str(xception_bundles["fp16"]), "--data",
                                      str(image_data / "classes"), "--labels-from",
                                      "folder-order", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)        # progress went to stderr
    assert report["data"] == {**report["data"], "images": 4, "labelled": True,
                              "source": "folder:classes"}
    assert report["reference"]["kind"].startswith("fp32 graph rebuilt")
    assert report["reference"]["check"]["checked"] is True
    assert report["reference"]["check"]["max_abs_diff"] < 1e-3
    q = report["quality"]
    assert q["images"] == 4 and q["nan_count"] == 0 and q["inf_count"] == 0
    assert 0.0 <= q["top1_accuracy"] <= 1.0 and 0.0 <= q["reference_top1_accuracy"] <= 1.0
    assert q["top1_agreement"] == 1.0          # fp16 tracks fp32 on these
    assert 0.0 <= q["kl_mean"] < 1e-3 and q["max_abs_diff"] < 0.1
    stress = report["stress"]
    assert stress["totals"]["images"] == 11 and len(stress["inputs"]) == 11
    assert report["calibration_overlap"]["checked"] == "not calibrated"


def test_eval_refuses_a_reference_of_other_weights(xception_bundles, image_data, tmp_path):
    from bundler.evaluate import evaluate_bundle

    with pytest.raises(UsageError, match="not fp32"):
        evaluate_bundle(xception_bundles["fp8"], image_data / "classes",
                        reference=xception_bundles["fp16"], labels_from="folder-order")


def test_reuse_needs_the_same_inputs(xception_bundles):
    from bundler.families import load_family
    from bundler.make import MakeRequest
    from bundler.reuse import expected_source, reuse_mismatch

    family = load_family("timm_xception")
    same = MakeRequest(family=family.name, precision="fp16", random_weights=True,
                       calib_count=16, reference_count=4)
    path = xception_bundles["fp16"]
    assert reuse_mismatch(path, family, same, "onnxruntime", expected_source(family, same),
                          None) is None
    other_seed = MakeRequest(family=family.name, precision="fp16", random_weights=True, seed=1,
                             calib_count=16, reference_count=4)
    assert "weights differ" in reuse_mismatch(path, family, other_seed, "onnxruntime",
                                              expected_source(family, other_seed), None)
    more_refs = MakeRequest(family=family.name, precision="fp16", random_weights=True,
                            calib_count=16, reference_count=8)
    assert "reference inputs" in reuse_mismatch(path, family, more_refs, "onnxruntime",
                                                expected_source(family, more_refs), None)
    pixels = MakeRequest(family=family.name, precision="fp16", random_weights=True,
                         calib_count=16, reference_count=4, input_dtype="uint8")
    assert "input dtype differs ('float32' vs 'uint8')" in reuse_mismatch(
        path, family, pixels, "onnxruntime", expected_source(family, pixels), None)


def test_reuse_needs_the_static_batch_graphs_the_family_lists(xception_bundles, tmp_path):
    """A torch-aoti bundle made before the family listed torch_aoti.static_batches (or with
    other sizes) is rebuilt by the study, not reused."""
    torch = pytest.importorskip("torch")
    import dataclasses

    from bundler.families import load_family
    from bundler.make import MakeRequest
    from bundler.reuse import expected_source, reuse_mismatch
    from bundler.targets.torch_aoti.build import DEFAULT_COMPILE_OPTIONS, model_code_digest
    from bundler.targets.torch_aoti.settings import cudnn_benchmark_record
    from bundler.writer import write_bundle
    from runtime_py.format import open_bundle

    with open_bundle(xception_bundles["fp32"]) as bundle:
        body = {k: v for k, v in bundle.manifest.items() if k not in ("format", "members")}
        members = {name: bundle.read_member(name) for name in bundle.member_names}
    family = load_family("timm_xception")
    # as the family's settings build it now (its torch_aoti.cudnn_benchmark included)
    timed = family.target_settings("torch-aoti").cudnn_benchmark
    details = {"torch_version": str(torch.__version__), "cuda_version": None,
               "compute_capability": None, "device_name": "cpu", "device": "cpu",
               "compile_options": {"layout": "nchw", "model_code": model_code_digest(),
                                   "inductor": dict(DEFAULT_COMPILE_OPTIONS),
                                   **({"cudnn_benchmark": cudnn_benchmark_record(timed)}
                                      if timed else {})}}
    body["engine"] = {"backend": "torch-aoti", "member": "engine.pt2", "details": details}
    path, _ = write_bundle(tmp_path / "x.bundle", body, {**members, "engine.pt2": b"pt2"})
    # a package of another model form (here the NHWC rewrite) is rebuilt, not reused
    other = json.loads(json.dumps(body))
    other["engine"]["details"]["compile_options"]["layout"] = "nhwc"
    other_path, _ = write_bundle(tmp_path / "y.bundle", other, {**members, "engine.pt2": b"pt2"})
    req = MakeRequest(family=family.name, precision="fp32", random_weights=True,
                      calib_count=16, reference_count=4, target_options={"device": "cpu"})
    source = expected_source(family, req)
    assert reuse_mismatch(path, family, req, "torch-aoti", source, None) is None
    # the package is a CPU one: a build for the GPU (the default device) does not take it
    gpu = dataclasses.replace(req, target_options={})
    assert "device differs ('cpu' vs 'cuda')" in reuse_mismatch(
        path, family, gpu, "torch-aoti", source, None)
    assert "model form differs ('nhwc' vs 'nchw')" in reuse_mismatch(
        other_path, family, req, "torch-aoti", source, None)
    # a package whose Inductor timed its pointwise block sizes (before 2026-12-04) is rebuilt
    tuned = json.loads(json.dumps(body))
    del tuned["engine"]["details"]["compile_options"]["inductor"]["triton.autotune_pointwise"]
    tuned_path, _ = write_bundle(tmp_path / "t.bundle", tuned, {**members, "engine.pt2": b"pt2"})
    assert "Inductor option triton.autotune_pointwise differs (None vs False)" in reuse_mismatch(
        tuned_path, family, req, "torch-aoti", source, None)
    # a package built from other rewrite or kernel code (an editable install between
    # releases: a changed tile table) is rebuilt, as is one from before the digest
    for code, words in (("sha256:" + "0" * 64, "model code (rewrite and kernels) differs "
                                               "('sha256:000"),
                        (None, "model code (rewrite and kernels) differs (None vs 'sha256:")):
        stale = json.loads(json.dumps(body))
        stale["engine"]["details"]["compile_options"]["model_code"] = code
        if code is None:
            del stale["engine"]["details"]["compile_options"]["model_code"]
        stale_path, _ = write_bundle(tmp_path / "c.bundle", stale,
                                     {**members, "engine.pt2": b"pt2"})
        assert words in reuse_mismatch(stale_path, family, req, "torch-aoti", source, None)
    spec = {**family.spec, "torch_aoti": {"static_batches": [1, 32]}}
    static = dataclasses.replace(family, spec=spec)
    assert static.target_settings("torch-aoti").static_batches_for("fp16") == (1, 32)
    assert "static-batch graph list differs ([] vs [1, 32])" in reuse_mismatch(
        path, static, req, "torch-aoti", source, None)


def test_reuse_checks_torch_aoti_bundles_against_torch_cuda_build():
    """A torch-aoti package is checked against torch's CUDA build, which only importing
    torch tells: without it every such bundle read as "CPU-only torch" and was rebuilt (seen
    on the H200)."""
    torch = pytest.importorskip("torch")
    from bundler.reuse import target_host

    assert target_host("torch-aoti").torch_cuda_version == torch.version.cuda
    assert target_host("torch-aoti").torch_version == str(torch.__version__)
    assert target_host("onnxruntime").torch_cuda_version is None   # no torch import for ORT


def test_study_on_the_fixture_bundles(xception_bundles, tmp_path):
    from bundler.study import run_study

    for path in xception_bundles.values():
        shutil.copy(path, tmp_path / path.name)
    stages = []
    study = run_study("timm_xception", precisions=("fp16", "fp8"), batch_sizes=(1,),
                      out_dir=tmp_path, random_weights=True, calib_count=16, reference_count=4,
                      eval_count=6,
                      timing={"warmup": 0, "min_calls": 1, "min_seconds": 0, "max_seconds": 0},
                      command="pytest", progress=lambda stage, msg: stages.append(stage),
                      peer="eager")
    assert "build" not in stages and stages.count("reuse") == 3
    assert study["eval"]["images"] == 6   # synthetic, held out: seed 2000003, not the references
    assert "seed=2000003" in study["eval"]["source"] and "count=6" in study["eval"]["source"]
    assert {"reuse", "reference", "time", "eval", "peer", "report"} <= set(stages)
    # the peer (no GPU here: fp32 eager torch with the bundles' weights) is the fp32 model
    # the reference graph was exported from: it agrees with it
    peer = study["peer"]
    assert peer["ran_on"].startswith("cpu") and peer["quality"]["top1_agreement"] == 1.0
    assert peer["quality"]["max_abs_diff"] < 1e-3
    assert [f["boundary"] for f in peer["timings"]] == ["engine"]
    assert [(r["bundle"], r["batch_size"]) for r in study["peer_ratios"]] == [("fp16", 1),
                                                                               ("fp8", 1)]
    for r in study["peer_ratios"]:
        assert r["ratio"] == pytest.approx(r["peer_ms"] / r["bundle_ms"])

    saved = json.loads((tmp_path / "study.json").read_text())
    assert saved["files"] == study["files"] and saved["ratios"] == study["ratios"]
    for key in ("family", "settings", "environment", "bundles", "ratios", "eval", "reference",
                "stress_inputs", "files"):
        assert key in saved
    assert [b["label"] for b in saved["bundles"]] == ["fp32", "fp16", "fp8"]
    assert all(b["reused"] for b in saved["bundles"])
    for b in saved["bundles"]:
        assert b["timings"][0]["boundary"] == "engine" and b["timings"][0]["batch_size"] == 1
        assert b["sizes"]["bundle_bytes"] > 0 and b["sizes"]["engine_member"] == "model.onnx"
        assert b["quality"]["nan_count"] == 0
    assert saved["bundles"][2]["recipe"]["quantized_layers"] == 43
    [ratio] = saved["ratios"]
    assert (ratio["batch_size"], ratio["numerator"], ratio["denominator"]) == (1, "fp16", "fp8")
    assert ratio["ratio"] == pytest.approx(ratio["fp16_ms"] / ratio["fp8_ms"])
    env = saved["environment"]
    assert env["command"] == "pytest" and env["cpu_cores"] >= 1 and env["packages"]["numpy"]

    md = (tmp_path / "study.md").read_text()
    assert "fp16 time / fp8 time" in md and "RANDOM WEIGHTS" in md and "## Environment" in md
    assert "## Against the peer" in md and "peer: eager" in md
    assert "static-batch graphs" in md            # none here: ONNX Runtime bundles
    try:
        import matplotlib
    except ImportError:
        assert "matplotlib" in saved["files"]["plot_skipped"]
    else:
        assert (tmp_path / "study.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert matplotlib.__version__ in saved["environment"]["packages"]["matplotlib"]


@pytest.mark.slow
def test_a_uint8_study_builds_pixel_bundles_and_feeds_the_peer_the_same_pixels(tmp_path):
    """`bundle study --input uint8`: every bundle (the fp32 reference too) takes uint8 NHWC
    pixels, the evaluation pictures and stress set are pixels, and the peer normalizes the
    same pixels itself, so it agrees with the pixel-input reference; a second run reuses the
    bundles, and the float32 bundles of the same folder are not taken for them."""
    from bundler.study import run_study

    stages = []
    kwargs = dict(precisions=("fp16",), batch_sizes=(2,), out_dir=tmp_path, random_weights=True,
                  calib_count=16, reference_count=4, eval_count=4, command="pytest",
                  timing={"warmup": 0, "min_calls": 1, "min_seconds": 0, "max_seconds": 0},
                  progress=lambda stage, msg: stages.append((stage, msg)), peer="eager")
    study = run_study("timm_xception", input_dtype="uint8", **kwargs)
    builds = [m for s, m in stages if s == "build" and ": building (" in m]
    assert len(builds) == 2 and "no earlier bundle" in builds[0] and study["settings"]["input_dtype"] == "uint8"
    names = [Path(b["path"]).name for b in study["bundles"]]
    assert names == ["timm_xception-fp32-uint8-1.0.0-onnxruntime.bundle",
                     "timm_xception-fp16-uint8-1.0.0-onnxruntime.bundle"]
    assert study["reference"]["kind"] == "fp32 bundle"
    assert "black" in study["stress_inputs"] and "zeros" not in study["stress_inputs"]
    fp16 = study["bundles"][1]
    assert fp16["quality"]["nan_count"] == 0 and fp16["quality"]["top1_agreement"] >= 0.75
    peer = study["peer"]
    assert peer["input"] == "uint8" and "normalized on the host" in peer["note"]
    assert peer["quality"]["top1_agreement"] == 1.0 and peer["quality"]["max_abs_diff"] < 1e-3
    assert "Input: uint8 NHWC pixels" in (tmp_path / "study.md").read_text()

    stages.clear()
    again = run_study("timm_xception", input_dtype="uint8", **kwargs)
    assert [s for s, _m in stages].count("reuse") == 2 and "build" not in dict(stages)
    assert again["eval"]["digest"] == study["eval"]["digest"]
    with pytest.raises(UsageError, match="--input 'int8'"):
        run_study("timm_xception", input_dtype="int8", **kwargs)
    import bundler.cli
    import bundler.make

    assert bundler.cli.INPUT_DTYPES == bundler.make.INPUT_DTYPES


def test_the_pixel_peer_normalizes_as_the_bundles_head_does():
    """The peer of a uint8 study gets NHWC pixels and normalizes them in its compiled
    function: the same logits as the model on `Preprocessor.normalize`'s tensor (the
    arithmetic the engine head and the host reference use); float32 input is cast only."""
    import torch

    from bundler.families import load_family
    from bundler.peer import make_peer, peer_forward
    from runtime_py.preprocess import Preprocessor, pixel_input_spec

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.AdaptiveAvgPool2d(1),
                                torch.nn.Flatten()).eval()
    pre = Preprocessor(pixel_input_spec(load_family("timm_xception").preprocessing_spec()))
    pixels = np.random.default_rng(0).integers(0, 256, (2, 9, 7, 3), dtype=np.uint8)
    with torch.no_grad():
        want = model(torch.from_numpy(pre.normalize(pixels))).numpy()
        got = peer_forward(model, torch.float32, pre.pixel_scale_bias)(torch.from_numpy(pixels))
        assert got.dtype == torch.float32 and got.shape == (2, 4)
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, atol=1e-6)
        floats = torch.from_numpy(pre.normalize(pixels))
        np.testing.assert_array_equal(peer_forward(model, torch.float32)(floats).numpy(),
                                      model(floats).numpy())
    if not torch.cuda.is_available():     # the CPU peer: the same host arithmetic
        peer = make_peer("torch-compile", model, pre.spec)
        assert peer.host_dtype == "uint8"
        np.testing.assert_allclose(peer.infer(pixels), want, rtol=1e-6, atol=1e-6)


def test_time_model_uses_device_timings_when_the_runner_offers_them():
    from bundler.study import CPU_TIMING, GPU_TIMING, speed_ratios, time_model
    from runtime_py.tensors import TensorSpec

    class GpuRunner:
        def device_timings(self, batch_size, iterations, warmup):
            return {"graph_replay": [0.001 * batch_size] * iterations,
                    "with_copies": [0.002 * batch_size] * iterations}

        def infer(self, feeds):
            raise AssertionError("a GPU runner with device_timings is not timed through infer")

    class FakeModel:
        runner = GpuRunner()
        inputs = [TensorSpec("input", "float32", ("batch", 3, 4, 4))]

    timing = {**CPU_TIMING, **GPU_TIMING, "iterations": 5}
    figures = time_model(FakeModel(), [1, 4], timing)
    assert [(f["boundary"], f["batch_size"], f["calls"]) for f in figures] == [
        ("graph_replay", 1, 5), ("with_copies", 1, 5), ("graph_replay", 4, 5), ("with_copies", 4, 5)]
    assert figures[2]["median_ms"] == pytest.approx(4.0)

    slower = [dict(f, median_ms=f["median_ms"] * 1.25) for f in figures]
    bundles = [{"label": "fp16", "precision": "fp16", "variant": None, "timings": slower},
               {"label": "fp8", "precision": "fp8", "variant": None, "timings": figures},
               {"label": "fp8-depthwise", "precision": "fp8", "variant": "fp8-depthwise",
                "timings": figures}]
    ratios = speed_ratios(bundles, [1, 4])
    assert len(ratios) == 8  # 2 fp8 bundles x 2 batch sizes x 2 boundaries
    assert all(r["ratio"] == pytest.approx(1.25) for r in ratios)


FAST_TIMING = {"warmup": 0, "min_calls": 1, "min_seconds": 0, "max_seconds": 0}


def test_study_labels_per_class_eval_folders_as_eval_does(xception_bundles, image_data, tmp_path):
    from bundler.study import run_study
    from runtime_py.errors import CalibrationError

    for path in xception_bundles.values():
        shutil.copy(path, tmp_path / path.name)
    common = dict(precisions=("fp16",), batch_sizes=(1,), out_dir=tmp_path, random_weights=True,
                  calib_count=16, reference_count=4, eval_data=image_data / "classes",
                  eval_count=4, timing=FAST_TIMING)
    # a_first/b_second are not synsets: refused as eval refuses them, naming --eval-data
    with pytest.raises(CalibrationError, match="--eval-data has per-class folders .*"
                                               "--labels-from folder-order"):
        run_study("timm_xception", **common)
    study = run_study("timm_xception", labels_from="folder-order", **common)
    assert study["eval"]["labelled"] is True and study["eval"]["images"] == 4
    for bundle in study["bundles"]:
        assert 0.0 <= bundle["quality"]["top1_accuracy"] <= 1.0, bundle["label"]


def test_study_and_eval_share_one_labels_from_option(tmp_path):
    eval_option, study_option = (next(p for p in cli.commands[c].params if p.name == "labels_from")
                                 for c in ("eval", "study"))
    assert eval_option.type.choices == study_option.type.choices
    assert eval_option.help == study_option.help and eval_option.default == "auto"
    out = tmp_path / "study"
    result = CliRunner().invoke(cli, ["study", "timm_xception", "--random-weights",
                                      "--labels-from", "folder-index", "--out", str(out)])
    assert result.exit_code == 6 and "Traceback" not in result.output
    assert "pass --eval-data DIR, or leave --labels-from out" in result.stderr
    assert not out.exists()


def test_reuse_needs_the_fp8_convolution_form_the_family_names(xception_bundles, tmp_path,
                                                               monkeypatch):
    """A torch-aoti fp8 bundle built with another k x k convolution form than the family's
    torch_aoti.fp8_conv (or $TRT_BUNDLE_FP8_CONV) asks for is rebuilt, not reused."""
    pytest.importorskip("torch")
    import dataclasses

    from bundler.families import load_family
    from bundler.make import MakeRequest
    from bundler.reuse import expected_source, reuse_mismatch
    from bundler.targets.torch_aoti.build import (FP8_CONV_DESCRIPTIONS, FP8_CONV_ENV)
    from bundler.writer import write_bundle
    from runtime_py.compat import GpuInfo, HostInfo
    from runtime_py.format import open_bundle

    with open_bundle(xception_bundles["fp8"]) as bundle:
        body = {k: v for k, v in bundle.manifest.items() if k not in ("format", "members")}
        members = {name: bundle.read_member(name) for name in bundle.member_names}
    from bundler.targets.torch_aoti.build import (DEFAULT_COMPILE_OPTIONS,
                                                  FP8_GEMM_DESCRIPTIONS, model_code_digest,
                                                  SMALL_BATCH_POINTWISE_DESCRIPTIONS,
                                                  layout_description)

    # as the shipped family builds it: the channels_last form (its depthwise layers the
    # Triton kernel's, some 1x1 layers and skip adds on its GEMM), with batch-1 (the NHWC
    # rewrite, its 1x1 GEMMs dequantized) and batch-32 graphs, cuDNN's algorithms timed in
    # the batch-32 graph's warm-up
    details = {"torch_version": "2.11.0+cu130", "cuda_version": "13.0",
               "compute_capability": "9.0", "device_name": "NVIDIA H200", "device": "cuda",
               "compile_options": {"inductor": dict(DEFAULT_COMPILE_OPTIONS),
                                   "model_code": model_code_digest(),
                                   "layout": layout_description(
                                       "fp8", nhwc=False, channels_last=True,
                                       depthwise="triton-skip"),
                                   "small_batch_layout": "nhwc, channels padded to multiples "
                                                         "of 16 (static graphs of batch 1)",
                                   "fp8_conv": FP8_CONV_DESCRIPTIONS["im2col"],
                                   "fp8_pointwise_small_batch":
                                       SMALL_BATCH_POINTWISE_DESCRIPTIONS["dequantized"],
                                   "fp8_gemm": FP8_GEMM_DESCRIPTIONS["rowwise-fp16"],
                                   "fp8_fast_accum": False,
                                   "cudnn_benchmark": [32]},
               "static_batches": [1, 32]}
    h200 = HostInfo(gpus=(GpuInfo("NVIDIA H200", (9, 0)),), torch_version="2.11.0",
                    torch_cuda_version="13.0")   # where the bundle runs
    body["engine"] = {"backend": "torch-aoti", "member": "engine.pt2", "details": details}
    path, _ = write_bundle(tmp_path / "x.bundle", body, {**members, "engine.pt2": b"pt2"})
    family = load_family("timm_xception")
    cal = body["calibration"]
    req = MakeRequest(family=family.name, precision="fp8", random_weights=True,
                      calib_count=16, reference_count=4, calib_method=cal["method"])
    source = expected_source(family, req)
    monkeypatch.delenv(FP8_CONV_ENV, raising=False)
    assert reuse_mismatch(path, family, req, "torch-aoti", source, cal["data_digest"], h200) is None
    fused = dataclasses.replace(family, spec={**family.spec, "torch_aoti": {
        **family.spec["torch_aoti"], "fp8_conv": "triton-fused"}})
    assert "fp8 convolution form differs ('im2col' vs 'triton-fused')" in reuse_mismatch(
        path, fused, req, "torch-aoti", source, cal["data_digest"], h200)
    monkeypatch.setenv(FP8_CONV_ENV, "im2col")            # one build's override: reused
    assert reuse_mismatch(path, fused, req, "torch-aoti", source, cal["data_digest"], h200) is None
    # the NHWC rewrite (torch_aoti.fp8_layout nhwc) is another model: rebuilt; so are
    # another depthwise form (fp8_depthwise cudnn) and a batch-1 graph of the
    # channels_last form (small_batch_layout same)
    monkeypatch.delenv(FP8_CONV_ENV)
    for change, words in (({"fp8_layout": "nhwc"}, "model form differs ('channels_last"),
                          ({"fp8_depthwise": "cudnn"}, "model form differs ('channels_last"),
                          ({"small_batch_layout": "same"},
                           "small-batch graph form differs ('nhwc, channels padded")):
        other = dataclasses.replace(family, spec={**family.spec, "torch_aoti": {
            **family.spec["torch_aoti"], **change}})
        assert words in reuse_mismatch(path, other, req, "torch-aoti", source,
                                       cal["data_digest"], h200)
    # the FP8 GEMMs' form: the family's earlier rowwise (bf16 out) package is rebuilt since
    # family.json names rowwise-fp16; a build asking for fast accumulation rebuilds too
    bf16 = json.loads(json.dumps(body))
    bf16["engine"]["details"]["compile_options"]["fp8_gemm"] = FP8_GEMM_DESCRIPTIONS["rowwise"]
    bf16_path, _ = write_bundle(tmp_path / "b.bundle", bf16, {**members, "engine.pt2": b"pt2"})
    assert "fp8 GEMM form differs ('rowwise' vs 'rowwise-fp16')" in reuse_mismatch(
        bf16_path, family, req, "torch-aoti", source, cal["data_digest"], h200)
    fast = dataclasses.replace(req, target_options={"fp8_fast_accum": True})
    assert "fp8 fast accumulation differs (False vs True)" in reuse_mismatch(
        path, family, fast, "torch-aoti", source, cal["data_digest"], h200)


def test_the_study_report_names_each_torch_aoti_bundle_s_model_form():
    """The Sizes table says how each engine holds the model (the details' layout, and the
    small static graphs' form where it differs); "-" where the target records none."""
    from bundler.study_report import _model_form

    cl = {"engine_details": {"compile_options": {
        "layout": "channels_last (the model as it is)",
        "small_batch_layout": "nhwc (static graphs of batch 1)"}}}
    assert _model_form(cl) == "channels_last (the model as it is); nhwc (static graphs of batch 1)"
    assert _model_form({"engine_details": {"compile_options": {"layout": "nhwc"}}}) == "nhwc"
    assert _model_form({"engine_details": {}}) == "-" == _model_form({})


def test_reuse_of_a_vit_fp8_bundle_needs_the_small_batch_gemm_form_the_family_names(
        xception_bundles, tmp_path, monkeypatch):
    """A layout as_is family (timm_vit_base) compares the small-batch form of its FP8 Linear
    layers too: a package whose batch-1 graph runs them dequantized is reused for a family
    that asks for it and rebuilt for one that does not (the check was skipped for as_is
    families before they could have the form)."""
    pytest.importorskip("torch")
    import dataclasses

    from bundler.families import load_family
    from bundler.make import MakeRequest, reference_set
    from bundler.reuse import expected_source, reuse_mismatch
    from bundler.targets.torch_aoti.build import (DEFAULT_COMPILE_OPTIONS, FP8_CONV_ENV,
                                                  engine_details)
    from bundler.writer import write_bundle
    from runtime_py.compat import GpuInfo, HostInfo
    from runtime_py.format import open_bundle

    vit = load_family("timm_vit_base")
    small = dataclasses.replace(vit, spec={**vit.spec, "torch_aoti": {
        **vit.spec["torch_aoti"], "static_batches": {"fp8": [1]},
        "fp8_pointwise_small_batch": "dequantized"}})
    with open_bundle(xception_bundles["fp8"]) as bundle:     # its members, relabelled
        body = {k: v for k, v in bundle.manifest.items() if k not in ("format", "members")}
        members = {name: bundle.read_member(name) for name in bundle.member_names}
    cal = body["calibration"]
    req = MakeRequest(family=vit.name, precision="fp8", random_weights=True,
                      calib_count=16, reference_count=4, calib_method=cal["method"])
    host = {"torch_version": "2.11.0+cu130", "cuda_version": "13.0",
            "compute_capability": "9.0", "device_name": "NVIDIA H200", "device": "cuda"}
    details = engine_details(host, "fp8", DEFAULT_COMPILE_OPTIONS, nhwc=False, fast_accum=False, padding={},
                             batch_sizes=[1, 32], seconds=None, fp8_gemm="rowwise-fp16",
                             layout="as_is", static_batches=[1],
                             small_batch_pointwise="dequantized")
    details["static_batches"] = [1]
    body.update(family={"name": vit.name, "version": vit.version},
                source=expected_source(vit, req),
                recipe={**body["recipe"], "digest": "sha256:" + vit.recipe_digest(None)},
                engine={"backend": "torch-aoti", "member": "engine.pt2", "details": details})
    body["quality"] = {**body["quality"], "images": req.reference_count,
                       "inputs_source": reference_set(vit, req).source}
    path, _ = write_bundle(tmp_path / "v.bundle", body, {**members, "engine.pt2": b"pt2"})
    h200 = HostInfo(gpus=(GpuInfo("NVIDIA H200", (9, 0)),), torch_version="2.11.0",
                    torch_cuda_version="13.0")
    assert reuse_mismatch(path, small, req, "torch-aoti", body["source"], cal["data_digest"],
                          h200) is None
    gemm = dataclasses.replace(small, spec={**small.spec, "torch_aoti": {
        **small.spec["torch_aoti"], "fp8_pointwise_small_batch": "gemm"}})
    assert "fp8 small-batch GEMM form differs ('dequantized' vs 'gemm')" in reuse_mismatch(
        path, gemm, req, "torch-aoti", body["source"], cal["data_digest"], h200)
    # the MLPs' form: this package's are separate; a family that fuses them rebuilds
    monkeypatch.delenv(FP8_CONV_ENV, raising=False)
    fused = dataclasses.replace(gemm, spec={**gemm.spec, "torch_aoti": {
        **gemm.spec["torch_aoti"], "fp8_conv": "triton-fused"}})
    assert "fp8 MLP form differs ('separate' vs 'triton-fused')" in reuse_mismatch(
        path, fused, req, "torch-aoti", body["source"], cal["data_digest"], h200)


def test_the_recorded_fp8_conv_form_names_the_form_it_was_built_with():
    """``compile_options.fp8_conv`` and ``bundle study``'s reuse check share one rule:
    an image family's recorded form names its fp8_conv back; a layout as_is family
    records only fused MLPs; nothing is recorded below fp8."""
    pytest.importorskip("torch")
    from bundler.targets.torch_aoti.build import (FP8_CONV_DESCRIPTIONS, fp8_conv_named,
                                                  fp8_conv_recorded)

    for name in FP8_CONV_DESCRIPTIONS:
        assert fp8_conv_named("nhwc", fp8_conv_recorded("fp8", "nhwc", name)) == name
    assert fp8_conv_named("nhwc", "a form of another version") == "a form of another version"
    assert fp8_conv_recorded("fp8", "as_is", "im2col") is None
    assert fp8_conv_named("as_is", None) == "separate"
    assert fp8_conv_named("as_is", fp8_conv_recorded("fp8", "as_is", "triton-fused")) \
        == "triton-fused"
    assert fp8_conv_recorded("fp16", "nhwc", "triton") is None
