"""Triton python-backend models over runtime_py: a bundle's engine, and its preprocessing.

`bundle export triton` writes a three-line `model.py` that hands Triton's
`triton_python_backend_utils` module to one of the factories here. Keeping the logic in
runtime_py (instead of in generated files) means it is versioned, imported and tested like
the rest of the runtime; Triton's Python environment needs `trt-bundle` (plus the engine's
package) installed, nothing else.

Triton calls ``execute`` with every request its dynamic batcher grouped; they are run as
one engine batch (split by the model above its max batch) and answered one response per
request. A request whose inputs are wrong gets its own error response and does not fail
the others.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from runtime_py.tensors import check_feeds


def model_parameters(model_config: dict) -> dict[str, str]:
    """The string parameters of a model config as Triton hands it over (JSON)."""
    return {k: v.get("string_value", "") for k, v in model_config.get("parameters", {}).items()}


def _version_folder(args: dict) -> str:
    return os.path.join(args["model_repository"], str(args["model_version"]))


def bundle_model_class(pb_utils: Any) -> type:
    """`TritonPythonModel` serving the bundle file stored in the model's version folder."""

    class TritonPythonModel:
        def initialize(self, args: dict) -> None:
            import runtime_py

            config = json.loads(args["model_config"])
            params = model_parameters(config)
            device = args.get("model_instance_device_id") or 0
            path = os.path.join(_version_folder(args), params["bundle_file"])
            self.model = runtime_py.load(path, backend=params.get("runtime_backend", "auto"),
                                         device=int(device))
            if self.model.id != params["bundle_id"]:
                self.model.close()
                raise pb_utils.TritonModelException(
                    f"{path} has id {self.model.id}, but the model config names bundle "
                    f"{params['bundle_id']}: export the repository again")
            self.input_names = [s.name for s in self.model.inputs]
            self.output_names = [s.name for s in self.model.outputs]

        def _feeds(self, request) -> dict[str, np.ndarray]:
            feeds = {}
            for name in self.input_names:
                tensor = pb_utils.get_input_tensor_by_name(request, name)
                if tensor is None:
                    raise ValueError(f"missing input {name!r}; the model takes {self.input_names}")
                feeds[name] = tensor.as_numpy()
            return feeds

        def execute(self, requests: list) -> list:
            responses: list = [None] * len(requests)
            feeds, sizes, index = [], [], []
            for i, request in enumerate(requests):
                try:
                    f = self._feeds(request)
                    sizes.append(check_feeds(self.model.inputs, f))
                    feeds.append(f)
                    index.append(i)
                except Exception as exc:   # this request only
                    responses[i] = _error(pb_utils, exc)
            if feeds:
                try:
                    merged = {n: np.concatenate([f[n] for f in feeds]) for n in self.input_names}
                    outputs = self.model.infer(merged)
                except Exception as exc:   # the engine failed the whole batch
                    for i in index:
                        responses[i] = _error(pb_utils, exc)
                else:
                    start = 0
                    for i, n in zip(index, sizes):
                        responses[i] = pb_utils.InferenceResponse(output_tensors=[
                            pb_utils.Tensor(name, np.ascontiguousarray(outputs[name][start:start + n]))
                            for name in self.output_names])
                        start += n
            return responses

        def finalize(self) -> None:
            self.model.close()

    return TritonPythonModel


def preprocess_model_class(pb_utils: Any) -> type:
    """`TritonPythonModel` turning encoded images (TYPE_STRING) into the bundle's input,
    with the bundle's own preprocessing spec (`preprocess.json` in the version folder)."""

    class TritonPythonModel:
        def initialize(self, args: dict) -> None:
            from runtime_py.preprocess import Preprocessor

            config = json.loads(args["model_config"])
            params = model_parameters(config)
            with open(os.path.join(_version_folder(args), "preprocess.json"), "rb") as f:
                self.preprocessor = Preprocessor(json.load(f))
            self.image_name = params["image_input"]
            self.output_name = self.preprocessor.input_name

        def execute(self, requests: list) -> list:
            responses = []
            for request in requests:
                try:
                    tensor = pb_utils.get_input_tensor_by_name(request, self.image_name)
                    if tensor is None:
                        raise ValueError(f"missing input {self.image_name!r}")
                    images = [item if isinstance(item, bytes) else bytes(item)
                              for item in tensor.as_numpy().reshape(-1)]
                    batch = self.preprocessor.batch(images)
                    responses.append(pb_utils.InferenceResponse(
                        output_tensors=[pb_utils.Tensor(self.output_name, batch)]))
                except Exception as exc:
                    responses.append(_error(pb_utils, exc))
            return responses

        def finalize(self) -> None:
            pass

    return TritonPythonModel


def _error(pb_utils: Any, exc: Exception):
    from runtime_py.errors import BundleError

    message = str(exc) if isinstance(exc, BundleError) else f"{type(exc).__name__}: {exc}"
    return pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(message))
