"""Digests of what the bundler computes on small graphs holding each op kind of the
families' graphs (float32, fp16, FP8 Q/DQ), printed as one JSON object.

Run by tests/test_portable_graphs.py natively and under qemu as another CPU: the build's
sessions (`cpu_session`, calibration) must give the same bits on both, and the runner's
own level must not (else the comparison could not tell). Needs numpy, onnx and
onnxruntime only, so that it starts in seconds under emulation.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from onnx import TensorProto as T  # noqa: E402
from onnx import helper  # noqa: E402
from onnx import numpy_helper as nh  # noqa: E402

from bundler.calibration.collect import collect_statistics  # noqa: E402
from bundler.graphs.portable import portable_bytes  # noqa: E402
from runtime_py.engines.onnxruntime import cpu_session, import_onnxruntime, session_options  # noqa: E402

CONV_OUTPUTS = ["c3", "c1", "cd", "cs", "mp", "gp", "fc"]
TOKEN_OUTPUTS = ["mm", "sm", "ln", "gelu"]


def graph(dtype: int) -> bytes:
    """Convolutions (3x3, 1x1, depthwise, strided) with ReLU, residual add, pools and the
    classifier; MatMul, Softmax, LayerNormalization and erf GELU on [2, 197, 64] tokens;
    for fp16 also an FP8 Q/DQ pair and a convolution over its output."""
    rng = np.random.default_rng(0)
    np_type = np.float16 if dtype == T.FLOAT16 else np.float32

    def w(*shape):
        return nh.from_array(rng.standard_normal(shape).astype(np_type), f"init{len(inits)}")

    inits: list = []
    names = {}
    for key, shape in (("w3", (24, 16, 3, 3)), ("b3", (24,)), ("w1", (24, 16, 1, 1)),
                       ("wd", (16, 1, 3, 3)), ("ws", (24, 16, 3, 3)), ("fcw", (1000, 24)),
                       ("fcb", (1000,)), ("mw", (64, 64)), ("g", (64,)), ("b", (64,))):
        inits.append(w(*shape))
        names[key] = inits[-1].name
    for key, value in (("root2", 1.4142135), ("one", 1.0), ("half", 0.5)):
        inits.append(nh.from_array(np.array(value, np_type), key))
    n = helper.make_node
    nodes = [n("Cast", ["x32"], ["x"], to=dtype), n("Cast", ["t32"], ["t"], to=dtype),
             n("Conv", ["x", names["w3"], names["b3"]], ["c3"], pads=[1, 1, 1, 1]),
             n("Relu", ["c3"], ["r3"]),
             n("Conv", ["x", names["w1"]], ["c1"]),
             n("Add", ["r3", "c1"], ["res"]),
             n("Conv", ["x", names["wd"]], ["cd"], pads=[1, 1, 1, 1], group=16),
             n("Conv", ["x", names["ws"]], ["cs"], pads=[1, 1, 1, 1], strides=[2, 2]),
             n("MaxPool", ["res"], ["mp"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
             n("GlobalAveragePool", ["res"], ["gp"]), n("Flatten", ["gp"], ["flat"]),
             n("Gemm", ["flat", names["fcw"], names["fcb"]], ["fc"], transB=1),
             n("MatMul", ["t", names["mw"]], ["mm"]), n("Softmax", ["mm"], ["sm"], axis=-1),
             n("LayerNormalization", ["t", names["g"], names["b"]], ["ln"], axis=-1, epsilon=1e-6),
             n("Div", ["mm", "root2"], ["z"]), n("Erf", ["z"], ["erf"]),
             n("Add", ["erf", "one"], ["erf1"]), n("Mul", ["mm", "erf1"], ["g2"]),
             n("Mul", ["g2", "half"], ["gelu"])]
    outputs = CONV_OUTPUTS + TOKEN_OUTPUTS
    if dtype == T.FLOAT16:
        inits += [nh.from_array(np.array(0.02, np.float16), "sx"),
                  helper.make_tensor("zero8", T.FLOAT8E4M3FN, [], [0.0]),
                  helper.make_tensor("wq8", T.FLOAT8E4M3FN, [24, 16, 1, 1],
                                     rng.standard_normal(24 * 16).tolist()),
                  nh.from_array((np.abs(rng.standard_normal(24)) * 0.01 + 1e-3).astype(np.float16),
                                "w8scale")]
        nodes += [n("QuantizeLinear", ["x", "sx", "zero8"], ["xq"]),
                  n("DequantizeLinear", ["xq", "sx", "zero8"], ["xdq"]),
                  n("DequantizeLinear", ["wq8", "w8scale"], ["w8dq"], axis=0),
                  n("Conv", ["xdq", "w8dq"], ["q1"])]
        outputs.append("q1")
    g = helper.make_graph(nodes, "ops", [helper.make_tensor_value_info("x32", T.FLOAT, [2, 16, 23, 23]),
                                         helper.make_tensor_value_info("t32", T.FLOAT, [2, 197, 64])],
                          [helper.make_tensor_value_info(o, dtype, None) for o in outputs], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model.SerializeToString()


def digest(arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


def main() -> dict:
    ort = import_onnxruntime()
    rng = np.random.default_rng(1)
    feeds = {"x32": rng.standard_normal((2, 16, 23, 23)).astype(np.float32),
             "t32": (rng.standard_normal((2, 197, 64)) * 3).astype(np.float32)}
    fp32, fp16 = graph(T.FLOAT), graph(T.FLOAT16)
    out = {}
    # the build: fp32 references and quality (portable graph), fp16 / fp8 references
    out["build fp32"] = digest(cpu_session(portable_bytes(fp32), "fp32").run(None, feeds))
    out["build fp16"] = digest(cpu_session(fp16, "fp16").run(None, feeds))
    out["build fp8"] = digest(cpu_session(fp16, "fp8").run(None, feeds))
    # calibration over the fp32 graph (a graph of one input: the tokens ride as constants)
    one_input = graph(T.FLOAT)
    import onnx

    model = onnx.load_from_string(one_input)
    model.graph.initializer.append(nh.from_array(feeds["t32"], "t32"))
    del model.graph.input[1]
    stats = collect_statistics(model, ["c3", "c1", "res", "cd", "mm", "sm", "ln", "gelu"],
                               [feeds["x32"]], histogram_bins=0)
    out["calibration amax"] = digest([np.float32(stats[k].amax) for k in sorted(stats)])
    # the runner's level, unrewritten: what the build no longer uses
    opts = session_options(ort, "fp32")
    runner = ort.InferenceSession(fp32, opts, providers=["CPUExecutionProvider"])
    got = runner.run(None, feeds)
    out["runner fp32 convolutions"] = digest(got[:len(CONV_OUTPUTS)])
    out["runner fp32 softmax"] = digest([got[len(CONV_OUTPUTS) + TOKEN_OUTPUTS.index("sm")]])
    return out


if __name__ == "__main__":
    print(json.dumps(main()))
