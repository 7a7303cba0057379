"""HTTP inference requests with the shared-memory extension, as ``InferCall``s.

``protocol`` parses the JSON and binary tensor formats; this module adds what the system
shared-memory extension changes: an input or output whose ``parameters`` name a
``shared_memory_region`` carries no data, only a region, an offset and a byte size, which
the engine resolves (it owns the registry). Parsing of everything else is ``protocol``'s.
"""

from __future__ import annotations

import json
import math
from typing import Any, Mapping, Sequence

import numpy as np

from ..tensors import TensorSpec
from . import protocol
from .engine import InferCall, ShmInput, ShmOutput
from .protocol import RequestError
from .shm import ShmRef

SHM_REGION = "shared_memory_region"
SHM_SIZE = "shared_memory_byte_size"
SHM_OFFSET = "shared_memory_offset"


def shm_ref(params: Mapping[str, Any], what: str) -> ShmRef | None:
    """The region reference in a tensor's parameters, or None when it has none."""
    region = params.get(SHM_REGION)
    if region is None:
        return None
    size = params.get(SHM_SIZE)
    offset = params.get(SHM_OFFSET, 0)
    if not isinstance(region, str) or not region:
        raise RequestError(f"{what}: {SHM_REGION} must be a non-empty string")
    for key, v in ((SHM_SIZE, size), (SHM_OFFSET, offset)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise RequestError(f"{what}: {key} must be a non-negative integer")
    return ShmRef(region, offset, size)


def shm_input(name: str, shape: Any, datatype: Any, spec: TensorSpec | None,
              ref: ShmRef, max_batch: int | None = None) -> ShmInput:
    """Check a shared-memory input's name, shape and datatype like ``protocol`` does."""
    if spec is None:
        raise RequestError(f"unknown input {name!r}")
    shape = protocol.check_shape(protocol._shape(shape, name), name, spec, max_batch)
    dtype = protocol._datatype(datatype, name, spec)
    return ShmInput(ref, dtype, shape)


def parse_http_call(model: str, version: str | None, header: Any, binary: memoryview,
                    inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec],
                    max_batch: int | None = None) -> InferCall:
    """A decoded HTTP inference request (JSON header + binary part) as an ``InferCall``."""
    if not isinstance(header, dict):
        raise RequestError("the inference request must be a JSON object")
    raw_inputs = header.get("inputs")
    shm_inputs: dict[str, ShmInput] = {}
    rest = raw_inputs
    if isinstance(raw_inputs, list):
        specs = {s.name: s for s in inputs}
        rest = []
        for i, item in enumerate(raw_inputs):
            params = item.get("parameters") if isinstance(item, dict) else None
            ref = shm_ref(params, f"inputs[{i}]") if isinstance(params, dict) else None
            if ref is None:
                rest.append(item)
                continue
            name = item.get("name")
            if not isinstance(name, str):
                raise RequestError(f"inputs[{i}]: 'name' must be a string")
            if name in shm_inputs:
                raise RequestError(f"input {name!r} is given more than once")
            if "data" in item or "binary_data_size" in params:
                raise RequestError(f"input {name!r}: give either shared memory or data, not both")
            shm_inputs[name] = shm_input(name, item.get("shape"), item.get("datatype"),
                                         specs.get(name), ref, max_batch)
    if rest or not shm_inputs:
        parsed = protocol.parse_infer_request(dict(header, inputs=rest), binary, inputs, outputs,
                                              max_batch=max_batch)
        req_id, feeds, wanted = parsed.id, parsed.feeds, parsed.outputs
        dup = set(feeds) & set(shm_inputs)
        if dup:
            raise RequestError(f"input {sorted(dup)[0]!r} is given more than once")
    else:
        if len(binary):
            raise RequestError("binary data follows the JSON header but no input takes it")
        req_id = header.get("id")
        if req_id is not None and not isinstance(req_id, str):
            raise RequestError("'id' must be a string")
        default = protocol._params(header, "the request").get("binary_data_output", False)
        if not isinstance(default, bool):
            raise RequestError("parameter 'binary_data_output' must be a boolean")
        feeds, wanted = {}, protocol._outputs(header, outputs, default)
    shm_outputs: dict[str, ShmRef] = {}
    for item in header.get("outputs") or []:
        params = item.get("parameters")
        if isinstance(params, dict):
            ref = shm_ref(params, f"output {item['name']!r}")
            if ref is not None:
                shm_outputs[item["name"]] = ref
    return InferCall(model, version, req_id, feeds, shm_inputs, wanted, shm_outputs)


def encode_http_response(info_name: str, version: str, call: InferCall,
                         results: Mapping[str, np.ndarray | ShmOutput]
                         ) -> tuple[bytes, dict[str, str], str]:
    """``protocol.encode_infer_response``, plus entries for outputs written to shared memory."""
    inline = [o for o in call.outputs if not isinstance(results[o.name], ShmOutput)]
    if len(inline) == len(call.outputs):
        return protocol.encode_infer_response(info_name, version, call.id, results, inline)
    body, headers, media = protocol.encode_infer_response(info_name, version, call.id,
                                                          results, inline)
    n = int(headers.get(protocol.HEADER_LENGTH, len(body)))
    doc = json.loads(body[:n])
    by_name = {e["name"]: e for e in doc["outputs"]}
    entries = []
    for o in call.outputs:
        r = results[o.name]
        if isinstance(r, ShmOutput):
            size = math.prod(r.shape) * r.dtype.itemsize
            entries.append({"name": o.name, "datatype": protocol.kserve_datatype(r.dtype),
                            "shape": list(r.shape),
                            "parameters": {SHM_REGION: r.ref.region, SHM_SIZE: size}})
        else:
            entries.append(by_name[o.name])
    doc["outputs"] = entries
    header = json.dumps(doc, separators=(",", ":")).encode()
    if protocol.HEADER_LENGTH in headers:
        headers = dict(headers, **{protocol.HEADER_LENGTH: str(len(header))})
        return header + body[n:], headers, media
    return header, headers, media
