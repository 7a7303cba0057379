"""`bundle make`: family -> weights -> fp32 ONNX -> precision graph -> engine -> bundle.

Each stage is a small function over plain values, so that `bundle rebuild`, `bundle study`
and the tests reuse them; `make_bundle` only strings them together and reports progress
through a callback (the CLI prints it; library callers may pass nothing).
"""

from __future__ import annotations

import importlib.metadata
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from bundler import __version__
from bundler.build_context import BuildContext
from bundler.families import Family, load_family
from bundler.quality import compare_logits, decimal, manifest_quality
from bundler.weights import Weights, resolve_weights
from bundler.writer import prepare_out_dir, refuse_existing_bundle, source_date_epoch
from runtime_py.errors import CalibrationError, UsageError
from runtime_py.targets import NAMES, get_target

Progress = Callable[[str, str], None]

#: Precisions users ask for that no family builds: why, and what to ask for instead
#: (``refusal_of``; ``{family}``, ``{precisions}`` and ``{backends}`` are filled in).
REFUSED_PRECISIONS = {
    "nvfp4": "NVFP4 is not a precision trt-bundle builds: use --precision fp8 for the quantized "
             "path ({family}'s precisions are {precisions}). NVFP4 needs a Blackwell GPU "
             "(compute capability 10.0 or newer) and TensorRT 10.8 or later with its FP4 "
             "kernels; none of this project's engines ({backends}) has an NVFP4 path, and "
             "Hopper GPUs such as the H200 have no FP4 tensor cores",
    "int8": "int8 is not among {family}'s precisions ({precisions}): its quantized path is "
            "FP8, use --precision fp8",
    "bf16": "bf16 is not among {family}'s precisions ({precisions}): fp16 covers the same "
            "engines, use --precision fp16",
}


def refusal_of(precision: str, family: Family) -> str | None:
    """Why ``precision`` is refused for every family, in the user's terms, or None."""
    reason = REFUSED_PRECISIONS.get(precision.lower())
    if reason is None:
        return None
    return reason.format(family=family.name, precisions=", ".join(family.precisions),
                         backends=", ".join(NAMES))


PACKAGES = ("numpy", "onnx", "onnxruntime", "onnx-graphsurgeon", "torch", "timm", "safetensors",
            "msgpack", "zstandard", "ml_dtypes")
REFERENCE_SEED = 1_000_003
SYNTHETIC_CALIBRATION_SEED = 0
INPUT_DTYPES = ("float32", "uint8")


@dataclass
class MakeRequest:
    """Everything `bundle make` is asked; defaults are the CLI's defaults."""

    family: str
    precision: str
    variant: str | None = None
    backend: str = "auto"
    out_dir: Path = Path(".")
    checkpoint: Path | None = None
    random_weights: bool = False
    seed: int = 0
    calib_data: Path | None = None
    calib_count: int = 500
    calib_stride: int = 1
    calib_method: str = "max"
    percentile: float = 99.99
    calib_batch: int = 8
    reference_data: Path | None = None
    reference_count: int = 8
    cache_dir: Path | None = None
    #: "uint8": the engine takes uint8 NHWC pixels and does rescale/normalize/layout/cast
    input_dtype: str = "float32"
    target_options: dict = field(default_factory=dict)
    #: Replace a bundle of the same name in out_dir (`--force`); refused by default.
    replace_existing: bool = False
    #: Return a bundle in out_dir made from the same inputs instead of building
    #: (`--reuse`, ``bundler.reuse``); with replace_existing, one of other inputs is rebuilt.
    reuse_existing: bool = False


@dataclass
class MakeResult:
    path: Path
    bundle_id: str
    manifest: dict
    #: True when nothing was built: `path` was already there, made from the same inputs
    reused: bool = False


def _noop(stage: str, message: str) -> None:
    pass


# --- checks before any heavy work ----------------------------------------------------------

def check_request(family: Family, req: MakeRequest) -> None:
    """Refuse what cannot be built, before exporting anything."""
    if (refusal := refusal_of(req.precision, family)) is not None:
        raise UsageError(refusal)
    if req.precision not in family.precisions:
        raise UsageError(f"precision {req.precision!r} is not built for family {family.name}; "
                         f"its precisions are {', '.join(family.precisions)}")
    if req.variant is not None:
        family.recipe(req.variant)  # raises FamilyError for an unknown variant
        wanted = family.variants[req.variant].get("precision", "fp8")
        if wanted != req.precision:
            raise UsageError(f"variant {req.variant!r} is a {wanted} variant; "
                             f"use --precision {wanted}")
    if req.precision == "fp8" and req.calib_data is None and not req.random_weights:
        raise CalibrationError(
            "fp8 needs calibration images: pass --calib-data PATH (a folder of images, "
            "webdataset .tar shards or a .safetensors of preprocessed tensors); only "
            "--random-weights smoke builds calibrate on a synthetic set")
    if req.input_dtype not in INPUT_DTYPES:
        raise UsageError(f"--input {req.input_dtype!r}: choose one of {', '.join(INPUT_DTYPES)}")
    if (req.input_dtype == "uint8" and req.reference_data is not None
            and str(req.reference_data).endswith(".safetensors")):
        raise UsageError("--input uint8 needs reference images (a folder or .tar shards), not "
                         "a .safetensors of preprocessed float tensors: the reference member "
                         "holds the uint8 pixels the engine takes")
    if req.calib_count < 1 or req.calib_stride < 1 or req.reference_count < 1:
        raise UsageError("--calib-count, --calib-stride and --reference-count must be >= 1")


def manifest_batch(family: Family) -> dict:
    b = family.input.batch
    return {"min": b.min, "opt": b.opt, "max": b.max}


def package_versions(extra: tuple[str, ...] = ()) -> dict[str, str]:
    versions = {}
    for name in PACKAGES + extra:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return versions


# --- stages ----------------------------------------------------------------------------------

def preprocess_spec(family: Family, torch_model) -> dict:
    """The runtime's spec: ``family.json``'s ``preprocessing`` (the one source), checked
    against timm's pretrained config of the model, so that a family whose numbers drifted
    from the checkpoint's training recipe is refused rather than silently mis-preprocessed."""
    import timm.data

    from runtime_py.errors import FamilyError
    from runtime_py.preprocess import spec_from_timm_config

    spec = family.preprocessing_spec()
    timm_spec = spec_from_timm_config(timm.data.resolve_data_config({}, model=torch_model),
                                      family.input.name)
    problems = [f"{key}: family.json has {spec.get(key)!r}, timm's config gives {value!r}"
                for key, value in timm_spec.items() if not _same(spec.get(key), value)]
    if problems:
        raise FamilyError(f"family {family.name}: its preprocessing differs from timm's "
                          f"pretrained config of {family.checkpoint.timm_model}: "
                          + "; ".join(problems) + f". Fix {family.path / 'family.json'}",
                          problems=problems)
    return spec


def _same(a, b) -> bool:
    """Equal as JSON, floats to 1e-9 relative (family.json writes 1/255 in decimal)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return abs(a - b) <= 1e-9 * max(abs(a), abs(b), 1.0)
    return a == b


def labels_for(family: Family) -> list[str] | None:
    if family.num_classes != 1000:
        return None
    from timm.data import ImageNetInfo

    return list(ImageNetInfo().label_descriptions())


def onnx_outputs(model_bytes: bytes, inputs: np.ndarray, batch: int = 8,
                 precision: str = "fp32") -> np.ndarray:
    """Logits of an ONNX graph on the CPU (ONNX Runtime), in batches, computed so that they
    are the same with AVX2 and AVX-512 (``bundler.graphs.portable``): they are bytes of the
    bundle."""
    from bundler.graphs.portable import portable_bytes
    from runtime_py.engines.onnxruntime import cpu_session

    if precision == "fp32":                 # (fp16 Softmax is already the same everywhere)
        model_bytes = portable_bytes(model_bytes)
    session = cpu_session(model_bytes, precision)
    name = session.get_inputs()[0].name
    parts = [session.run(None, {name: inputs[i:i + batch]})[0] for i in range(0, len(inputs), batch)]
    return np.concatenate(parts).astype(np.float32)


def calibration_set(family: Family, req: MakeRequest, preprocess=None):
    """The images fp8 calibration uses (selected and digested; decoded only when iterated)."""
    from bundler.calibration.data import open_calibration_data, synthetic_calibration_set

    if req.calib_data is not None:
        return open_calibration_data(req.calib_data, preprocess, count=req.calib_count,
                                     stride=req.calib_stride)
    return synthetic_calibration_set(family.input.shape, min(req.calib_count, 64),
                                     seed=SYNTHETIC_CALIBRATION_SEED, preprocess=preprocess)


def reference_set(family: Family, req: MakeRequest, preprocess=None):
    """The held-out inputs of the reference member and the quality summary."""
    from bundler.calibration.data import (REFERENCE, open_calibration_data,
                                          synthetic_calibration_set)

    if req.reference_data is not None:
        return open_calibration_data(req.reference_data, preprocess, count=req.reference_count,
                                     role=REFERENCE)
    return synthetic_calibration_set(family.input.shape, req.reference_count,
                                     seed=REFERENCE_SEED, preprocess=preprocess)


def reference_inputs(family: Family, req: MakeRequest, preprocess) -> tuple[np.ndarray, str]:
    """A few preprocessed inputs, held out from calibration, and where they came from."""
    data = reference_set(family, req, preprocess)
    arrays = [batch for batch, _labels, _keys in data.iter_batches(req.reference_count)]
    return np.concatenate(arrays), data.source


def fp8_graph(family: Family, req: MakeRequest, fp32_model, fp16_model, preprocess,
              progress: Progress) -> tuple[bytes, bytes, dict, dict, dict]:
    """The fp8 graph, its calibration member, the manifest's recipe and calibration records,
    and the fp8 layers with the scales every engine uses (``BuildContext.fp8``)."""
    from bundler.build_context import fp8_layers
    from bundler.calibration.collect import calibrate
    from bundler.calibration.store import calibration_to_safetensors
    from bundler.export import serialize
    from bundler.graphs import fp8

    recipe = family.recipe(req.variant)
    selected = fp8.select_fp8_layers(fp16_model, recipe, req.variant)
    tensors = fp8.quantized_activation_tensors(fp16_model, selected)
    weight_scales = fp8.compute_weight_scales(fp32_model, selected)
    data = calibration_set(family, req, preprocess)
    total = len(data)
    progress("calibrate", f"{req.calib_method} calibration of {len(tensors)} tensors on "
                          f"{total} images from {data.source}")
    result = calibrate(
        fp32_model, tensors, data.iter_batches(req.calib_batch), method=req.calib_method,
        percentile=req.percentile,
        progress=lambda done: progress("calibrate", f"{done}/{total} images"))
    result, weight_scales = used_scales(result, weight_scales)
    digest = "sha256:" + family.recipe_digest(req.variant)
    metadata = {"data_digest": data.digest, "data_source": data.source, "recipe_digest": digest}
    if data.item_digests:  # per-image identity, so that `bundle eval` can refuse these images
        metadata["item_digests"] = ",".join(sorted(data.item_digests))
    calibration = calibration_to_safetensors(result, weight_scales, metadata)
    model = fp8.to_fp8(fp16_model, selected, result.scale, weight_scales)
    recipe_record = {"name": f"{family.name}/fp8" + (f"/{req.variant}" if req.variant else ""),
                     "digest": digest, "quantized_layers": len(selected),
                     "quantized_activations": len(tensors)}
    calib_record = {"method": result.method, "images": result.images,
                    "data_digest": data.digest, "data_source": data.source,
                    "member": "calibration.safetensors"}
    if result.percentile is not None:
        calib_record["percentile"] = decimal(result.percentile)
    layers = fp8_layers(fp16_model, selected, result.scale, weight_scales)
    return serialize(model), calibration, recipe_record, calib_record, layers


def used_scales(result, weight_scales: dict) -> tuple:
    """The calibration result and weight scales as the graph and every engine use them
    (``bundler.fp8.stored_scale``): applied once here, so that ``calibration.safetensors``
    records exactly what runs."""
    import dataclasses

    from bundler.fp8 import stored_scale

    act = {name: float(stored_scale(s)) for name, s in result.scale.items()}
    return (dataclasses.replace(result, scale=act),
            {node: stored_scale(s) for node, s in weight_scales.items()})


def choose_target(requested: str) -> str:
    """`auto`: tensorrt where it is importable and a GPU is visible, else onnxruntime."""
    if requested != "auto":
        return requested
    from runtime_py.compat import choose_backend, probe_host

    return choose_backend("auto", probe_host())


def reusable_bundle(family: Family, req: MakeRequest, target: str, out_dir: Path,
                    progress: Progress) -> MakeResult | str:
    """A bundle in ``out_dir`` of this request's name (any target tag) made from its inputs
    (``bundler.reuse``), as the result of this make; else why none is."""
    from bundler import targets
    from bundler.reuse import matching_bundle
    from runtime_py.format import open_bundle

    prefix = targets.bundle_name(family.name, family.version, req.precision, req.variant, "",
                                 req.input_dtype)
    # the bundle of this target's own name last, so that `why` is its difference (what the
    # refusal to overwrite it then says)
    own = prefix + target + ".bundle"
    candidates = sorted(out_dir.glob(prefix + "*.bundle"), key=lambda p: (p.name == own, p.name))
    found, why = matching_bundle(candidates, family, req, target)
    if found is None:
        progress("reuse", f"nothing to reuse ({why}): building")
        return why
    with open_bundle(found) as bundle:
        progress("reuse", f"{found.name} was made from the same inputs: reused, nothing built")
        return MakeResult(found, bundle.id, bundle.manifest, reused=True)


# --- the whole job ---------------------------------------------------------------------------

def make_bundle(req: MakeRequest, progress: Progress | None = None) -> MakeResult:
    """Build one bundle; returns its path, id and manifest. Writes nothing on failure."""
    from bundler import targets
    from bundler.writer import write_bundle

    progress = progress or _noop
    started = time.monotonic()
    family = load_family(req.family)
    check_request(family, req)
    target = choose_target(req.backend)
    builder = targets.target_builder(target)
    if hasattr(builder, "check_host"):                # refuse a target this host lacks, early
        builder.check_host(**{"precision": req.precision, **req.target_options})
    from runtime_py.engines.onnxruntime import require_build_version

    require_build_version()       # every make runs ONNX Runtime: refuse an old one, early
    out_dir = prepare_out_dir(req.out_dir)
    difference = None  # why the bundle already there (if any) is not reused
    if req.reuse_existing:
        reused = reusable_bundle(family, req, target, out_dir, progress)
        if isinstance(reused, MakeResult):
            return reused
        difference = reused
    if not req.replace_existing and get_target(target).named_before_build:
        refuse_existing_bundle(out_dir / (targets.bundle_name(
            family.name, family.version, req.precision, req.variant, target,
            req.input_dtype) + ".bundle"), difference)

    weights: Weights = resolve_weights(family, req.checkpoint, req.random_weights, req.seed)
    progress("weights", "seeded random weights (smoke bundle)" if weights.is_random
             else f"checkpoint {weights.source['file']} {weights.source['sha256'][:19]}...")

    from bundler.export import export_fp32_onnx, serialize
    from bundler.graphs.fp16 import to_fp16
    from bundler.torch_model import build_torch_model
    from runtime_py.preprocess import Preprocessor, pixel_input_spec

    torch_model = build_torch_model(family, weights.state_dict, weights.seed)
    progress("export", "exporting the fp32 ONNX graph (cached per weights and versions)")
    fp32_model = export_fp32_onnx(torch_model, family, req.cache_dir)
    fp32_bytes = serialize(fp32_model)
    spec = preprocess_spec(family, torch_model)
    preprocess = Preprocessor(spec)            # float32 NCHW: what calibration runs on
    pixels = req.input_dtype == "uint8"
    if pixels:
        spec = pixel_input_spec(spec)
    reference_preprocess = Preprocessor(spec) if pixels else preprocess

    recipe = calibration_record = None
    layers: dict = {}
    members: dict[str, bytes] = {}
    if req.precision == "fp32":
        model_bytes = fp32_bytes
    else:
        progress("graph", f"typing the graph {req.precision}")
        fp16_model = to_fp16(fp32_model)
        if req.precision == "fp16":
            model_bytes = serialize(fp16_model)
        else:
            (model_bytes, members["calibration.safetensors"], recipe, calibration_record,
             layers) = fp8_graph(family, req, fp32_model, fp16_model, preprocess, progress)

    if pixels:
        progress("graph", "uint8 pixel input: rescale, normalize, layout and cast at the "
                          "head of the graph")
        fp32_bytes, model_bytes = (with_pixel_head(b, preprocess) for b in (fp32_bytes, model_bytes))
        if req.precision == "fp32":
            model_bytes = fp32_bytes

    progress("reference", f"reference outputs on {req.reference_count} held-out inputs")
    inputs, inputs_source = reference_inputs(family, req, reference_preprocess)
    fp32_out = onnx_outputs(fp32_bytes, inputs)
    own_out = (fp32_out if req.precision == "fp32"
               else onnx_outputs(model_bytes, inputs, precision=req.precision))
    quality = manifest_quality(compare_logits(fp32_out, own_out), "fp32 ONNX graph, ONNX Runtime CPU",
                               inputs_source)
    members["reference.safetensors"] = reference_member(family, inputs, fp32_out, own_out)

    progress("engine", f"building the {target} engine")
    context = BuildContext(family, req.precision, req.variant, layers,
                           preprocess.pixel_scale_bias if pixels else None,
                           build_torch_model=lambda: torch_model)
    engine = builder.build_target(model_bytes, batch=manifest_batch(family),
                                  log=lambda msg: progress("engine", msg), context=context,
                                  **req.target_options)
    members["model.onnx"] = model_bytes
    if engine.engine_bytes is not None:
        members[engine.member] = engine.engine_bytes
    import msgpack

    members["preprocess.msgpack"] = msgpack.packb(spec, use_bin_type=True)
    labels = labels_for(family)
    if labels is not None:
        members["labels.msgpack"] = msgpack.packb(labels, use_bin_type=True)

    name = targets.bundle_name(family.name, family.version, req.precision, req.variant, engine.tag,
                               req.input_dtype)
    body = manifest_body(family, req, name, weights, recipe, calibration_record, quality,
                         target, engine)
    if not req.replace_existing:
        refuse_existing_bundle(out_dir / f"{name}.bundle", difference)
    path, bundle_id = write_bundle(out_dir / f"{name}.bundle", body, members)
    progress("done", f"wrote {path} in {time.monotonic() - started:.0f} s")
    return MakeResult(path, bundle_id, body)


def with_pixel_head(model_bytes: bytes, preprocess) -> bytes:
    """The graph with uint8 NHWC pixels in (``bundler.graphs.pixel_head``)."""
    import onnx

    from bundler.export import serialize
    from bundler.graphs.pixel_head import add_pixel_head

    scale, bias = preprocess.pixel_scale_bias
    return serialize(add_pixel_head(onnx.load_from_string(model_bytes), scale, bias))


def reference_member(family: Family, inputs: np.ndarray, fp32_out: np.ndarray,
                     own_out: np.ndarray) -> bytes:
    from runtime_py.reference import reference_to_safetensors

    return reference_to_safetensors(family.input.name, family.output_name, inputs,
                                    fp32_out, own_out)


def manifest_body(family: Family, req: MakeRequest, name: str, weights: Weights,
                  recipe: dict | None, calibration: dict | None, quality: dict, target: str,
                  engine) -> dict:
    c, h, w = family.input.shape
    input_entry = ({"name": family.input.name, "dtype": "uint8", "shape": ["batch", h, w, c]}
                   if req.input_dtype == "uint8" else
                   {"name": family.input.name, "dtype": "float32", "shape": ["batch", c, h, w]})
    return {
        "name": name,
        "family": {"name": family.name, "version": family.version},
        "precision": req.precision,
        "variant": req.variant,
        "recipe": recipe,
        "source": weights.source,
        "inputs": [input_entry],
        "outputs": [{"name": family.output_name, "dtype": "float32",
                     "shape": ["batch", family.num_classes]}],
        "batch": manifest_batch(family),
        "engine": {"backend": engine.backend, "member": engine.member, "details": engine.details},
        "build": {"tool": "trt-bundle", "tool_version": __version__,
                  "packages": package_versions(get_target(target).packages),
                  "source_date_epoch": source_date_epoch(),
                  "opset": family.opset},
        "quality": quality,
        "calibration": calibration,
        "rebuilt_from": None,
    }
