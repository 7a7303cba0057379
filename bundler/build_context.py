"""What `bundle make` (or `bundle rebuild`) knows about a bundle, handed to every target.

An engine target turns the bundle's typed ONNX into an engine; some targets need more than
the graph (torch-aoti compiles the family's torch model, with the fp8 layers and scales the
graph was made with). Make has all of it in hand, so it passes it on instead of each target
re-deriving it from the graph and the calibration bytes: the family, precision and variant,
the fp8 layer selection with the scales every engine uses (``bundler.fp8.stored_scale``),
the torch model (built only when a target asks for it) and the uint8 pixel head.

`bundle rebuild` builds the same context from a bundle (``context_from_bundle``): the
manifest names family, precision and variant, the calibration member holds the scales,
and the graph says which tensor each selected layer reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Callable

from runtime_py.errors import UsageError

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np
    import torch

    from bundler.families import Family

__all__ = ["BuildContext", "Fp8Layer", "fp8_layers", "context_from_bundle"]


@dataclass(frozen=True)
class Fp8Layer:
    """One FP8 layer of the bundle: its ONNX node (named by its torch module path,
    ``bundler.export``), op type, the activation tensor it reads, and the scales as the
    graph stores them."""

    node: str
    op_type: str
    tensor: str
    act_scale: float
    weight_scales: np.ndarray = field(repr=False)

    @property
    def module(self) -> str:
        """The torch module path (the export's naming contract)."""
        return self.node


@dataclass
class BuildContext:
    """What make knows (module docstring). ``torch_model`` is built on first use."""

    family: Family
    precision: str
    variant: str | None = None
    #: ONNX node -> its FP8 layer, in graph order (empty unless precision is fp8)
    fp8: dict[str, Fp8Layer] = field(default_factory=dict)
    #: (scale, bias) of the uint8 pixel head, or None for float32 NCHW input
    pixel_scale_bias: tuple[Any, Any] | None = None
    build_torch_model: Callable[[], torch.nn.Module] | None = field(default=None, repr=False)

    @cached_property
    def torch_model(self) -> torch.nn.Module:
        """The family's BN-folded fp32 torch model with the bundle's weights."""
        if self.build_torch_model is None:
            raise UsageError(f"this build has no torch model of {self.family.name} (its "
                             "weights are not at hand)")
        return self.build_torch_model()


def fp8_layers(model: Any, selected: list[str], act_scales: dict[str, float],
               weight_scales: dict[str, np.ndarray]) -> dict[str, Fp8Layer]:
    """The ``Fp8Layer`` of each selected node of ``model`` (fp32, fp16 or fp8 graph)."""
    from bundler.graphs.fp8 import activation_tensors

    tensors = activation_tensors(model, selected)
    ops = {n.name: n.op_type for n in model.graph.node}
    missing = [t for t in tensors.values() if t not in act_scales]
    missing += [n for n in selected if n not in weight_scales]
    if missing:
        raise UsageError(f"no fp8 scale for {len(missing)} layer(s) or tensor(s) (first: "
                         f"{missing[0]!r}); recalibrate", problems=missing)
    return {node: Fp8Layer(node, ops[node], tensors[node], float(act_scales[tensors[node]]),
                           weight_scales[node]) for node in selected}


def context_from_bundle(manifest: dict, members: dict[str, bytes], family: Family,
                        build_torch_model: Callable[[], torch.nn.Module] | None
                        ) -> BuildContext:
    """The context of an existing bundle (`bundle rebuild`), from its manifest, graph and
    calibration member. Refuses a bundle whose recipe is not the family's (the layers
    would not be the ones the calibration describes)."""
    import onnx

    from bundler.calibration.store import calibration_from_safetensors

    precision, variant = manifest["precision"], manifest.get("variant")
    if manifest["family"]["version"] != family.version:
        raise UsageError(f"the bundle is family {family.name} {manifest['family']['version']}; "
                         f"this install has {family.version}: rebuild with that version")
    layers: dict[str, Fp8Layer] = {}
    if precision == "fp8":
        recipe = (manifest.get("recipe") or {}).get("digest")
        if recipe != "sha256:" + family.recipe_digest(variant):
            raise UsageError(f"the bundle's fp8 recipe ({recipe}) is not {family.name}'s "
                             f"{variant or 'base'} recipe in this install")
        calib = calibration_from_safetensors(members["calibration.safetensors"])
        model = onnx.load_model_from_string(members["model.onnx"])
        layers = fp8_layers(model, list(calib.weight_scales), calib.result.scale,
                            calib.weight_scales)
    pixel = None
    if manifest["inputs"][0]["dtype"] == "uint8":
        import msgpack

        from runtime_py.preprocess import Preprocessor

        spec = msgpack.unpackb(members["preprocess.msgpack"], raw=False)
        pixel = Preprocessor(spec).pixel_scale_bias
    return BuildContext(family, precision, variant, layers, pixel, build_torch_model)
