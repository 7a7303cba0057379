"""The `reference.safetensors` member: a few inputs with the outputs they must give.

`input.<name>` holds preprocessed inputs, `fp32.<name>` the fp32 graph's outputs on them
(the family's ground truth), `bundle.<name>` this bundle's own outputs on ONNX Runtime CPU.
CI checks an engine against `bundle.*` (same graph, another engine) and reports quality
against `fp32.*`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from runtime_py.errors import BundleFormatError

FORMAT_TAG = "trt-bundle-reference/1"


@dataclass
class Reference:
    inputs: dict[str, np.ndarray]
    fp32: dict[str, np.ndarray]
    bundle: dict[str, np.ndarray]


def reference_to_safetensors(input_name: str, output_name: str, inputs: np.ndarray,
                             fp32_outputs: np.ndarray, bundle_outputs: np.ndarray) -> bytes:
    from safetensors.numpy import save

    tensors = {
        f"input.{input_name}": np.ascontiguousarray(
            inputs, dtype=np.uint8 if inputs.dtype == np.uint8 else np.float32),
        f"fp32.{output_name}": np.ascontiguousarray(fp32_outputs, dtype=np.float32),
        f"bundle.{output_name}": np.ascontiguousarray(bundle_outputs, dtype=np.float32),
    }
    return save(tensors, metadata={"format": FORMAT_TAG})


def parse_reference(data: bytes) -> Reference:
    """Split the member's tensors by prefix; refuse a member that is not one."""
    from safetensors import SafetensorError
    from safetensors.numpy import load

    try:
        tensors = load(data)
    except (SafetensorError, ValueError) as exc:
        raise BundleFormatError(f"reference.safetensors is unreadable: {exc}") from None
    groups: dict[str, dict[str, np.ndarray]] = {"input": {}, "fp32": {}, "bundle": {}}
    for key, value in tensors.items():
        prefix, _, name = key.partition(".")
        if prefix not in groups or not name:
            raise BundleFormatError(f"reference.safetensors has an unexpected tensor {key!r}")
        groups[prefix][name] = value
    if not groups["input"] or not groups["bundle"]:
        raise BundleFormatError("reference.safetensors lacks input.* or bundle.* tensors")
    return Reference(groups["input"], groups["fp32"], groups["bundle"])


def read_reference(bundle) -> Reference:
    return parse_reference(bundle.read_member("reference.safetensors"))
