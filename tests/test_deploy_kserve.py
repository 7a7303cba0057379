"""`bundle export kserve`: manifests checked against the KServe SDK's models, and the
container entrypoint that verifies the fetched bundle before `bundle serve` starts."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from deploy_bundles import aoti_bundle, ort_bundle, trt_bundle  # noqa: E402

from bundler.deploy import kserve_entrypoint  # noqa: E402
from bundler.deploy.kserve import (KServeOptions, check_with_kserve_sdk, export_kserve,  # noqa: E402
                                   inference_service)
from runtime_py.errors import UsageError  # noqa: E402
from runtime_py.format import open_bundle  # noqa: E402

yaml = pytest.importorskip("yaml", reason="needs pyyaml: pip install 'trt-bundle[deploy]'")
# The SDK is not in dev (many dependencies): .ci/run checks these in a venv of its own.
needs_sdk = pytest.mark.skipif(importlib.util.find_spec("kserve") is None,
                               reason="needs the KServe SDK to check the manifests: "
                                      "pip install kserve (.ci/run does, in its own venv)")

ROOT = Path(__file__).parent.parent
URI = "s3://models/tiny/tiny-fp32-1-onnxruntime.bundle"


def load_docs(files):
    return {d["kind"]: d for d in (yaml.safe_load(Path(f).read_text()) for f in files)}


def env_of(isvc) -> dict:
    return {e["name"]: e["value"] for e in isvc["spec"]["predictor"]["model"]["env"]}


@needs_sdk
def test_onnxruntime_bundle_manifests_fit_the_kserve_sdk(tmp_path):
    bundle = ort_bundle(tmp_path)
    result = export_kserve(bundle, tmp_path / "k8s", KServeOptions(storage_uri=URI, max_batch=4))
    assert result.checked_with_sdk and result.name == "tiny-fp32-1"
    assert sorted(f.name for f in result.files) == ["tiny-fp32-1-inferenceservice.yaml",
                                                    "tiny-fp32-1-servingruntime.yaml"]
    docs = load_docs(result.files)
    for doc in docs.values():
        assert check_with_kserve_sdk(doc) == []
    isvc, runtime = docs["InferenceService"], docs["ServingRuntime"]
    model = isvc["spec"]["predictor"]["model"]
    assert model["protocolVersion"] == "v2" and model["storageUri"] == URI
    assert model["runtime"] == runtime["metadata"]["name"]
    assert model["modelFormat"]["name"] in [f["name"] for f in runtime["spec"]["supportedModelFormats"]]
    assert "nvidia.com/gpu" not in model["resources"]["limits"]
    with open_bundle(bundle) as b:
        assert env_of(isvc)["TRT_BUNDLE_IDS"] == b.id
    assert env_of(isvc)["TRT_BUNDLE_MAX_BATCH"] == "4"
    container = runtime["spec"]["containers"][0]
    assert runtime["spec"]["protocolVersions"] == ["v2"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": 8080}
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert container["command"][-1] == "bundler.deploy.kserve_entrypoint"


@needs_sdk
def test_gpu_engines_request_gpus(tmp_path):
    bundle = trt_bundle(tmp_path)
    result = export_kserve(bundle, tmp_path / "k8s", KServeOptions(
        storage_uri="gs://b/plan.bundle", namespace="vision", min_replicas=1, max_replicas=4))
    isvc = load_docs(result.files)["InferenceService"]
    assert check_with_kserve_sdk(isvc) == []
    res = isvc["spec"]["predictor"]["model"]["resources"]
    assert res["limits"]["nvidia.com/gpu"] == res["requests"]["nvidia.com/gpu"] == "1"
    assert isvc["metadata"]["namespace"] == "vision"
    assert isvc["spec"]["predictor"]["maxReplicas"] == 4
    with pytest.raises(UsageError, match="needs a GPU"):
        export_kserve(bundle, tmp_path / "k2", KServeOptions(storage_uri="gs://b/x", gpus=0))
    with pytest.raises(UsageError, match="not a URI"):
        export_kserve(bundle, tmp_path / "k2", KServeOptions(storage_uri="models/x.bundle"))
    assert not (tmp_path / "k2").exists()


@pytest.mark.parametrize("device, backend, gpus", [
    ("cuda", "auto", "1"), ("cpu", "auto", None),
    ("cuda", "onnxruntime", None),          # its ONNX graph, served wherever ONNX Runtime runs
])
def test_gpus_by_default_only_where_the_served_engine_needs_one(tmp_path, device, backend, gpus):
    with open_bundle(aoti_bundle(tmp_path, device=device)) as b:
        manifest, bundle_id = b.manifest, b.id
    isvc = inference_service(manifest, bundle_id, KServeOptions(storage_uri=URI, backend=backend))
    limits = isvc["spec"]["predictor"]["model"]["resources"]["limits"]
    assert limits.get("nvidia.com/gpu") == gpus
    if gpus:
        with pytest.raises(UsageError, match="needs a GPU"):
            inference_service(manifest, bundle_id, KServeOptions(storage_uri=URI, gpus=0))


@needs_sdk
def test_the_sdk_check_catches_wrong_manifests(tmp_path):
    result = export_kserve(ort_bundle(tmp_path), tmp_path / "k8s", KServeOptions(storage_uri=URI))
    docs = load_docs(result.files)
    isvc, runtime = docs["InferenceService"], docs["ServingRuntime"]
    isvc["spec"]["predictor"]["model"]["storageURI"] = URI          # a typo of a field name
    isvc["spec"]["predictor"]["minReplicas"] = "2"                  # a string for an int
    problems = check_with_kserve_sdk(isvc)
    assert any("storageURI: not a field of V1beta1ModelSpec" in p for p in problems)
    assert any("minReplicas: expected int" in p for p in problems)
    del runtime["spec"]["containers"][0]["name"]                    # required by V1Container
    runtime["spec"]["containers"][0]["readinessProbe"]["httpGet"].pop("port")   # required
    problems = check_with_kserve_sdk(runtime)
    assert any("V1Container" in p and "name" in p for p in problems)
    assert any("V1HTTPGetAction" in p and "port" in p for p in problems)


def _corrupt(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[80] ^= 0xFF            # inside the first member
    path.write_bytes(bytes(data))


def test_entrypoint_verifies_and_pins_the_bundle_before_serving(tmp_path, capsys):
    models = tmp_path / "mnt-models"
    models.mkdir()
    bundle = ort_bundle(models)
    with open_bundle(bundle) as b:
        bundle_id = b.id
    calls = []
    env = {"TRT_BUNDLE_IDS": bundle_id, "TRT_BUNDLE_MAX_BATCH": "4"}
    rc = kserve_entrypoint.main(["--model-dir", str(models), "--port", "8081"], env=env,
                                execute=lambda prog, argv: calls.append(argv))
    assert rc == 0 and len(calls) == 1
    argv = calls[0]
    assert argv[1:3] == ["serve", str(bundle)]
    assert argv[argv.index("--port") + 1] == "8081" and argv[argv.index("--max-batch") + 1] == "4"
    assert argv[argv.index("--host") + 1] == "0.0.0.0"

    calls.clear()
    rc = kserve_entrypoint.main(["--model-dir", str(models)], env={"TRT_BUNDLE_IDS": "0" * 64},
                                execute=lambda prog, argv: calls.append(argv))
    assert rc == 1 and not calls
    assert "is not one of TRT_BUNDLE_IDS" in capsys.readouterr().err

    _corrupt(bundle)
    rc = kserve_entrypoint.main(["--model-dir", str(models)], env=env,
                                execute=lambda prog, argv: calls.append(argv))
    assert rc == 1 and not calls

    empty = tmp_path / "empty"
    empty.mkdir()
    assert kserve_entrypoint.main(["--model-dir", str(empty)], env={},
                                  execute=lambda p, a: calls.append(a)) == 4 and not calls


def test_serving_image_is_slim(tmp_path):
    """The image installs `[serve]` only, and its entrypoint verifies a bundle with torch,
    timm and onnx made unimportable (as in that image)."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    heavy = {"torch", "timm", "onnx", "onnx-graphsurgeon", "onnxscript"}
    assert not {r.split(">")[0].split("=")[0].split("[")[0] for r in extras["serve"]} & heavy
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    assert "ARG EXTRAS=serve\n" in dockerfile and 'pip install ".[${EXTRAS}]"' in dockerfile
    assert '"bundler.deploy.kserve_entrypoint"' in dockerfile

    models = tmp_path / "models"
    models.mkdir()
    ort_bundle(models)
    code = (
        "import sys\n"
        "for m in ('torch', 'timm', 'onnx', 'onnxscript', 'onnx_graphsurgeon'): sys.modules[m] = None\n"
        "from bundler.deploy import kserve_entrypoint as e\n"
        f"rc = e.main(['--model-dir', {str(models)!r}], env={{}}, execute=lambda p, a: print(a[1]))\n"
        "sys.exit(rc)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "serve" and "verified" in done.stderr


@needs_sdk
def test_cli_export_kserve(tmp_path):
    from click.testing import CliRunner

    from bundler.cli import cli

    bundle = ort_bundle(tmp_path)
    runner = CliRunner()
    args = ["export", "kserve", str(bundle), "--storage-uri", URI, "--out", str(tmp_path / "k8s")]
    result = runner.invoke(cli, args + ["--json", "--gpus", "1", "--cpu", "2", "--memory", "4Gi"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["checked_with_kserve_sdk"] and report["served_model_name"] == "tiny-fp32-1"
    isvc = load_docs(report["files"])["InferenceService"]
    assert isvc["spec"]["predictor"]["model"]["resources"]["requests"] == {
        "cpu": "2", "memory": "4Gi", "nvidia.com/gpu": "1"}
    result = runner.invoke(cli, args)
    assert result.exit_code == 6 and "--overwrite" in result.stderr
    assert runner.invoke(cli, args + ["--overwrite"]).exit_code == 0


def test_entrypoint_checks_signatures_against_mounted_trusted_keys(tmp_path, capsys):
    """TRT_BUNDLE_TRUSTED_KEYS: an unsigned bundle is refused before anything serves; a
    bundle signed by a trusted key is served with `bundle serve --trusted-keys`."""
    from test_signing import new_key, write_private, write_public

    from bundler.sign import BundleSigner

    models = tmp_path / "mnt-models"
    models.mkdir()
    bundle = ort_bundle(models)
    key = new_key()
    trusted = tmp_path / "trusted"
    write_public(trusted / "release.pub.pem", key)
    env = {"TRT_BUNDLE_TRUSTED_KEYS": str(trusted), "TRT_BUNDLE_GRPC_PORT": "8081"}
    calls = []
    rc = kserve_entrypoint.main(["--model-dir", str(models)], env=env,
                                execute=lambda prog, argv: calls.append(argv))
    assert rc == 8 and not calls                       # unsigned: refused, nothing served
    assert "signature" in capsys.readouterr().err.lower()
    BundleSigner.from_files(write_private(tmp_path / "release.key.pem", key)).sign_bundle(bundle)
    rc = kserve_entrypoint.main(["--model-dir", str(models)], env=env,
                                execute=lambda prog, argv: calls.append(argv))
    assert rc == 0 and len(calls) == 1
    argv = calls[0]
    assert argv[argv.index("--trusted-keys") + 1] == str(trusted)
    assert argv[argv.index("--grpc-port") + 1] == "8081"
