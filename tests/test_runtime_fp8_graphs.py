"""The runtime runs FP8 Q/DQ graphs as written (ONNX Runtime's optimizer changes them).

On the fp8-depthwise graph of timm_xception, ONNX Runtime 1.32's optimized session gave
logits about 0.075 off fp32, the graph as written 0.003: the runtime and the bundle's
reference outputs must be the latter."""

from __future__ import annotations

import numpy as np
import runtime_py
from bundler.export import serialize
from bundler.writer import write_bundle
from corrupt import sample_body
from synthetic_bundles import FP8_CALIBRATION, calibration_member


def test_fp8_depthwise_bundle_runs_as_written(tmp_path, graphs_fp32, graphs_fp16, graphs_family,
                                             graphs_inputs, graphs_fp32_outputs,
                                             graphs_max_scales):
    from bundler.graphs.fp8 import compute_weight_scales, select_fp8_layers, to_fp8

    selected = select_fp8_layers(graphs_fp16, graphs_family, "fp8-depthwise")
    model = to_fp8(graphs_fp16, selected, graphs_max_scales(selected),
                   compute_weight_scales(graphs_fp32, selected))
    body = sample_body(precision="fp8", name="x-fp8-depthwise-1-onnxruntime",
                       inputs=[{"name": "input", "dtype": "float32", "shape": ["batch", 3, 299, 299]}],
                       outputs=[{"name": "logits", "dtype": "float32", "shape": ["batch", 1000]}],
                       calibration=FP8_CALIBRATION)
    path, _ = write_bundle(tmp_path / "dw.bundle", body, {"model.onnx": serialize(model),
                                                         "calibration.safetensors": calibration_member()})
    with runtime_py.load(path, backend="onnxruntime") as loaded:
        got = loaded.infer(graphs_inputs["eval"])["logits"]
    scale = float(np.abs(graphs_fp32_outputs).max())
    assert float(np.abs(got - graphs_fp32_outputs).max()) <= 0.05 * scale
