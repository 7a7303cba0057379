"""Adding a family of an already supported kind is adding a folder (issue 18): a family kept
outside the repository, found through the families search path, builds an fp8 bundle that
verifies, with the FP8 layers its family.json declares. Nothing in bundler/ knows it."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from bundler.cli import cli
from bundler.families import (FAMILIES_PATH_ENV, families_path, family_roots, list_families,
                              load_family)
from runtime_py.errors import FamilyError

#: timm's smallest plain ResNet (single-conv stem, basic blocks): the kind timm_resnet50 is.
MODEL = "resnet18.a1_in1k"
NAME = "timm_resnet18"


def write_resnet18_family(root: Path) -> Path:
    """``root/timm_resnet18/``: family.json (timm_resnet50's, with what differs for ResNet-18)
    and class_ids.txt; no family.py."""
    resnet50 = load_family("timm_resnet50")
    spec = json.loads((resnet50.path / "family.json").read_text())
    spec["name"] = NAME
    spec["description"] = f"ResNet-18 (timm {MODEL}), ImageNet-1k classifier, 224x224 RGB"
    spec["checkpoint"] = {"hf_id": f"timm/{MODEL}", "timm_model": MODEL}
    # resnet18.a1_in1k's pretrained config is resnet50.a1_in1k's: 224 crop, 0.95, bicubic.
    spec["fp8"]["select"] = {
        "comment": "every convolution but the stem, and the classifier",
        "include": [{"op_type": "Conv"}, {"op_type": "Gemm"}],
        "exclude": [{"module_prefix": "conv1"}],
    }
    spec["fp8"]["expected_count"] = 20
    # the fused FP8 bottlenecks (and the stem fused with them) are ResNet-50's; ResNet-18's
    # basic blocks run im2col
    spec["torch_aoti"].pop("fp8_conv", None)
    spec["torch_aoti"].pop("fp8_fuse_stem", None)
    folder = root / NAME
    folder.mkdir(parents=True)
    (folder / "family.json").write_text(json.dumps(spec, indent=2))
    shutil.copy(resnet50.path / "class_ids.txt", folder / "class_ids.txt")
    return folder


def test_families_path_adds_a_folder_for_the_with_block_only(tmp_path):
    write_resnet18_family(tmp_path)
    assert NAME not in list_families()
    with families_path(tmp_path) as roots:
        assert roots[0] == tmp_path.resolve()
        assert NAME in list_families() and "timm_xception" in list_families()
        assert load_family(NAME).path == tmp_path.resolve() / NAME
    assert NAME not in list_families()
    with pytest.raises(FamilyError, match=f"unknown family '{NAME}'.*{FAMILIES_PATH_ENV}"):
        load_family(NAME)


def test_the_environment_variable_is_searched_and_a_missing_folder_is_refused(tmp_path):
    write_resnet18_family(tmp_path / "mine")
    runner = CliRunner(env={FAMILIES_PATH_ENV: os.pathsep.join([str(tmp_path / "mine")])})
    result = runner.invoke(cli, ["families"])
    assert result.exit_code == 0, result.output
    assert f"{NAME} 1.0.0  (timm/{MODEL})" in result.output

    result = CliRunner(env={FAMILIES_PATH_ENV: str(tmp_path / "typo")}).invoke(cli, ["families"])
    assert result.exit_code == 6 and "Traceback" not in result.output
    assert f"${FAMILIES_PATH_ENV} names" in result.output and "not a folder" in result.output


def test_a_family_folder_shadows_a_shipped_family_of_the_same_name(tmp_path):
    shutil.copytree(load_family("timm_xception").path, tmp_path / "timm_xception")
    with families_path(tmp_path):
        assert load_family("timm_xception").path == tmp_path.resolve() / "timm_xception"
        assert family_roots()[-1] != tmp_path.resolve()        # the shipped folder stays last


@pytest.mark.slow
def test_a_fourth_family_is_only_a_folder_and_builds_a_verified_fp8_bundle(tmp_path):
    import onnx
    import timm
    import torch

    from runtime_py.format import open_bundle

    families = tmp_path / "families"
    folder = write_resnet18_family(families)
    assert sorted(p.name for p in folder.iterdir()) == ["class_ids.txt", "family.json"]
    runner = CliRunner(env={FAMILIES_PATH_ENV: str(families),
                            "TRT_BUNDLE_CACHE": str(tmp_path / "cache")})
    out = tmp_path / "out"
    made = runner.invoke(cli, ["make", NAME, "--precision", "fp8", "--backend", "onnxruntime",
                               "--random-weights", "--calib-count", "8", "--reference-count", "4",
                               "--out", str(out), "--json"])
    assert made.exit_code == 0, made.output
    path = Path(json.loads(made.stdout)["path"])

    verified = runner.invoke(cli, ["verify", str(path), "--numerics", "--json"])
    assert verified.exit_code == 0, verified.output
    report = json.loads(verified.stdout)
    assert report["ok"] and report["numerics"]["ran"] and report["numerics"]["passed"]

    # The layers that carry FP8 kernels are exactly the declared ops (Conv, Gemm) of the
    # torch model's Conv2d and Linear modules, less the excluded stem.
    model = timm.create_model(MODEL, pretrained=False)
    declared = {name for name, m in model.named_modules()
                if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear)) and name != "conv1"}
    with open_bundle(path) as bundle:
        manifest = bundle.manifest
        graph = onnx.load_from_string(bundle.read_member("model.onnx")).graph
    fp8 = {n.name: n.op_type for n in graph.node
           if any(i == f"{n.name}.weight_dequantized" for i in n.input)}
    assert set(fp8) == declared
    assert set(fp8.values()) == {"Conv", "Gemm"} and fp8["fc"] == "Gemm"
    assert manifest["family"]["name"] == NAME and manifest["precision"] == "fp8"
    assert manifest["recipe"]["quantized_layers"] == len(declared) == 20
