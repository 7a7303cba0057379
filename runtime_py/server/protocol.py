"""The KServe v2 / Open Inference Protocol messages, without any HTTP framework.

Parsing and encoding live apart from the routes so they can be read against the spec
and tested on bytes alone. Covered: the JSON tensor format (flat or nested ``data``,
row-major), output selection, ``id`` echo, and the binary tensor data extension
(``Inference-Header-Content-Length``; per input ``parameters.binary_data_size`` with the
raw little-endian bytes after the JSON header, in input order; per output
``parameters.binary_data`` or request-wide ``parameters.binary_data_output``).

Every problem with a request raises ``RequestError`` carrying the HTTP status to send;
nothing here trusts a size or a shape it was given before checking it: a declared shape is
checked against the model's (rank, fixed dimensions, batch size) before anything is
allocated or reshaped, and a JSON body is refused by its size and element count before it
is parsed (``json_limits``, ``load_json``), by its nesting right after.
"""

from __future__ import annotations

import functools

import json
import math
from importlib import metadata
from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np

from ..errors import UsageError
from ..tensors import TensorSpec, is_dynamic

SERVER_NAME = "trt-bundle"
EXTENSIONS = ["binary_tensor_data", "classify"]
HEADER_LENGTH = "Inference-Header-Content-Length"

# KServe datatype name -> numpy dtype name. BYTES exists in the protocol but no model
# served here takes variable-length strings, so it is named in errors, not accepted.
KSERVE_TO_NUMPY = {
    "BOOL": "bool", "UINT8": "uint8", "UINT16": "uint16", "UINT32": "uint32",
    "UINT64": "uint64", "INT8": "int8", "INT16": "int16", "INT32": "int32",
    "INT64": "int64", "FP16": "float16", "FP32": "float32", "FP64": "float64",
}
NUMPY_TO_KSERVE = {v: k for k, v in KSERVE_TO_NUMPY.items()}
# numpy kinds of parsed JSON values each target dtype accepts (no float -> int truncation).
_JSON_KINDS = {"b": "b", "u": "iu", "i": "iu", "f": "iuf"}


class RequestError(UsageError):
    """A request the server refuses; ``status`` is the HTTP status to answer with."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class JsonLimits(NamedTuple):
    """Bounds on a JSON request for one model: what its largest valid request needs."""

    max_bytes: int      # of the JSON text
    max_elements: int   # numbers in all inputs' ``data``, estimated from the commas
    max_depth: int      # arrays and objects, the request object being depth 1


# Bytes one JSON number may take in a valid request ("-1.2345678901234567e-308, "), and
# the room for everything that is not tensor data (names, parameters, outputs, id).
_JSON_BYTES_PER_ELEMENT = 28
_JSON_OVERHEAD_BYTES = 64 * 1024
_JSON_OVERHEAD_ELEMENTS = 1024
MAX_DIM = 2 ** 31 - 1


def json_limits(inputs: Sequence[TensorSpec], max_batch: int | None = None) -> JsonLimits:
    """The limits for a model taking ``inputs`` at batch sizes up to ``max_batch``.

    Elements: every input at the largest batch. Depth: request -> inputs list -> input
    object -> ``data`` nested at most as deep as the rank (plus ``parameters`` maps).
    """
    batch = max_batch if max_batch and max_batch > 0 else 1
    elements = 0
    for spec in inputs:
        n = 1
        for d in spec.shape:
            n *= batch if is_dynamic(d) else max(int(d), 1)
        elements += n
    rank = max((len(s.shape) for s in inputs), default=1)
    return JsonLimits(
        max_bytes=_JSON_OVERHEAD_BYTES + elements * _JSON_BYTES_PER_ELEMENT,
        max_elements=elements + _JSON_OVERHEAD_ELEMENTS,
        max_depth=rank + 4,
    )


class OutputRequest(NamedTuple):
    name: str
    binary: bool


class InferRequest(NamedTuple):
    """A parsed inference request: arrays ready for the batcher, and what to send back."""

    id: str | None
    feeds: dict[str, np.ndarray]
    outputs: list[OutputRequest]


@functools.lru_cache(maxsize=256)
def dtype_name(dtype: Any) -> str:
    """``np.dtype(dtype).name``, cached: numpy computes ``.name`` in Python (~3 us), and the
    serving paths name every tensor of every request."""
    return np.dtype(dtype).name


@functools.lru_cache(maxsize=256)
def kserve_datatype(dtype: Any) -> str:
    """KServe datatype name of a numpy dtype (``float32`` -> ``FP32``)."""
    name = dtype_name(dtype)
    try:
        return NUMPY_TO_KSERVE[name]
    except KeyError:
        raise UsageError(f"dtype {name} has no KServe datatype") from None


def _tensor_metadata(spec: TensorSpec) -> dict:
    return {
        "name": spec.name,
        "datatype": kserve_datatype(spec.dtype),
        "shape": [-1 if is_dynamic(d) else int(d) for d in spec.shape],
    }


def server_metadata() -> dict:
    """``GET /v2``: name, version and the extensions this server implements."""
    try:
        version = metadata.version("trt-bundle")
    except metadata.PackageNotFoundError:
        version = "0+unknown"
    return {"name": SERVER_NAME, "version": version, "extensions": list(EXTENSIONS)}


def model_metadata(model: Any) -> dict:
    """``GET /v2/models/{name}``: datatypes as KServe names, dynamic dims as -1."""
    return {
        "name": model.name,
        "versions": [str(model.version)],
        "platform": model.platform,
        "inputs": [_tensor_metadata(s) for s in model.inputs],
        "outputs": [_tensor_metadata(s) for s in model.outputs],
    }


# --- requests ---------------------------------------------------------------------------

def split_body(body: bytes, header_length: str | None) -> tuple[bytes | memoryview, memoryview]:
    """Cut the body into the JSON header and the binary part (empty without the header)."""
    if header_length is None:
        return body, memoryview(b"")
    try:
        n = int(header_length.strip())
    except ValueError:
        raise RequestError(f"{HEADER_LENGTH} must be an integer, got {header_length!r}") from None
    if not 0 < n <= len(body):
        raise RequestError(
            f"{HEADER_LENGTH} is {n} but the body has {len(body)} bytes; it must give the "
            f"length of the JSON header, which is followed by the binary tensor data"
        )
    view = memoryview(body)
    return view[:n], view[n:]


def load_json(data: bytes | memoryview, limits: JsonLimits | None = None) -> Any:
    """Decode a JSON document, turning every decoding failure into a 400.

    With ``limits``, a document larger than the model could need is refused before it is
    parsed (413 by size, 400 by element count: each element but the last is followed by a
    comma, so commas bound the count from above at C speed), and one nested deeper than
    any valid request right after.
    """
    if limits is not None and len(data) > limits.max_bytes:
        raise RequestError(
            f"JSON request of {len(data)} bytes is larger than any valid request for "
            f"this model ({limits.max_bytes} bytes); send large tensors as binary data",
            413)
    raw = data if isinstance(data, bytes) else bytes(data)
    if limits is not None:
        commas = raw.count(b",")
        if commas + 1 > limits.max_elements:
            raise RequestError(
                f"JSON request holds up to {commas + 1} values, more than any valid request "
                f"for this model ({limits.max_elements})")
    try:
        document = json.loads(raw)
    except (ValueError, RecursionError) as e:   # JSONDecodeError, UnicodeDecodeError
        raise RequestError(f"request body is not valid JSON: {str(e)[:200]}") from None
    # Each level of nesting opens with a bracket, so a document with no more brackets than
    # the limit cannot nest deeper (the header of a binary request: no walk, ~5 us saved)
    if (limits is not None and raw.count(b"[") + raw.count(b"{") > limits.max_depth
            and _depth_exceeds(document, limits.max_depth)):
        del document
        raise RequestError(f"JSON request nests deeper than {limits.max_depth} levels")
    return document


def _depth_exceeds(document: Any, limit: int) -> bool:
    """True when arrays/objects nest deeper than ``limit`` (iterative; a list's depth is
    judged by its first element, which is all a regular tensor needs, and np.asarray
    refuses ragged data anyway)."""
    stack = [(document, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            if depth > limit:
                return True
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            if depth > limit:
                return True
            if node:
                if isinstance(node[0], (list, dict)):
                    stack.extend((v, depth + 1) for v in node)
    return False


def parse_infer_request(
    header: Any, binary: memoryview, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec],
    *, max_batch: int | None = None,
) -> InferRequest:
    """Validate a decoded inference request against the model and build its arrays.

    Binary inputs are zero-copy views of ``binary``; JSON inputs are converted with the
    declared datatype after checking that the values are of a compatible kind. Every
    declared shape is checked against the model's (``check_shape``) first.
    """
    if not isinstance(header, dict):
        raise RequestError("the inference request must be a JSON object")
    req_id = header.get("id")
    if req_id is not None and not isinstance(req_id, str):
        raise RequestError("'id' must be a string")
    params = _params(header, "the request")
    binary_default = params.get("binary_data_output", False)
    if not isinstance(binary_default, bool):
        raise RequestError("parameter 'binary_data_output' must be a boolean")

    raw_inputs = header.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise RequestError("'inputs' must be a non-empty list of tensors")
    specs = {s.name: s for s in inputs}
    feeds: dict[str, np.ndarray] = {}
    offset = 0
    for i, item in enumerate(raw_inputs):
        if not isinstance(item, dict):
            raise RequestError(f"inputs[{i}] must be an object")
        name = item.get("name")
        if not isinstance(name, str):
            raise RequestError(f"inputs[{i}]: 'name' must be a string")
        if name in feeds:
            raise RequestError(f"input {name!r} is given more than once")
        spec = specs.get(name)
        if spec is None:
            raise RequestError(f"unknown input {name!r}; the model takes {list(specs)}")
        shape = check_shape(_shape(item.get("shape"), name), name, spec, max_batch)
        dtype = _datatype(item.get("datatype"), name, spec)
        count = math.prod(shape)
        in_params = _params(item, f"input {name!r}")
        if "binary_data_size" in in_params:
            size = in_params["binary_data_size"]
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise RequestError(f"input {name!r}: binary_data_size must be a non-negative integer")
            if "data" in item:
                raise RequestError(f"input {name!r}: give either 'data' or binary_data_size, not both")
            expected = count * dtype.itemsize
            if size != expected:
                raise RequestError(
                    f"input {name!r}: binary_data_size is {size} bytes but shape {shape} "
                    f"of {item['datatype']} needs {expected}"
                )
            if offset + size > len(binary):
                raise RequestError(
                    f"input {name!r}: binary data ends at byte {offset + size} but only "
                    f"{len(binary)} bytes follow the JSON header"
                )
            arr = np.frombuffer(binary[offset:offset + size], dtype=dtype.newbyteorder("<"))
            offset += size
            if arr.dtype != dtype:   # big-endian host: one swap into native order
                arr = arr.astype(dtype)
            if dtype.kind == "b" and size and arr.view(np.uint8).max() > 1:
                raise RequestError(f"input {name!r}: BOOL bytes must be 0 or 1")
            feeds[name] = arr.reshape(shape)
        elif "data" in item:
            feeds[name] = _json_array(item["data"], name, shape, count, dtype)
        else:
            raise RequestError(f"input {name!r} has neither 'data' nor binary_data_size")
    if offset != len(binary):
        raise RequestError(
            f"{len(binary)} bytes of binary data follow the JSON header but the inputs' "
            f"binary_data_size add up to {offset}"
        )
    return InferRequest(req_id, feeds, _outputs(header, outputs, binary_default))


def _params(obj: dict, where: str) -> dict:
    params = obj.get("parameters", {})
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise RequestError(f"{where}: 'parameters' must be an object")
    return params


def _shape(shape: Any, name: str) -> list[int]:
    if not isinstance(shape, list) or len(shape) > 64 or not all(
        isinstance(d, int) and not isinstance(d, bool) and 0 <= d <= MAX_DIM for d in shape
    ):
        raise RequestError(f"input {name!r}: 'shape' must be a list of at most 64 integers "
                           f"in 0..{MAX_DIM}")
    return shape


def check_shape(shape: list[int], name: str, spec: TensorSpec,
                max_batch: int | None = None) -> list[int]:
    """``shape`` if it fits ``spec``: same rank, every fixed dimension equal, every dynamic
    one (the batch axis) in 1..``max_batch``. Checked before any array is made, so no
    declared size can make the server allocate or reshape to something absurd."""
    if len(shape) != len(spec.shape):
        raise RequestError(f"input {name!r}: shape {_short(shape)} has {len(shape)} dimensions, "
                           f"the model takes {len(spec.shape)}: {list(spec.shape)}")
    for axis, (got, want) in enumerate(zip(shape, spec.shape)):
        if is_dynamic(want):
            if got < 1 or (max_batch is not None and got > max_batch):
                limit = f"in 1..{max_batch}" if max_batch is not None else ">= 1"
                raise RequestError(f"input {name!r}: batch size is {got} (dimension {axis}), "
                                   f"must be {limit}")
        elif got != want:
            raise RequestError(f"input {name!r}: shape {_short(shape)} does not match the "
                               f"model's {list(spec.shape)}")
    return shape


def _short(shape: list[int]) -> str:
    return str(shape) if len(shape) <= 8 else f"[{', '.join(map(str, shape[:8]))}, ...]"


def _datatype(datatype: Any, name: str, spec: TensorSpec) -> np.dtype:
    want = kserve_datatype(spec.dtype)
    if not isinstance(datatype, str) or datatype not in KSERVE_TO_NUMPY:
        known = ", ".join(KSERVE_TO_NUMPY)
        hint = " (BYTES inputs are not supported)" if datatype == "BYTES" else ""
        raise RequestError(
            f"input {name!r}: unknown datatype {datatype!r}{hint}; expected one of {known}"
        )
    if datatype != want:
        raise RequestError(f"input {name!r}: datatype {datatype} but the model takes {want}")
    return np.dtype(KSERVE_TO_NUMPY[datatype])


def _json_array(data: Any, name: str, shape: list[int], count: int, dtype: np.dtype) -> np.ndarray:
    try:
        parsed = np.asarray(data)
    except (ValueError, TypeError) as e:   # ragged nesting
        raise RequestError(f"input {name!r}: 'data' is not a regular array: {e}") from None
    if parsed.size != count:
        raise RequestError(
            f"input {name!r}: 'data' has {parsed.size} elements but shape {shape} needs {count}"
        )
    if count and parsed.dtype.kind not in _JSON_KINDS[dtype.kind]:
        raise RequestError(
            f"input {name!r}: 'data' holds {_kind_name(parsed.dtype)} values, "
            f"not valid for {NUMPY_TO_KSERVE[dtype.name]}"
        )
    if count and dtype.kind in "iu":
        info = np.iinfo(dtype)
        if parsed.min() < info.min or parsed.max() > info.max:
            raise RequestError(
                f"input {name!r}: values outside the range of {NUMPY_TO_KSERVE[dtype.name]}"
            )
    return parsed.astype(dtype, copy=False).reshape(shape)


def _kind_name(dtype: np.dtype) -> str:
    return {"b": "boolean", "i": "integer", "u": "integer", "f": "number",
            "U": "string"}.get(dtype.kind, "mixed or null")


def _outputs(header: dict, outputs: Sequence[TensorSpec], binary_default: bool) -> list[OutputRequest]:
    known = [s.name for s in outputs]
    requested = header.get("outputs")
    if requested is None:
        return [OutputRequest(n, binary_default) for n in known]
    if not isinstance(requested, list):
        raise RequestError("'outputs' must be a list")
    result = []
    for i, item in enumerate(requested):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise RequestError(f"outputs[{i}] must be an object with a 'name'")
        name = item["name"]
        if name not in known:
            raise RequestError(f"unknown output {name!r}; the model has {known}")
        binary = _params(item, f"output {name!r}").get("binary_data", binary_default)
        if not isinstance(binary, bool):
            raise RequestError(f"output {name!r}: parameter 'binary_data' must be a boolean")
        result.append(OutputRequest(name, binary))
    return result


# --- responses --------------------------------------------------------------------------

def encode_infer_response(
    model_name: str,
    model_version: str,
    request_id: str | None,
    results: Mapping[str, np.ndarray],
    outputs: Sequence[OutputRequest],
) -> tuple[bytes, dict[str, str], str]:
    """Body, extra headers and media type of an inference response.

    With no binary output this is plain JSON. Otherwise the JSON header (each binary output
    carrying ``binary_data_size`` and no ``data``) is followed by the outputs' raw
    little-endian bytes in order, and ``Inference-Header-Content-Length`` gives the JSON
    length.
    """
    entries = []
    blobs: list[np.ndarray] = []
    for out in outputs:
        arr = results[out.name]
        entry: dict[str, Any] = {
            "name": out.name,
            "datatype": kserve_datatype(arr.dtype),
            "shape": list(arr.shape),
        }
        if out.binary:
            le = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<"))
            entry["parameters"] = {"binary_data_size": le.nbytes}
            blobs.append(le)
        else:
            entry["data"] = arr.ravel().tolist()
        entries.append(entry)
    response: dict[str, Any] = {"model_name": model_name, "model_version": model_version}
    if request_id is not None:
        response["id"] = request_id
    response["outputs"] = entries
    header = json.dumps(response, separators=(",", ":")).encode()
    if not blobs:
        return header, {}, "application/json"
    body = b"".join([header, *(b.reshape(-1).view(np.uint8) for b in blobs)])
    return body, {HEADER_LENGTH: str(len(header))}, "application/octet-stream"
