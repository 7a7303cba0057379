"""Family discovery and validation (bundler.families): light, no torch needed except where said."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bundler.families import families_root, list_families, load_family
from runtime_py.errors import FamilyError, UsageError

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def families_copy(tmp_path: Path) -> Path:
    """A families folder holding a copy of timm_xception, to break at will."""
    shutil.copytree(families_root() / "timm_xception", tmp_path / "timm_xception")
    return tmp_path


def _edit(root: Path, name: str, change) -> None:  # type: ignore[no-untyped-def]
    path = root / name / "family.json"
    spec = json.loads(path.read_text())
    change(spec)
    path.write_text(json.dumps(spec))


def test_timm_xception_is_found_and_loads():
    assert "timm_xception" in list_families()
    f = load_family("timm_xception")
    assert f.name == "timm_xception" and f.version == "1.0.0"
    assert f.checkpoint.hf_id == "timm/xception41.tf_in1k"
    assert f.checkpoint.revision == "8a17189361e63c972815ef62f2a30dd5b9f393b1"
    assert f.checkpoint.timm_model == "xception41.tf_in1k"
    assert f.input.name == "input" and f.input.shape == (3, 299, 299)
    assert (f.input.batch.min, f.input.batch.opt, f.input.batch.max) == (1, 8, 32)
    assert f.output_name == "logits" and f.num_classes == 1000
    assert f.precisions == ("fp32", "fp16", "fp8") and f.opset >= 19
    assert f.target_settings("tensorrt").optimization_level == 3
    assert f.recipe()["expected_count"] == 43
    assert f.recipe("fp8-depthwise")["expected_count"] == 82


@pytest.mark.parametrize("name, resize", [("timm_xception", 331), ("timm_resnet50", 235),
                                          ("timm_vit_base", 248)])
def test_preprocessing_matches_timm_pretrained_config(name, resize):
    timm = pytest.importorskip("timm")
    from timm.data import resolve_data_config

    family = load_family(name)
    cfg = resolve_data_config({}, model=timm.create_model(family.checkpoint.timm_model,
                                                          pretrained=False))
    spec = family.preprocessing_spec()
    assert spec["resize"]["size"] == int(cfg["input_size"][1] / cfg["crop_pct"]) == resize
    assert spec["resize"]["interpolation"] == cfg["interpolation"] == "bicubic"
    assert cfg["crop_mode"] == "center"
    assert (spec["center_crop"]["height"], spec["center_crop"]["width"]) == cfg["input_size"][1:]
    assert spec["normalize"]["mean"] == list(cfg["mean"]) and spec["normalize"]["std"] == list(cfg["std"])
    assert spec["rescale"]["factor"] == 1 / 255
    assert (spec["layout"], spec["dtype"], spec["input"]) == ("NCHW", "float32", "input")
    try:
        from runtime_py.preprocess import spec_from_timm_config
    except ImportError:
        return
    assert spec == spec_from_timm_config(cfg, "input")


@pytest.mark.parametrize("name", ["timm_xception", "timm_resnet50", "timm_vit_base"])
def test_family_is_frozen(name):
    f = load_family(name)
    with pytest.raises(AttributeError):
        f.version = "2.0.0"  # type: ignore[misc]
    with pytest.raises(TypeError):
        f.preprocessing["dtype"] = "uint8"  # type: ignore[index]
    with pytest.raises(AttributeError):     # a target's settings too
        f.target_settings("torch-aoti").fp8_gemm = "tensorwise"  # type: ignore[misc]
    with pytest.raises(TypeError):
        f.target_settings("torch-aoti").fp8_triton_pointwise[(1, 1, "raw")] = (1,)  # type: ignore[index]
    recipe = f.recipe()
    recipe["select"]["include"].clear()  # a copy: the family is untouched
    assert f.recipe()["select"]["include"]


@pytest.mark.parametrize("name, count", [("timm_xception", 43), ("timm_resnet50", 52),
                                         ("timm_vit_base", 48)])
def test_every_family_states_its_fp8_layer_count(name, count):
    assert load_family(name).recipe()["expected_count"] == count


def test_recipe_digest_is_stable_and_depends_on_the_variant():
    f = load_family("timm_xception")
    assert f.recipe_digest() == load_family("timm_xception").recipe_digest()
    assert f.recipe_digest() != f.recipe_digest("fp8-depthwise")
    assert len(f.recipe_digest()) == 64


def test_unknown_family_names_the_known_ones():
    with pytest.raises(FamilyError) as info:
        load_family("timm_xceptoin")
    assert "timm_xceptoin" in str(info.value) and "timm_xception" in str(info.value)
    assert isinstance(info.value, UsageError) and info.value.exit_code == 6


def test_unknown_variant():
    with pytest.raises(FamilyError, match="fp8-depthwise"):
        load_family("timm_xception").recipe("fp8-everything")


def test_bad_spec_lists_every_problem(families_copy: Path):
    def breaks(spec):  # type: ignore[no-untyped-def]
        spec["version"] = "one"
        spec["checkpoint"]["revision"] = "main"
        spec["input"]["batch"] = {"min": 8, "opt": 4, "max": 32}
        del spec["output"]
        spec["precisions"] = ["fp32", "int3"]
        spec["opset"] = 17
        spec["fp8"]["select"]["include"] = [{"op_type": "Conv", "kernal_shape": [1, 1]}]
        spec["torch_aoti"] = {"layout": "nhwc", "fp16_layout": "nchw", "fp8_gemm": "blockwise",
                              "fp8_fast_accum": "yes", "fp8_layout": "nchw",
                              "small_batch_layout": "tiny"}

    _edit(families_copy, "timm_xception", breaks)
    with pytest.raises(FamilyError) as info:
        load_family("timm_xception", root=families_copy)
    problems = info.value.problems
    for needle in ("version", "checkpoint.revision", "input.batch", "output.name", "precisions",
                   "opset", "kernal_shape", "torch_aoti.fp16_layout", "torch_aoti.fp8_gemm",
                   "torch_aoti.fp8_fast_accum", "torch_aoti.fp8_layout",
                   "torch_aoti.small_batch_layout"):
        assert any(needle in p for p in problems), (needle, problems)
    assert "family.json" in str(info.value)


def test_torch_aoti_static_batches_are_sizes_of_the_batch_range(families_copy: Path):
    """torch_aoti.static_batches: opt-in (none by default), ascending, inside input.batch;
    a list for every precision or an object of lists per precision (timm_xception ships
    batch-1 and batch-32 graphs for fp16 and fp8, none for fp32)."""
    def sizes_of(precision: str) -> tuple[int, ...]:
        return load_family("timm_xception", root=families_copy).target_settings("torch-aoti").static_batches_for(
            precision)

    assert (sizes_of("fp32"), sizes_of("fp16"), sizes_of("fp8")) == ((), (1, 32), (1, 32))
    _edit(families_copy, "timm_xception",
          lambda spec: spec.setdefault("torch_aoti", {}).update(static_batches=[32, 1]))
    assert sizes_of("fp16") == sizes_of("fp8") == (1, 32)
    _edit(families_copy, "timm_xception",
          lambda spec: spec["torch_aoti"].update(static_batches={"fp16": [8], "fp8": [32, 1]}))
    assert (sizes_of("fp32"), sizes_of("fp16"), sizes_of("fp8")) == ((), (8,), (1, 32))
    for sizes, needle in (([1, 64], "[64] outside input.batch 1..32"), ([8, 8], "twice"),
                          ("1,32", "list of at most"), ([True], "list of at most"),
                          (list(range(1, 10)), "list of at most 8"),
                          ({"int8": [1]}, "['int8'] are not precisions"),
                          ({"fp8": [1, 64]}, "static_batches.fp8: [64] outside")):
        _edit(families_copy, "timm_xception",
              lambda spec, s=sizes: spec["torch_aoti"].update(static_batches=s))
        with pytest.raises(FamilyError) as info:
            load_family("timm_xception", root=families_copy)
        assert any(needle in p for p in info.value.problems), (sizes, info.value.problems)


def test_torch_aoti_fp8_gemm_settings_default_and_read(families_copy: Path):
    """family.json torch_aoti.fp8_gemm / fp8_fast_accum: rowwise without fast accumulation
    unless the family says otherwise (what the torch-aoti target builds with)."""
    shipped = load_family("timm_xception", root=families_copy)
    written = json.loads((families_copy / "timm_xception" / "family.json").read_text())
    # timm_xception names rowwise-fp16 itself: since its depthwise kernels read the GEMM
    # output in place, fp16 outputs measured faster than bf16 ones as a bundle on the H200
    # (families/timm_xception/README.md, twenty-first session); the default stays rowwise
    assert written["torch_aoti"]["fp8_gemm"] == "rowwise-fp16"
    assert (shipped.target_settings("torch-aoti").fp8_gemm, shipped.target_settings("torch-aoti").fp8_fast_accum) == ("rowwise-fp16", False)
    _edit(families_copy, "timm_xception", lambda spec: spec["torch_aoti"].pop("fp8_gemm"))
    assert load_family("timm_xception", root=families_copy).target_settings("torch-aoti").fp8_gemm == "rowwise"
    assert not load_family("timm_xception", root=families_copy).target_settings("torch-aoti").fp8_fast_accum

    def chooses(spec):  # type: ignore[no-untyped-def]
        spec["torch_aoti"] = {"fp8_gemm": "rowwise-fp16", "fp8_fast_accum": True}

    _edit(families_copy, "timm_xception", chooses)
    family = load_family("timm_xception", root=families_copy)
    assert (family.target_settings("torch-aoti").fp8_gemm, family.target_settings("torch-aoti").fp8_fast_accum) == ("rowwise-fp16", True)
    # what the torch-aoti target builds with: the family's, unless the caller asks
    from bundler.targets.torch_aoti.build import fp8_gemm_options

    assert fp8_gemm_options(family) == ("rowwise-fp16", True)
    assert fp8_gemm_options(family, "tensorwise", False) == ("tensorwise", False)
    with pytest.raises(UsageError, match="fp8 GEMM mode 'blockwise'"):
        fp8_gemm_options(family, "blockwise")


def test_each_engine_target_checks_and_reads_its_own_section(families_copy: Path):
    """family.json's torch_aoti and tensorrt sections are the targets' own (their settings
    modules, named by the registry): checked with the rest of the spec, read through
    ``Family.target_settings``."""
    _edit(families_copy, "timm_xception", lambda spec: spec.update(tensorrt={"optimization_level": 9}))
    with pytest.raises(FamilyError) as info:
        load_family("timm_xception", root=families_copy)
    assert any("tensorrt.optimization_level: 9 must be an integer 0..5" in p
               for p in info.value.problems)
    _edit(families_copy, "timm_xception", lambda spec: spec.update(tensorrt="fast"))
    with pytest.raises(FamilyError, match="tensorrt: must be an object"):
        load_family("timm_xception", root=families_copy)
    _edit(families_copy, "timm_xception", lambda spec: spec.update(tensorrt={"optimization_level": 5}))
    family = load_family("timm_xception", root=families_copy)
    assert family.target_settings("tensorrt").optimization_level == 5
    assert family.target_settings("torch-aoti") is family.target_settings("torch-aoti")  # read once
    with pytest.raises(FamilyError, match="the onnxruntime target reads no family settings"):
        family.target_settings("onnxruntime")
    _edit(families_copy, "timm_xception", lambda spec: spec.pop("tensorrt"))
    assert load_family("timm_xception", root=families_copy).target_settings(
        "tensorrt").optimization_level == 3                   # TensorRT's default


def test_spec_that_is_not_json(families_copy: Path):
    (families_copy / "timm_xception" / "family.json").write_text("{ not json")
    with pytest.raises(FamilyError, match="cannot read"):
        load_family("timm_xception", root=families_copy)


def test_name_must_match_folder(families_copy: Path):
    shutil.move(families_copy / "timm_xception", families_copy / "other")
    with pytest.raises(FamilyError, match="folder name"):
        load_family("other", root=families_copy)


def test_new_family_is_a_folder_and_extension_is_optional(families_copy: Path):
    shutil.copytree(families_copy / "timm_xception", families_copy / "tiny")
    _edit(families_copy, "tiny", lambda s: s.update(name="tiny"))
    (families_copy / "tiny" / "family.py").write_text("ANSWER = 42\n")
    assert list_families(families_copy) == ["timm_xception", "tiny"]
    assert load_family("tiny", root=families_copy).extension().ANSWER == 42
    assert load_family("timm_xception", root=families_copy).extension() is None


def test_families_module_stays_light():
    code = (
        "import sys, bundler.families as f; f.load_family('timm_xception'); "
        "heavy = [m for m in ('torch', 'onnx', 'timm', 'onnxruntime') if m in sys.modules]; "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": ""})
