"""Bundles built from docs/format.md alone, for the spec-derived fuzz test (docs/fuzzing.md).

Independent of the project's writer and of tests/fuzz_bundles.py: `bundle_bytes` lays out a
file as the format page describes it (header, zstd members with their content size, canonical
msgpack manifest), `manifests` draws manifests that follow every rule of the page (schema and
rules beyond it) and `VIOLATIONS` lists edits that each break exactly one stated rule. That
gives an oracle: a valid draw must be accepted by both readers with the same id and content; a
violated one must be refused by both.
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from typing import Any, Callable

import msgpack
import zstandard
from hypothesis import strategies as st

MAGIC = b"\x89TRTBDL\n"
MAX_COUNT = 2 ** 31 - 1


# --- the file ------------------------------------------------------------------------------

def canonical(value: Any) -> bytes:
    """Canonical msgpack (docs/format.md, Manifest): keys sorted by their UTF-8 bytes."""
    def sort(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: sort(v[k]) for k in sorted(v, key=lambda s: s.encode())}
        if isinstance(v, list):
            return [sort(x) for x in v]
        return v
    return msgpack.packb(sort(value), use_bin_type=True)


def bundle_bytes(body: dict, members: dict[str, bytes], minor: int = 0) -> bytes:
    """Header, members in name order, manifest; `body` gets `format` and `members`."""
    stored, entries, offset = [], [], 64
    for name in sorted(members):
        raw = members[name]
        blob = zstandard.ZstdCompressor(level=3, write_content_size=True).compress(raw)
        entries.append({"name": name, "offset": offset, "stored_size": len(blob),
                        "raw_size": len(raw), "sha256": hashlib.sha256(raw).hexdigest(),
                        "compression": "zstd"})
        stored.append(blob)
        offset += len(blob)
    manifest = canonical(dict(body, format={"major": 1, "minor": minor}, members=entries))
    header = bytearray(MAGIC + struct.pack("<HHIQQ", 1, minor, 0, offset, len(manifest))
                       + hashlib.sha256(manifest).digest())
    struct.pack_into("<I", header, 12, zlib.crc32(bytes(header)))
    return bytes(header) + b"".join(stored) + manifest


# --- valid manifests -----------------------------------------------------------------------

IDENT = st.from_regex(r"\A[a-z0-9][a-z0-9_.-]{0,20}\Z")
HEX64 = st.from_regex(r"\A[0-9a-f]{64}\Z")
SHA = HEX64.map(lambda h: "sha256:" + h)
DECIMAL = st.from_regex(r"\A-?[0-9]{1,6}(\.[0-9]{1,6})?(e[-+]?[0-9]{1,3})?\Z") | st.sampled_from(["nan", "inf", "-inf"])
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)
COUNT = st.integers(1, MAX_COUNT)
DTYPES = ["float32", "float16", "bfloat16", "int64", "int32", "uint8", "int8", "bool"]


@st.composite
def tensors(draw, precision: str, names: set[str]) -> dict:
    name = draw(st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=256)
                .filter(lambda n: n not in names))
    names.add(name)
    dtypes = [d for d in DTYPES if not (precision == "fp32" and d in ("float16", "bfloat16"))]
    dims = draw(st.lists(st.integers(1, MAX_COUNT) | st.sampled_from([1, 3, 224, MAX_COUNT]),
                         max_size=7))
    return {"name": name, "dtype": draw(st.sampled_from(dtypes)), "shape": ["batch", *dims]}


def _engine(draw, backend: str, precision: str, batch: dict) -> dict:
    if backend == "onnxruntime":
        details = {"opset": draw(st.integers(1, 999))}
        if draw(st.booleans()):
            details["min_onnxruntime"] = draw(TEXT)
        return {"backend": backend, "member": "model.onnx", "details": details}
    if backend == "tensorrt":
        details = {"tensorrt_version": draw(TEXT), "compute_capability": draw(st.from_regex(r"\A[0-9]{1,2}\.[0-9]\Z")),
                   "device_name": draw(TEXT), "optimization_level": draw(st.integers(0, 5)),
                   "profile": dict(batch),
                   "hardware_compatibility": draw(st.sampled_from(["none", "ampere+", "same-compute-capability"])),
                   "version_compatible": draw(st.booleans()), "strongly_typed": True,
                   "layer_count": draw(st.integers(0, 2 ** 63 - 1))}
        if draw(st.booleans()):
            details["workspace_bytes"] = draw(st.integers(0, 2 ** 64 - 1))
            details["timing_cache_sha256"] = draw(st.none() | SHA)
            details["build_seconds"] = draw(DECIMAL)
        return {"backend": backend, "member": "engine.plan", "details": details}
    device = "cpu" if precision == "fp32" and draw(st.booleans()) else "cuda"
    details = {"torch_version": draw(TEXT), "cuda_version": draw(st.none() | TEXT),
               "compute_capability": draw(st.none() | st.from_regex(r"\A[0-9]\.[0-9]\Z")),
               "device_name": draw(TEXT), "device": device,
               "compile_options": draw(st.dictionaries(IDENT, st.integers(-5, 5) | TEXT | st.booleans(), max_size=3))}
    if draw(st.booleans()):
        details["batch_sizes"] = draw(st.lists(COUNT, max_size=4))
    if draw(st.booleans()):
        details["static_batches"] = sorted(draw(st.sets(
            st.integers(batch["min"], batch["max"]), max_size=4)))
    return {"backend": backend, "member": "engine.pt2", "details": details}


@st.composite
def manifests(draw) -> tuple[dict, dict[str, bytes]]:
    """(manifest body without format/members, members) following every rule of the page."""
    precision = draw(st.sampled_from(["fp32", "fp16", "fp8"]))
    backend = draw(st.sampled_from(["onnxruntime", "tensorrt", "torch-aoti"]))
    sizes = sorted(draw(st.lists(COUNT | st.integers(1, 64), min_size=3, max_size=3)))
    batch = dict(zip(("min", "opt", "max"), sizes))
    names: set[str] = set()
    family = draw(IDENT)
    fp8 = precision == "fp8"
    body = {
        "name": draw(st.from_regex(r"\A[A-Za-z0-9_.+-]{1,200}\Z")),
        "family": {"name": family, "version": draw(TEXT.filter(bool))},
        "precision": precision,
        "variant": draw(st.none() | IDENT),
        "recipe": {"name": draw(TEXT), "digest": draw(SHA), "quantized_layers": draw(st.integers(0, 500))} if fp8 else None,
        "source": draw(st.sampled_from([{"kind": "random-weights", "seed": -3},
                                        {"kind": "checkpoint", "id": "x/y", "sha256": "sha256:" + "0" * 64}])),
        "inputs": [draw(tensors(precision, names)) for _ in range(draw(st.integers(1, 3)))],
        "outputs": [draw(tensors(precision, names)) for _ in range(draw(st.integers(1, 3)))],
        "batch": batch,
        "engine": _engine(draw, backend, precision, batch),
        "build": {"tool": "trt-bundle", "tool_version": draw(TEXT),
                  "packages": draw(st.dictionaries(TEXT, TEXT, max_size=4)),
                  "source_date_epoch": draw(st.none() | st.integers(0, 2 ** 40)),
                  "opset": draw(st.integers(1, 999))},
        "quality": draw(st.none() | st.fixed_dictionaries({
            "reference": TEXT, "images": st.integers(0, 100), "top1_agreement": DECIMAL,
            "kl_mean": DECIMAL, "max_abs_diff": DECIMAL, "nan_count": st.integers(0, 9),
            "inf_count": st.integers(0, 9)})),
        "calibration": {"method": draw(st.sampled_from(["max", "percentile", "entropy", "mse"])),
                        "images": draw(st.integers(1, 1000)), "data_digest": draw(SHA),
                        "data_source": draw(TEXT), "member": "calibration.safetensors"} if fp8 else None,
        "rebuilt_from": draw(st.none() | HEX64),
    }
    members = {"model.onnx": draw(st.binary(max_size=200))}
    members[body["engine"]["member"]] = draw(st.binary(max_size=200))
    if fp8:
        members["calibration.safetensors"] = draw(st.binary(max_size=64))
    if draw(st.booleans()):
        members["labels.msgpack"] = msgpack.packb(draw(st.lists(TEXT, max_size=5)))
    return body, members


# --- one broken rule each ------------------------------------------------------------------

def _tensor(body: dict) -> dict:
    return body["inputs"][0]


def _deep(depth: int) -> Any:
    value: Any = 1
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


def _drop_member(name: str) -> Callable[[dict, dict], None]:
    def edit(body: dict, members: dict) -> None:
        members.pop(name, None)
    return edit


VIOLATIONS: dict[str, Callable[[dict, dict], None]] = {
    "dimension 0": lambda b, m: _tensor(b)["shape"].append(0),
    "dimension 2^31": lambda b, m: _tensor(b)["shape"].append(2 ** 31),
    "rank 9": lambda b, m: _tensor(b).update(shape=["batch"] + [1] * 8),
    "batch axis twice": lambda b, m: _tensor(b)["shape"].append("batch"),
    "batch axis not first": lambda b, m: _tensor(b).update(shape=[1, "batch"]),
    "duplicate tensor name": lambda b, m: b["outputs"].append(dict(_tensor(b))),
    "65 inputs": lambda b, m: b.update(inputs=[dict(_tensor(b), name=f"t{i}") for i in range(65)]),
    "tensor name of 257 characters": lambda b, m: _tensor(b).update(name="\u00e9" * 257),
    "dtype float64": lambda b, m: _tensor(b).update(dtype="float64"),
    "batch min above opt": lambda b, m: b["batch"].update(min=b["batch"]["opt"] + 1),
    "batch 0": lambda b, m: b["batch"].update(min=0),
    "profile differs from batch": lambda b, m: (
        b["engine"].update(backend="tensorrt", member="engine.plan", details={
            "tensorrt_version": "10", "compute_capability": "9.0", "device_name": "d",
            "optimization_level": 3, "profile": dict(b["batch"], max=b["batch"]["max"] + 1),
            "hardware_compatibility": "none", "version_compatible": False, "strongly_typed": True,
            "layer_count": 1}),
        m.setdefault("engine.plan", b"p")),
    "float16 in an fp32 bundle": lambda b, m: (
        b.update(precision="fp32", recipe=None, calibration=None), m.pop("calibration.safetensors", None),
        b["engine"]["details"].pop("device", None), _tensor(b).update(dtype="float16")),
    "calibration member on a non-fp8 bundle": lambda b, m: (
        b.update(precision="fp16", recipe=None, calibration=None),
        b["engine"]["details"].pop("device", None), m.update({"calibration.safetensors": b"c"})),
    "fp8 without calibration member": lambda b, m: (
        b.update(precision="fp8", recipe=None, calibration={
            "method": "max", "images": 1, "data_digest": "sha256:" + "1" * 64, "data_source": "s",
            "member": "calibration.safetensors"}),
        b["engine"]["details"].pop("device", None), m.pop("calibration.safetensors", None),
        [t.update(dtype="float32") for t in b["inputs"] + b["outputs"]]),
    "fp8 without calibration record": lambda b, m: (
        b.update(precision="fp8", calibration=None), b["engine"]["details"].pop("device", None),
        m.update({"calibration.safetensors": b"c"})),
    "recipe on a non-fp8 bundle": lambda b, m: (
        b.update(precision="fp16", calibration=None, recipe={"name": "r", "digest": "sha256:" + "2" * 64,
                                                             "quantized_layers": 1}),
        b["engine"]["details"].pop("device", None), m.pop("calibration.safetensors", None)),
    "opset 1000": lambda b, m: b["build"].update(opset=1000),
    "name with a trailing newline": lambda b, m: b.update(name=b["name"] + "\n"),
    "variant with a trailing newline": lambda b, m: b.update(variant="v\n"),
    "rebuilt_from with a trailing newline": lambda b, m: b.update(rebuilt_from="a" * 64 + "\n"),
    "unknown top-level key under minor 0": lambda b, m: b.update(zz=1),
    "unknown key in batch under minor 0": lambda b, m: b["batch"].update(zz=1),
    "nesting depth 65": lambda b, m: (   # top map 1, engine 2, details 3, compile_options 4
        b["engine"].update(backend="torch-aoti", member="engine.pt2", details={
            "torch_version": "2", "cuda_version": None, "compute_capability": None, "device_name": "d",
            "compile_options": {"d": _deep(61)}}),
        m.setdefault("engine.pt2", b"p")),
    "string of 65,537 bytes": lambda b, m: b["build"]["packages"].update(x="s" * 65537),
    "1,025 packages": lambda b, m: b["build"].update(packages={f"p{i}": "1" for i in range(1025)}),
    "unknown precision": lambda b, m: b.update(precision="int4"),
    "engine member that is not a member": lambda b, m: m.pop(b["engine"]["member"]),
    "no model.onnx member": lambda b, m: (
        b["engine"].update(backend="torch-aoti", member="engine.pt2", details={
            "torch_version": "2", "cuda_version": None, "compute_capability": None, "device_name": "d",
            "compile_options": {}}),
        m.setdefault("engine.pt2", b"p"), m.pop("model.onnx")),
    "member name with a path": lambda b, m: m.update({"../evil": b"x"}),
    "static batch outside the batch range": lambda b, m: (
        b["engine"].update(backend="torch-aoti", member="engine.pt2", details={
            "torch_version": "2", "cuda_version": None, "compute_capability": None, "device_name": "d",
            "compile_options": {}, "static_batches": [b["batch"]["max"] + 1]}),
        m.setdefault("engine.pt2", b"p")),
    "static batches not ascending": lambda b, m: (
        b["engine"].update(backend="torch-aoti", member="engine.pt2", details={
            "torch_version": "2", "cuda_version": None, "compute_capability": None, "device_name": "d",
            "compile_options": {}, "static_batches": [b["batch"]["max"], b["batch"]["min"]]
            if b["batch"]["max"] > b["batch"]["min"] else [b["batch"]["min"]] * 2}),
        m.setdefault("engine.pt2", b"p")),
    "tool other than trt-bundle": lambda b, m: b["build"].update(tool="other"),
    "strongly_typed false": lambda b, m: b["engine"].update(backend="tensorrt", member="engine.plan", details=dict(
        tensorrt_version="10", compute_capability="9.0", device_name="d", optimization_level=3,
        profile=dict(b["batch"]), hardware_compatibility="none", version_compatible=False,
        strongly_typed=False, layer_count=1)) or m.setdefault("engine.plan", b"p"),
}
