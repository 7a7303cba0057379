"""The manifest rules a JSON Schema cannot say (docs/format.md, "Rules beyond the schema").

Run after the schema has passed, so every field read here has its schema type. The C++
reader implements the same list in cpp_stub/src/checks.cpp (`check_semantics`); the
differential fuzz test (tests/test_fuzz_readers.py) holds the two to the same answers.
"""

from __future__ import annotations

_HALF_FLOATS = ("float16", "bfloat16")
_BOUNDS = ("min", "opt", "max")

_MIB = 1 << 20
# docs/format.md, "Member size limits": a reader holds a whole metadata member in memory,
# so its declared raw_size is bounded before anything is decompressed. Only the graph
# (model.onnx) and the engine member legitimately reach gigabytes.
METADATA_MEMBER_LIMITS = {"preprocess.msgpack": _MIB, "labels.msgpack": _MIB,
                          "calibration.safetensors": 64 * _MIB,
                          "reference.safetensors": 64 * _MIB}
OTHER_MEMBER_LIMIT = 64 * _MIB


def member_raw_size_limit(name: str, engine_member: str) -> int | None:
    """The most bytes member `name` may declare; None for the graph and the engine."""
    if name in ("model.onnx", engine_member):
        return None
    return METADATA_MEMBER_LIMITS.get(name, OTHER_MEMBER_LIMIT)


def _range(sizes: dict) -> str:
    return "/".join(str(sizes[k]) for k in _BOUNDS)


def _tensor_problems(manifest: dict) -> list[str]:
    problems = []
    seen: set[str] = set()
    for side in ("inputs", "outputs"):
        for i, tensor in enumerate(manifest["inputs" if side == "inputs" else "outputs"]):
            where = f"{side}/{i}"
            shape = tensor["shape"]
            batch_axes = [k for k, d in enumerate(shape) if d == "batch"]
            if batch_axes != [0]:
                problems.append(f"{where}/shape: the batch axis must appear exactly once, "
                                f"first (found at {batch_axes or 'no axis'})")
            if tensor["name"] in seen:
                problems.append(f"{where}/name: tensor name {tensor['name']!r} is used twice")
            seen.add(tensor["name"])
            if manifest["precision"] == "fp32" and tensor["dtype"] in _HALF_FLOATS:
                problems.append(f"{where}/dtype: {tensor['dtype']} in an fp32 bundle")
    return problems


def _ordered(where: str, sizes: dict) -> list[str]:
    if not sizes["min"] <= sizes["opt"] <= sizes["max"]:
        return [f"{where}: needs min <= opt <= max (got {sizes['min']}, {sizes['opt']}, "
                f"{sizes['max']})"]
    return []


def _member_size_problems(manifest: dict) -> list[str]:
    problems = []
    for entry in manifest["members"]:
        limit = member_raw_size_limit(entry["name"], manifest["engine"]["member"])
        if limit is not None and entry["raw_size"] > limit:
            problems.append(f"members: {entry['name']} declares raw_size {entry['raw_size']}, "
                            f"over its limit of {limit} bytes (docs/format.md, \"Member size "
                            "limits\"): a hostile or corrupt bundle")
    return problems


def semantic_problems(manifest: dict) -> list[str]:
    """Every broken rule, one line each (empty: none)."""
    problems = _tensor_problems(manifest)
    problems += _ordered("batch", manifest["batch"])
    engine = manifest["engine"]
    if engine["backend"] == "tensorrt":
        profile = engine["details"]["profile"]
        problems += _ordered("engine/details/profile", profile)
        if [profile[k] for k in _BOUNDS] != [manifest["batch"][k] for k in _BOUNDS]:
            problems.append(
                "engine/details/profile: the TensorRT optimization profile must equal the batch "
                f"range (profile {_range(profile)}, batch {_range(manifest['batch'])}); rebuild "
                "the plan for the batch range or fix the manifest")
    precision = manifest["precision"]
    members = {m["name"] for m in manifest["members"]}
    if "model.onnx" not in members:
        problems.append("members: no model.onnx member (every bundle carries its ONNX graph, the "
                        "source of every engine)")
    if precision != "fp8":
        for field in ("recipe", "calibration"):
            if manifest[field] is not None:
                problems.append(f"{field}: only fp8 bundles have one ({precision} bundle)")
        if "calibration.safetensors" in members:
            problems.append(f"members: calibration.safetensors in a {precision} bundle "
                            "(fp8 only)")
    elif "calibration.safetensors" not in members:
        problems.append("members: an fp8 bundle needs its calibration.safetensors member (the "
                        "FP8 scales); rebuild it with `bundle make --precision fp8`")
    if precision == "fp8" and manifest["calibration"] is None:
        problems.append("calibration: an fp8 bundle records how it was calibrated (got nil)")
    if manifest["calibration"] is not None and "calibration.safetensors" not in members:
        problems.append("calibration: the bundle has no calibration.safetensors member")
    if (engine["backend"] == "torch-aoti" and engine["details"].get("device") == "cpu"
            and precision != "fp32"):
        problems.append(f"engine/details/device: torch-aoti CPU packages are fp32 only "
                        f"({precision} bundle)")
    static = engine["details"].get("static_batches") if engine["backend"] == "torch-aoti" else None
    if static is not None and (static != sorted(set(static)) or any(
            not manifest["batch"]["min"] <= n <= manifest["batch"]["max"] for n in static)):
        problems.append(f"engine/details/static_batches: {static} must be ascending, each size "
                        f"once, within the batch range {manifest['batch']['min']}.."
                        f"{manifest['batch']['max']}")
    return problems + _member_size_problems(manifest)
