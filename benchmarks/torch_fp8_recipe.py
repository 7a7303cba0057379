"""A family's FP8 layers and scales from its torch model alone, for benchmarks on a GPU host.

``bundle make`` selects the FP8 layers on the exported ONNX graph (``bundler.graphs.fp8``)
and calibrates the activation scales with ONNX Runtime on the CPU: minutes for a ViT-B, and
a benchmark of engine variants needs neither the graph nor the bundle. This module gives the
same selection and the same "max" calibration on the torch model:

* selection: each Conv2d and Linear is described with the facts the ONNX rules test
  (``bundler.graphs.fp8.selected_by``): the exporter names a parameter node by its module
  path, a Conv2d exports as ``Conv`` (kernel_shape, group, depthwise), a Linear as ``Gemm``
  on a 2-D input and ``MatMul`` otherwise (read from a shape-only pass on meta tensors); the
  recipe's ``expected_count`` is checked as make checks it;
* scales: per selected layer, the activation scale is the largest |input| over the
  calibration images / 448 (make's "max" calibrator measures the same tensor, the layer's
  input in the fp32 graph; ``scale_from_amax``), the weight scales the per-output-channel
  amax / 448 of the BN-folded kernel (``scale_of``, as ``compute_weight_scales``); both
  through ``bundler.fp8.stored_scale``, the rule every engine uses.

What differs from a bundle: the fp32 arithmetic of torch instead of ONNX Runtime (last-bit
differences in the amax) and the calibration images (``synthetic_calibration_set``, as
make's default). Imports torch inside the functions.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np


def module_facts(model, input_shape: tuple[int, ...]) -> dict[str, dict[str, Any]]:
    """Module path -> the facts an ONNX selection rule tests, for every Conv2d and Linear."""
    from torch import nn

    from bundler.targets.torch_aoti.model import shape_pass

    linears = [p for p, m in model.named_modules() if isinstance(m, nn.Linear)]
    ndim = shape_pass(model, linears, input_shape, lambda inputs, _out: inputs[0].dim())
    facts: dict[str, dict[str, Any]] = {}
    for path, m in model.named_modules():
        if isinstance(m, nn.Conv2d):
            facts[path] = {"op_type": "Conv", "name": path, "module": path, "group": m.groups,
                           "kernel_shape": list(m.kernel_size),
                           "depthwise": m.groups > 1 and m.in_channels == m.groups}
        elif isinstance(m, nn.Linear) and path in ndim:
            facts[path] = {"op_type": "Gemm" if ndim[path] == 2 else "MatMul", "name": path,
                           "module": path, "group": 1}
    return facts


def select_modules(model, family, variant: str | None = None) -> list[str]:
    """The module paths the family's fp8 recipe (``variant``'s) selects, in model order.
    Raises FamilyError when the count is not the recipe's ``expected_count``."""
    from bundler.graphs.fp8 import selected_by
    from runtime_py.errors import FamilyError

    recipe = family.recipe(variant)
    facts = module_facts(model, tuple(family.input.shape))
    chosen = [p for p, f in facts.items() if selected_by(recipe.get("select", {}), f)]
    expected = recipe.get("expected_count")
    if expected is not None and len(chosen) != expected:
        raise FamilyError(f"the fp8 recipe of {family.name} ({variant or 'base'}) selects "
                          f"{len(chosen)} modules of the torch model, the family expects "
                          f"{expected}")
    return chosen


def max_scales(model, paths: list[str], batches: Iterable[np.ndarray], device: str = "cpu"
               ) -> dict[str, tuple[float, np.ndarray]]:
    """Module path -> (activation scale, per-output-channel weight scales), "max"
    calibration of ``model`` (fp32) over ``batches`` (module docstring)."""
    import torch

    from bundler.calibration.calibrators import scale_from_amax
    from bundler.fp8 import scale_of, stored_scale

    modules = dict(model.named_modules())
    amax: dict[str, float] = {p: 0.0 for p in paths}

    def record(p):
        def hook(_m, args):
            amax[p] = max(amax[p], float(args[0].detach().abs().max()))
        return hook

    hooks = [modules[p].register_forward_pre_hook(record(p)) for p in paths]
    try:
        with torch.no_grad():
            for batch in batches:
                model(torch.as_tensor(batch, dtype=torch.float32, device=device))
    finally:
        for h in hooks:
            h.remove()
    scales = {}
    for p in paths:
        w = modules[p].weight.detach().float().cpu()
        channel_amax = w.reshape(w.shape[0], -1).abs().amax(dim=1).numpy()
        scales[p] = (float(stored_scale(scale_from_amax(amax[p]))),
                     stored_scale(scale_of(channel_amax)))
    return scales
