"""Every family builds an fp8 bundle that verifies and agrees with its fp32 graph (random
weights, small calibration and reference sets: one real build per family, the generic
checks shared). timm_xception's bundles are the session fixture ``xception_bundles``."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from bundler.families import list_families, load_family

#: family -> (quantized layers, op type they are); xception: tests/test_make.py
FP8_LAYERS = {"timm_resnet50": (52, "Conv"), "timm_vit_base": (48, "MatMul")}


def test_every_family_is_covered_here_or_by_xception_bundles():
    assert set(list_families()) == set(FP8_LAYERS) | {"timm_xception"}


@pytest.fixture(scope="module", params=sorted(FP8_LAYERS))
def fp8_bundle(request, tmp_path_factory):
    from bundler.make import MakeRequest, make_bundle

    result = make_bundle(MakeRequest(
        family=request.param, precision="fp8", backend="onnxruntime", random_weights=True,
        out_dir=tmp_path_factory.mktemp(request.param), calib_count=8, reference_count=4))
    return request.param, result.path


@pytest.mark.slow
def test_fp8_bundle_quantizes_the_recipe_layers_and_matches_its_reference(fp8_bundle):
    from runtime_py.format import open_bundle
    from runtime_py.numerics import check_numerics

    family, path = fp8_bundle
    count, op_type = FP8_LAYERS[family]
    with open_bundle(path) as bundle:
        bundle.verify()
        manifest = bundle.manifest
        model = onnx.load_from_string(bundle.read_member("model.onnx"))
        report = check_numerics(bundle)
    assert manifest["recipe"]["quantized_layers"] == count
    inits = {i.name for i in model.graph.initializer}
    quantized = [n for n in model.graph.node if n.op_type == op_type
                 and any(i.endswith(".weight_dequantized") for i in n.input)]
    assert len(quantized) == count
    assert not inits & {f"{n.name}.weight" for n in quantized}      # fp8 kernels only
    assert report.ran and report.passed, report.reasons
    assert manifest["quality"]["top1_agreement"] is not None


@pytest.mark.slow
def test_fp8_calibration_member_equals_the_graph_scales(fp8_bundle):
    from bundler.calibration.store import calibration_from_safetensors
    from runtime_py.format import open_bundle

    _family, path = fp8_bundle
    with open_bundle(path) as bundle:
        model = onnx.load_from_string(bundle.read_member("model.onnx"))
        calib = calibration_from_safetensors(bundle.read_member("calibration.safetensors"))
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    for node, scales in calib.weight_scales.items():
        assert np.array_equal(inits[f"{node}.weight_scale"].astype(np.float32), scales), node
    for tensor, scale in calib.result.scale.items():
        assert float(inits[f"{tensor}_fp8_scale"].astype(np.float32)) == scale, tensor


@pytest.mark.parametrize("name", sorted(FP8_LAYERS) + ["timm_xception"])
def test_family_preprocessing_is_timms_config(name):
    import timm

    from bundler.make import preprocess_spec

    family = load_family(name)
    model = timm.create_model(family.checkpoint.timm_model, pretrained=False)
    assert preprocess_spec(family, model) == family.preprocessing_spec()


def test_preprocessing_that_differs_from_timms_config_is_refused():
    import json

    import timm

    from bundler.families import parse_family
    from bundler.make import preprocess_spec
    from runtime_py.errors import FamilyError

    family = load_family("timm_resnet50")
    data = json.loads((family.path / "family.json").read_text())
    data["preprocessing"]["resize"]["size"] = 256
    drifted = parse_family(data, folder=family.path)
    model = timm.create_model(family.checkpoint.timm_model, pretrained=False)
    with pytest.raises(FamilyError, match="resize: family.json has .*256.*235"):
        preprocess_spec(drifted, model)


def test_weights_pin_is_recorded_at_the_first_make_and_checked_later(tmp_path, monkeypatch):
    import dataclasses

    from bundler.weights import check_pin, pins_dir
    from runtime_py.errors import WeightsError

    monkeypatch.setenv("TRT_BUNDLE_CACHE", str(tmp_path))
    family = load_family("timm_resnet50")
    assert family.checkpoint.revision is None and family.checkpoint.sha256 is None
    check_pin(family, "a" * 64)                                  # first make: recorded
    assert (pins_dir() / "timm_resnet50.sha256").read_text().strip() == "a" * 64
    check_pin(family, "a" * 64)
    with pytest.raises(WeightsError, match="is not the one timm_resnet50 is pinned to"):
        check_pin(family, "b" * 64)
    pinned = dataclasses.replace(family, checkpoint=dataclasses.replace(
        family.checkpoint, sha256="c" * 64))
    with pytest.raises(WeightsError, match=r"checkpoint\.sha256"):
        check_pin(pinned, "a" * 64)
    check_pin(load_family("timm_xception"), "d" * 64)           # pinned by its revision


FAMILY_PY = '''
import torch

calls = []

class Tiny(torch.nn.Module):
    def __init__(self, classes):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.act = torch.nn.ReLU()
        self.norm = torch.nn.BatchNorm2d(4)        # after the ReLU: no generic fold rule
        self.pool = torch.nn.AdaptiveAvgPool2d(1)
        self.fc = torch.nn.Linear(4, classes)

    def forward(self, x):
        return self.fc(self.pool(self.norm(self.act(self.conv(x)))).flatten(1))

def create_model(family):
    return Tiny(family.num_classes)

def fold_batchnorm(model):
    calls.append(type(model).__name__)
    norm = model.norm
    scale = norm.weight / torch.sqrt(norm.running_var + norm.eps)
    shift = norm.bias - norm.running_mean * scale
    fc = model.fc
    fc.bias += fc.weight @ shift
    fc.weight *= scale
    model.norm = torch.nn.Identity()
    return 1
'''


def test_family_hooks_build_and_fold_the_model(tmp_path):
    import json

    import torch

    from bundler.torch_model import build_torch_model, random_state_dict

    src = load_family("timm_xception")
    data = json.loads((src.path / "family.json").read_text())
    data["name"] = "toy_hooks"
    folder = tmp_path / "toy_hooks"
    folder.mkdir()
    (folder / "family.json").write_text(json.dumps(data))
    (folder / "family.py").write_text(FAMILY_PY)
    family = load_family("toy_hooks", root=tmp_path)
    state = random_state_dict(family, 0)
    unfolded = family.hook("create_model")(family)
    unfolded.load_state_dict(state)
    model = build_torch_model(family, state_dict=state)
    assert family.extension().calls == ["Tiny"] and isinstance(model.norm, torch.nn.Identity)
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        assert torch.allclose(model(x), unfolded.eval()(x), atol=1e-5)


@pytest.mark.slow
def test_fp8_layers_of_the_bundle_are_modules_the_torch_aoti_engine_replaces(fp8_bundle):
    """What make hands the torch-aoti target (BuildContext.fp8, from the bundle here as
    rebuild does) names modules of the torch model of the kind the rewrite quantizes."""
    import torch

    from bundler.build_context import context_from_bundle
    from bundler.targets.torch_aoti.model import map_nodes_to_modules
    from bundler.torch_model import build_torch_model
    from runtime_py.format import open_bundle

    name, path = fp8_bundle
    family = load_family(name)
    with open_bundle(path) as bundle:
        members = {m: bundle.read_member(m) for m in bundle.member_names}
        context = context_from_bundle(bundle.manifest, members, family,
                                      lambda: build_torch_model(family, seed=0))
    count, op_type = FP8_LAYERS[name]
    assert len(context.fp8) == count and {layer.op_type for layer in context.fp8.values()} == {op_type}
    paths = map_nodes_to_modules(context.torch_model, list(context.fp8))
    modules = dict(context.torch_model.named_modules())
    kind = torch.nn.Conv2d if op_type == "Conv" else torch.nn.Linear
    assert all(isinstance(modules[p], kind) for p in paths.values())
