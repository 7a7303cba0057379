"""`bundle export triton`: every config.pbtxt parsed with Triton's own model_config.proto
(tritonclient's generated module), the engine files byte-equal to the bundle's members,
and the python-backend model.py files run against a test double of Triton's
`triton_python_backend_utils`."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from deploy_bundles import aoti_bundle, ort_bundle, png, trt_bundle  # noqa: E402

import runtime_py  # noqa: E402
from bundler.deploy.triton import TritonOptions, export_triton, model_config_module  # noqa: E402
from runtime_py.errors import CompatibilityError, UsageError  # noqa: E402
from runtime_py.format import open_bundle  # noqa: E402

model_config_pb2 = model_config_module()
if model_config_pb2 is None:
    pytest.skip("needs tritonclient[grpc] (Triton's model_config.proto): "
                "pip install 'trt-bundle[deploy]'", allow_module_level=True)
from google.protobuf import json_format, text_format  # noqa: E402

STUBS = Path(__file__).parent / "stubs"


def parse(folder: Path):
    return text_format.Parse((folder / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())


def params(config) -> dict[str, str]:
    return {k: v.string_value for k, v in config.parameters.items()}


@pytest.fixture
def pb_utils(monkeypatch):
    """Triton's python-backend module, as the test double (only for this test)."""
    monkeypatch.syspath_prepend(str(STUBS))
    import triton_python_backend_utils

    yield triton_python_backend_utils
    sys.modules.pop("triton_python_backend_utils", None)


def load_python_model(folder: Path, config):
    """Import <folder>/1/model.py as Triton does and call initialize with Triton's args."""
    spec = importlib.util.spec_from_file_location(f"triton_model_{folder.name}",
                                                  folder / "1" / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    instance = module.TritonPythonModel()
    group = config.instance_group[0]
    instance.initialize({
        "model_config": json_format.MessageToJson(config, preserving_proto_field_name=True),
        "model_repository": str(folder), "model_version": "1", "model_name": config.name,
        "model_instance_kind": model_config_pb2.ModelInstanceGroup.Kind.Name(group.kind)[5:],
        "model_instance_device_id": "0", "model_instance_name": f"{config.name}_0"})
    return instance


def test_onnxruntime_bundle_becomes_an_onnxruntime_model(tmp_path):
    bundle = ort_bundle(tmp_path)
    models, checked = export_triton([bundle], tmp_path / "repo")
    assert [m.name for m in models] == ["tiny-fp32-1"] and checked == ["tiny-fp32-1"]
    folder = tmp_path / "repo" / "tiny-fp32-1"
    config = parse(folder)
    assert config.backend == "onnxruntime" and config.max_batch_size == 4
    assert config.default_model_filename == "model.onnx"
    assert [(t.name, t.data_type, list(t.dims)) for t in config.input] == [
        ("input", model_config_pb2.TYPE_FP32, [3, 8, 8])]
    assert [(t.name, list(t.dims)) for t in config.output] == [("logits", [4])]
    assert list(config.dynamic_batching.preferred_batch_size) == [2, 4]
    assert config.dynamic_batching.max_queue_delay_microseconds == 2000
    assert config.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_AUTO
    assert not config.HasField("optimization")
    with open_bundle(bundle) as b:
        assert (folder / "1" / "model.onnx").read_bytes() == b.read_member("model.onnx")
        assert params(config)["bundle_id"] == b.id
        assert params(config)["bundle_version"] == b.id[:12]
    assert sorted(p.name for p in (tmp_path / "repo").iterdir()) == ["tiny-fp32-1"]

    # Triton's onnxruntime backend would run exactly this file: same outputs as the runtime.
    import onnxruntime as ort

    x = np.random.default_rng(3).standard_normal((3, 3, 8, 8)).astype(np.float32)
    sess = ort.InferenceSession(str(folder / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    with runtime_py.load(bundle) as model:
        np.testing.assert_allclose(sess.run(None, {"input": x})[0], model.infer(x)["logits"],
                                   rtol=1e-6, atol=1e-6)


def test_fp8_graph_runs_unoptimized_and_options_reach_the_config(tmp_path):
    bundle = ort_bundle(tmp_path, precision="fp8")
    export_triton([bundle], tmp_path / "repo",
                  TritonOptions(max_delay_ms=0.5, instances=3, device="cpu"))
    config = parse(tmp_path / "repo" / "tiny-fp8-1")
    assert config.optimization.graph.level == 2     # the backend's "all optimizations off"
    assert config.dynamic_batching.max_queue_delay_microseconds == 500
    group = config.instance_group[0]
    assert (group.count, group.kind) == (3, model_config_pb2.ModelInstanceGroup.KIND_CPU)


def test_plan_is_checked_against_the_triton_servers_tensorrt_and_gpu(tmp_path):
    bundle = trt_bundle(tmp_path)
    repo = tmp_path / "repo"
    with pytest.raises(UsageError, match="--tensorrt-version and --compute-capability"):
        export_triton([bundle], repo)
    with pytest.raises(CompatibilityError, match=r"sm_90.*sm_89|TensorRT 10.13 != 10.8"):
        export_triton([bundle], repo, TritonOptions(tensorrt_version="10.8.0",
                                                    compute_capability="8.9"))
    assert not repo.exists()                       # nothing written on a refusal
    export_triton([bundle], repo, TritonOptions(tensorrt_version="10.13.0.35",
                                                compute_capability="9.0"))
    folder = repo / "tiny-fp32-1"
    config = parse(folder)
    assert config.backend == "tensorrt" and config.default_model_filename == "model.plan"
    assert config.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_GPU
    assert (folder / "1" / "model.plan").read_bytes() == b"plan bytes built on a GPU host"
    assert config.max_batch_size == 4              # the plan's profile max
    with pytest.raises(UsageError, match="GPU only"):
        export_triton([bundle], tmp_path / "r2", TritonOptions(
            tensorrt_version="10.13.0.35", compute_capability="9.0", device="cpu"))


def test_aoti_bundle_runs_in_the_python_backend(tmp_path, pb_utils):
    bundle = aoti_bundle(tmp_path)
    repo = tmp_path / "repo"
    export_triton([bundle], repo, TritonOptions(runtime_backend="auto"))
    folder = repo / "tiny-fp32-1"
    config = parse(folder)
    assert config.backend == "python"
    assert params(config)["runtime_backend"] == "auto"
    assert (folder / "1" / bundle.name).read_bytes() == bundle.read_bytes()

    # No GPU here: `auto` falls back to the bundle's ONNX graph (the runtime's own rule).
    model = load_python_model(folder, config)
    assert model.model.fallback_reason and "torch-aoti" in model.model.fallback_reason
    rng = np.random.default_rng(0)
    a = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
    b = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    bad = rng.standard_normal((1, 3, 7, 7)).astype(np.float32)
    responses = model.execute([pb_utils.InferenceRequest([pb_utils.Tensor("input", a)]),
                               pb_utils.InferenceRequest([pb_utils.Tensor("input", bad)]),
                               pb_utils.InferenceRequest([pb_utils.Tensor("input", b)])])
    assert len(responses) == 3
    assert responses[1].has_error() and "input 'input'" in responses[1].error().message()
    with runtime_py.load(bundle) as direct:
        for response, x in ((responses[0], a), (responses[2], b)):
            assert not response.has_error()
            out = pb_utils.get_output_tensor_by_name(response, "logits").as_numpy()
            np.testing.assert_allclose(out, direct.infer(x)["logits"], rtol=1e-6, atol=1e-6)
    model.finalize()


def test_aoti_python_model_names_its_engine_and_never_falls_back_silently(tmp_path, pb_utils):
    repo = tmp_path / "repo"
    export_triton([aoti_bundle(tmp_path)], repo)
    folder = repo / "tiny-fp32-1"
    config = parse(folder)
    assert params(config)["runtime_backend"] == "torch-aoti"
    assert config.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_GPU
    with pytest.raises(CompatibilityError, match="GPU"):
        load_python_model(folder, config)


def test_a_cpu_package_gets_a_cpu_instance_group(tmp_path, pb_utils):
    bundle = aoti_bundle(tmp_path, device="cpu")
    export_triton([bundle], tmp_path / "repo")
    config = parse(tmp_path / "repo" / "tiny-fp32-1")
    assert config.backend == "python"
    assert config.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_CPU
    with pytest.raises(UsageError, match="runs on the CPU only"):
        export_triton([bundle], tmp_path / "r2", TritonOptions(device="gpu"))
    assert not (tmp_path / "r2").exists()


def test_preprocessing_becomes_a_python_step_of_an_image_ensemble(tmp_path, pb_utils):
    bundle = ort_bundle(tmp_path, preprocess=True)
    repo = tmp_path / "repo"
    models, checked = export_triton([bundle], repo)
    names = ["tiny-fp32-1", "tiny-fp32-1-preprocess", "tiny-fp32-1-ensemble"]
    assert [m.name for m in models] == names and checked == names
    ens = parse(repo / "tiny-fp32-1-ensemble")
    assert ens.platform == "ensemble" and (repo / "tiny-fp32-1-ensemble" / "1").is_dir()
    assert [(t.name, t.data_type) for t in ens.input] == [("IMAGE", model_config_pb2.TYPE_STRING)]
    steps = ens.ensemble_scheduling.step
    assert [s.model_name for s in steps] == names[1::-1]
    assert steps[0].output_map["input"] == steps[1].input_map["input"]
    assert dict(steps[1].output_map) == {"logits": "logits"}

    pre_config = parse(repo / "tiny-fp32-1-preprocess")
    assert pre_config.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_CPU
    pre = load_python_model(repo / "tiny-fp32-1-preprocess", pre_config)
    images = np.array([[png(1)], [png(2)]], dtype=object)         # TYPE_STRING, dims [1]
    responses = pre.execute([
        pb_utils.InferenceRequest([pb_utils.Tensor("IMAGE", images)]),
        pb_utils.InferenceRequest([pb_utils.Tensor("IMAGE", np.array([[b"not an image"]],
                                                                     dtype=object))])])
    assert responses[1].has_error() and "cannot decode" in responses[1].error().message()
    batch = pb_utils.get_output_tensor_by_name(responses[0], "input").as_numpy()
    with runtime_py.load(bundle) as model:
        np.testing.assert_array_equal(batch, model.preprocess([png(1), png(2)]))
        # The ensemble's second step on that tensor: the bundle's own logits.
        import onnxruntime as ort

        sess = ort.InferenceSession(str(repo / "tiny-fp32-1" / "1" / "model.onnx"),
                                    providers=["CPUExecutionProvider"])
        np.testing.assert_allclose(sess.run(None, {"input": batch})[0],
                                   model.infer(model.preprocess([png(1), png(2)]))["logits"],
                                   rtol=1e-6, atol=1e-6)
    assert json.loads((repo / "tiny-fp32-1-preprocess" / "1" / "preprocess.json").read_text())[
        "input"] == "input"


def test_a_failure_leaves_the_repository_as_it_was(tmp_path):
    good = ort_bundle(tmp_path)
    (tmp_path / "bad").mkdir()
    broken = trt_bundle(tmp_path / "bad")     # refused: no server TensorRT given
    repo = tmp_path / "repo"
    with pytest.raises(UsageError):
        export_triton([good, broken], repo)
    assert not repo.exists()

    export_triton([good], repo)
    before = {p: p.read_bytes() for p in repo.rglob("*") if p.is_file()}
    with pytest.raises(UsageError, match="already exist.*--overwrite"):
        export_triton([good], repo)
    with pytest.raises(UsageError):
        export_triton([good, broken], repo, TritonOptions(overwrite=True))
    assert {p: p.read_bytes() for p in repo.rglob("*") if p.is_file()} == before
    assert [p.name for p in repo.iterdir()] == ["tiny-fp32-1"]     # no staging left
    export_triton([good], repo, TritonOptions(overwrite=True, max_delay_ms=5))
    assert parse(repo / "tiny-fp32-1").dynamic_batching.max_queue_delay_microseconds == 5000


def test_a_full_disk_while_staging_is_exit_6_and_leaves_nothing(tmp_path):
    """The system refusing a write inside the staging folder (no space, quota) is an
    OutputPathError naming the repository, and the folder this run created is gone; other
    OS errors (a missing source file) stay what they are."""
    import errno
    import os

    from bundler.deploy.staging import StagedFolder
    from runtime_py.errors import OutputPathError

    repo = tmp_path / "repo"
    with pytest.raises(OutputPathError, match=r"could not write .*repo: No space left"):
        with StagedFolder(repo) as staged:
            staged.path("model").write_bytes(b"half")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(FileNotFoundError):
        with StagedFolder(repo):
            raise FileNotFoundError(errno.ENOENT, "no such source", "engine.pt2")
    assert list(tmp_path.iterdir()) == []


def test_two_bundles_of_one_model_name_are_refused(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with pytest.raises(UsageError, match="both model 'tiny-fp32-1'"):
        export_triton([ort_bundle(tmp_path / "a"), ort_bundle(tmp_path / "b")], tmp_path / "repo")
    assert not (tmp_path / "repo").exists()


def test_cli_export_triton(tmp_path):
    from click.testing import CliRunner

    from bundler.cli import cli

    bundle = ort_bundle(tmp_path, preprocess=True)
    runner = CliRunner()
    result = runner.invoke(cli, ["export", "triton", str(bundle), "--repo", str(tmp_path / "repo"),
                                 "--instances", "2", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert len(report["models"]) == 3 and len(report["checked_with_triton_schema"]) == 3
    result = runner.invoke(cli, ["export", "triton", str(bundle), "--repo", str(tmp_path / "repo")])
    assert result.exit_code == 6 and "already exist" in result.stderr
    result = runner.invoke(cli, ["export", "triton", str(tmp_path / "missing.bundle"),
                                 "--repo", str(tmp_path / "r2")])
    assert result.exit_code == 4 and not (tmp_path / "r2").exists()
    assert "Traceback" not in result.output
