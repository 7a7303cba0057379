"""What a new user reads when something is off: each message names the option they gave,
the job, the file, and what to run instead (issue 17)."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent))
from synthetic_bundles import write_source_bundle  # noqa: E402

import runtime_py  # noqa: E402
from bundler.calibration.data import CALIBRATION, EVALUATION, open_calibration_data  # noqa: E402
from bundler.class_labels import class_folder_rule  # noqa: E402
from bundler.cli import cli  # noqa: E402
from bundler.evaluate import open_eval_data  # noqa: E402
from bundler.families import load_family  # noqa: E402
from runtime_py.errors import CalibrationError, CompatibilityError, WeightsError  # noqa: E402

FAMILY = load_family("timm_xception")
SPEC = FAMILY.preprocessing_spec()


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args))


def jpeg(seed: int = 0, size=(40, 30)) -> bytes:
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 255, (*size, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG")
    return out.getvalue()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return write_source_bundle(tmp_path_factory.mktemp("tiny"))


# --- rebuild --backend torch-aoti ----------------------------------------------------------

def test_rebuild_for_torch_aoti_of_an_unknown_family_is_refused(tiny, tmp_path):
    out = tmp_path / "out"
    res = invoke("rebuild", str(tiny), "--backend", "torch-aoti", "--out", str(out))
    assert res.exit_code == 6, res.output
    assert "unknown family 'tiny'" in res.output and "Traceback" not in res.output
    assert not out.exists()


def test_rebuild_for_torch_aoti_without_the_weights_names_what_to_pass(tmp_path, monkeypatch):
    from bundler.rebuild import rebuild_weights

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-home"))
    monkeypatch.setenv("HOME", str(tmp_path))
    source = {"kind": "checkpoint", "id": FAMILY.checkpoint.hf_id, "file": "model.safetensors",
              "sha256": "sha256:" + "ab" * 32}
    with pytest.raises(WeightsError, match="pass --checkpoint FILE.safetensors") as info:
        rebuild_weights(FAMILY, source)
    assert "abababababababab" in str(info.value)
    other = tmp_path / "other.safetensors"
    other.write_bytes(b"not the checkpoint")
    with pytest.raises(WeightsError, match="not the checkpoint this bundle was made from"):
        rebuild_weights(FAMILY, source, other)
    seeded = rebuild_weights(FAMILY, {"kind": "random-weights", "seed": 7})
    assert seeded.seed == 7 and seeded.state_dict is None


# --- a GPU backend asked for on another target's bundle -----------------------------------

@pytest.mark.parametrize("backend, engine", [("tensorrt", "a TensorRT plan"),
                                             ("torch-aoti", "an AOTInductor package")])
def test_gpu_backend_on_an_onnxruntime_bundle_says_what_it_holds(tiny, backend, engine):
    with pytest.raises(CompatibilityError) as info:
        runtime_py.load(tiny, backend=backend)
    message = str(info.value)
    assert f"holds an onnxruntime engine (model.onnx), not {engine}" in message
    assert "--backend onnxruntime" in message and f"--backend {backend}" in message
    assert "engine is a TensorRT plan" not in message
    # only a target compiled from the torch model needs the weights to rebuild
    assert ("--checkpoint FILE" in message) == (backend == "torch-aoti")


def test_bench_json_says_a_cpu_engine_has_no_copies_to_time(tiny):
    res = invoke("bench", str(tiny), "--batch-sizes", "1", "--min-seconds", "0.05",
                 "--no-end-to-end", "--json")
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["backend"] == "onnxruntime"
    assert report["notes"] == ["copies: not applicable (CPU engine, no device)"]
    with runtime_py.load(tiny) as model:
        assert model.runner.on_gpu is False     # ONNX Runtime on its CPU provider


def test_bench_with_backend_tensorrt_on_an_onnxruntime_bundle_exits_5(tiny):
    res = invoke("bench", str(tiny), "--backend", "tensorrt", "--batch-sizes", "1")
    assert res.exit_code == 5
    assert "holds an onnxruntime engine" in res.output


# --- precisions no family builds --------------------------------------------------------------

@pytest.mark.parametrize("family", ["timm_vit_base", "timm_resnet50"])
@pytest.mark.parametrize("spelling", ["nvfp4", "NVFP4"])
def test_nvfp4_is_refused_with_what_to_do_instead(family, spelling, tmp_path):
    out = tmp_path / "out"
    res = invoke("make", family, "--precision", spelling, "--random-weights", "--out", str(out))
    assert res.exit_code == 6 and "Traceback" not in res.output
    message = res.stderr.strip()
    assert message.startswith("error: NVFP4 is not a precision trt-bundle builds")
    assert "use --precision fp8" in message
    assert f"{family}'s precisions are fp32, fp16, fp8" in message
    assert "Blackwell GPU (compute capability 10.0 or newer)" in message
    assert "TensorRT 10.8 or later" in message and "H200" in message
    assert "convolution" not in message                          # not a family's kind of compute
    assert not out.exists()


# --- missing weights -------------------------------------------------------------------------

def test_missing_weights_give_the_hf_download_command(tmp_path, monkeypatch):
    from bundler.weights import resolve_weights

    for var in ("HF_HUB_CACHE", "HF_HOME"):
        monkeypatch.setenv(var, str(tmp_path / "empty"))
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(WeightsError) as info:
        resolve_weights(FAMILY)
    rev = FAMILY.checkpoint.revision
    assert f"hf download timm/xception41.tf_in1k model.safetensors --revision {rev}" \
        in str(info.value)
    assert "huggingface-cli" not in str(info.value)


def test_the_hf_command_takes_those_arguments():
    if shutil.which("hf") is None:
        pytest.skip("huggingface_hub's `hf` command is not installed here")
    res = subprocess.run(["hf", "download", "--help"], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0
    assert "REPO_ID [FILENAMES]..." in res.stdout and "--revision" in res.stdout


# --- evaluation data: the option given, the job ---------------------------------------------

def test_eval_missing_data_names_data_and_evaluation(tmp_path):
    with pytest.raises(CalibrationError) as info:
        open_eval_data(tmp_path / "missing", SPEC)
    message = str(info.value)
    assert "evaluation data" in message and "give --data" in message
    assert "calib" not in message


def test_eval_empty_folder_says_no_evaluation_images(tmp_path):
    with pytest.raises(CalibrationError, match="no evaluation images found"):
        open_eval_data(tmp_path, SPEC)
    with pytest.raises(CalibrationError, match="--count must be >= 1"):
        open_eval_data(tmp_path, SPEC, count=-1)


@pytest.mark.slow
def test_eval_cli_on_a_missing_folder(xception_bundles, tmp_path):
    res = invoke("eval", str(xception_bundles["fp16"]), "--data", str(tmp_path / "missing"))
    assert res.exit_code == 6
    assert "evaluation data" in res.output and "--data" in res.output
    assert "--calib-data" not in res.output


# --- a bad image is named: the file, or the shard and its member -------------------------------

def test_bad_image_in_a_folder_names_the_file(tmp_path):
    (tmp_path / "good.jpg").write_bytes(jpeg())
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"\xff\xd8 not really a jpeg")
    with pytest.raises(CalibrationError) as info:
        open_calibration_data(tmp_path, lambda im: np.zeros((3, 2, 2), np.float32))
    message = str(info.value)
    assert str(bad) in message and "not a JPEG, PNG, BMP or WEBP image" in message
    assert "BytesIO" not in message and message.startswith("calibration image")


def test_bad_image_in_a_shard_names_the_shard_and_member(tmp_path):
    shard = tmp_path / "val-000.tar"
    with tarfile.open(shard, "w") as tar:
        for name, data in (("s/0001.jpg", jpeg()), ("s/0002.jpg", b"garbage bytes")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with pytest.raises(CalibrationError) as info:
        open_eval_data(shard, SPEC)
    message = str(info.value)
    assert f"member 's/0002.jpg' of shard {shard}" in message
    assert message.startswith("evaluation image 's/0002'") and "BytesIO" not in message


# --- per-class folders -> class indices ------------------------------------------------------

def class_folders(root: Path, names: list[str]) -> Path:
    for i, name in enumerate(names):
        (root / name).mkdir(parents=True)
        (root / name / "a.jpg").write_bytes(jpeg(i))
    return root


def test_synset_folders_map_to_their_imagenet_classes(tmp_path):
    root = class_folders(tmp_path, ["n02123045", "n07920052"])  # tabby cat, espresso
    data = open_eval_data(root, SPEC, family="timm_xception")
    assert data.labels.tolist() == [281, 967]


def test_class_ids_are_timms_synsets_in_label_order():
    ids = FAMILY.class_ids()
    assert len(ids) == 1000 and ids[0] == "n01440764" and ids[281] == "n02123045"
    timm_data = pytest.importorskip("timm.data")
    info = timm_data.ImageNetInfo()
    assert ids == list(info.label_names())
    from bundler.make import labels_for

    labels = labels_for(FAMILY)              # what the bundle's labels.msgpack holds
    assert labels[281].startswith("tabby") and labels[967].startswith("espresso")


def test_other_folder_names_must_be_explicit(tmp_path):
    root = class_folders(tmp_path, ["cats", "dogs"])
    with pytest.raises(CalibrationError) as info:
        open_eval_data(root, SPEC, family="timm_xception")
    message = str(info.value)
    assert "'cats'" in message and "--labels-from folder-order" in message
    assert open_eval_data(root, SPEC, family="timm_xception",
                          labels_from="folder-order").labels.tolist() == [0, 1]
    assert open_eval_data(root, SPEC, family="timm_xception", labels_from="none").labels is None


def test_folder_index_rule(tmp_path):
    root = class_folders(tmp_path, ["12", "3"])
    assert open_eval_data(root, SPEC, family="timm_xception",
                          labels_from="folder-index").labels.tolist() == [12, 3]
    with pytest.raises(CalibrationError, match="class indices 0..999"):
        class_folder_rule("folder-index", None, 1000)(["3", "1000"])


def test_a_family_without_class_ids_refuses_folder_names(tmp_path):
    root = class_folders(tmp_path, ["n02123045"])
    with pytest.raises(CalibrationError, match="lists no class ids"):
        open_eval_data(root, SPEC, family="no_such_family")


def test_calibration_keeps_folder_order(tmp_path):
    root = class_folders(tmp_path, ["cats", "dogs"])
    data = open_calibration_data(root, lambda im: np.zeros((3, 2, 2), np.float32))
    assert data.labels.tolist() == [0, 1] and data.role == CALIBRATION != EVALUATION


# --- inspect --json: numbers -------------------------------------------------------------------

@pytest.mark.slow
def test_inspect_json_gives_numbers(xception_bundles):
    res = invoke("inspect", "--json", str(xception_bundles["fp8"]))
    summary = json.loads(res.output)
    quality = summary["quality"]
    for key in ("top1_agreement", "kl_mean", "max_abs_diff"):
        assert isinstance(quality[key], float), key
    assert all(isinstance(m["ratio"], float) for m in summary["members"])
    assert 0.0 <= quality["top1_agreement"] <= 1.0


# --- progress on stderr, JSON alone on stdout -------------------------------------------------

def test_bench_progress_goes_to_stderr_and_json_stays_clean(tiny):
    runner = CliRunner(mix_stderr=False) if "mix_stderr" in CliRunner.__init__.__code__.co_varnames \
        else CliRunner()
    res = runner.invoke(cli, ["bench", str(tiny), "--batch-sizes", "1,2", "--min-seconds",
                              "0.01", "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert len(report["figures"]) == 2
    assert "[bench] engine, batch 1: measuring" in res.stderr
    assert "[bench] engine, batch 2: median" in res.stderr
