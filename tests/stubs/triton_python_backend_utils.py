"""A test double of Triton's `triton_python_backend_utils` (the python backend's API).

Only what `runtime_py.triton_python` uses, with the real module's names and call shapes
(Tensor(name, array).as_numpy(), get_input_tensor_by_name, InferenceResponse with
output_tensors/error, TritonError.message(), TritonModelException). It lets the generated
`model.py` files run in tests exactly as Triton would import and call them; it is not
Triton: scheduling, batching and the C++ side are not simulated.
"""

from __future__ import annotations

import numpy as np


class TritonModelException(Exception):
    pass


class TritonError:
    def __init__(self, message: str) -> None:
        self._message = message

    def message(self) -> str:
        return self._message


class Tensor:
    def __init__(self, name: str, array: np.ndarray) -> None:
        if not isinstance(array, np.ndarray):
            raise TritonModelException(f"Tensor {name!r} needs a numpy array")
        self._name = name
        self._array = array

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array


class InferenceRequest:
    """What Triton hands to `execute` (built by the tests)."""

    def __init__(self, inputs: list[Tensor]) -> None:
        self._inputs = list(inputs)

    def inputs(self) -> list[Tensor]:
        return list(self._inputs)


class InferenceResponse:
    def __init__(self, output_tensors: list[Tensor], error: TritonError | None = None) -> None:
        self._outputs = list(output_tensors)
        self._error = error

    def output_tensors(self) -> list[Tensor]:
        return list(self._outputs)

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error


def get_input_tensor_by_name(request: InferenceRequest, name: str) -> Tensor | None:
    return next((t for t in request.inputs() if t.name() == name), None)


def get_output_tensor_by_name(response: InferenceResponse, name: str) -> Tensor | None:
    return next((t for t in response.output_tensors() if t.name() == name), None)
