"""Triton's extensions that common tools call, as plain JSON-able data: the model
configuration, the repository index, and server metadata with the extensions served.

The JSON uses the field names of Triton's ``model_config.proto`` (as Triton's HTTP
endpoint does), so the gRPC service builds its protobuf messages from the same dicts
(``google.protobuf.json_format.ParseDict``): one source for each number.
"""

from __future__ import annotations

from ..tensors import TensorSpec, is_dynamic
from . import protocol
from .engine import ModelInfo

EXTENSIONS = [*protocol.EXTENSIONS, "model_configuration", "model_repository",
              "statistics", "system_shared_memory"]


def server_metadata() -> dict:
    meta = protocol.server_metadata()
    meta["extensions"] = list(EXTENSIONS)
    return meta


def model_metadata(info: ModelInfo) -> dict:
    """``protocol.model_metadata`` plus a ``random_weights`` flag a client can act on."""
    meta = protocol.model_metadata(info)
    if info.random_weights:
        meta["parameters"] = {"random_weights": True}
    return meta


def _config_tensor(spec: TensorSpec) -> dict:
    # With max_batch_size > 0 Triton's dims leave out the batch axis.
    return {"name": spec.name, "data_type": "TYPE_" + protocol.kserve_datatype(spec.dtype),
            "dims": [-1 if is_dynamic(d) else int(d) for d in spec.shape[1:]]}


def model_config(info: ModelInfo) -> dict:
    """``GET /v2/models/{name}/config``: what Triton's model configuration would say."""
    config = {
        "name": info.name,
        "platform": info.platform,
        "max_batch_size": info.batcher_max_batch,
        "input": [_config_tensor(s) for s in info.inputs],
        "output": [_config_tensor(s) for s in info.outputs],
        "dynamic_batching": {
            "preferred_batch_size": [info.batcher_max_batch],
            "max_queue_delay_microseconds": int(round(info.max_delay_ms * 1000)),
        },
        "version_policy": {"latest": {"num_versions": 1}},
    }
    if info.random_weights:
        config["parameters"] = {"random_weights": {"string_value": "true"}}
    return config


def repository_index(infos: list[ModelInfo]) -> list[dict]:
    """``POST /v2/repository/index``: every served model is loaded and ready."""
    return [{"name": i.name, "version": i.version, "state": "READY", "reason": ""}
            for i in infos]
