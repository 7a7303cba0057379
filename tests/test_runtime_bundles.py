"""runtime_py on the family's real bundles (fp32, fp16, fp8; ONNX Runtime engine):
load, infer against the stored reference outputs, batches above the max, classify through
the bundle's preprocessing, and serving one over the KServe v2 protocol."""

from __future__ import annotations

import asyncio
import io
import json

import httpx
import numpy as np
import pytest

import runtime_py
from runtime_py.batcher import Batcher
from runtime_py.errors import InferenceInputError
from runtime_py.format import open_bundle
from runtime_py.reference import read_reference
from runtime_py.server.app import create_app

HL = "Inference-Header-Content-Length"


def jpeg(seed: int, size=(500, 375)) -> bytes:
    from PIL import Image

    rng = np.random.default_rng(seed)
    pixels = (rng.random((size[1], size[0], 3)) * 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="JPEG")
    return buf.getvalue()


@pytest.mark.parametrize("precision", ["fp32", "fp16", "fp8"])
def test_load_infer_matches_reference_and_classify(xception_bundles, precision):
    with open_bundle(xception_bundles[precision]) as b:
        ref = read_reference(b)
    with runtime_py.load(xception_bundles[precision]) as model:
        assert model.backend == "onnxruntime" and model.max_batch_size == 32
        assert [s.name for s in model.inputs] == ["input"]
        x = ref.inputs["input"]
        out = model.infer(x)["logits"]
        np.testing.assert_allclose(out, ref.bundle["logits"], rtol=0, atol=1e-5)
        assert np.array_equal(model.infer({"input": x[:1]})["logits"], model.infer(x[:1])["logits"])
        results = model.classify([jpeg(1), jpeg(2, (120, 90))], top_k=5)
        assert len(results) == 2 and all(len(r) == 5 for r in results)
        top = results[0][0]
        assert top["label"] == model.labels[top["index"]] and 0 < top["score"] <= 1
        scores = [r["score"] for r in results[0]]
        assert scores == sorted(scores, reverse=True)
        with pytest.raises(InferenceInputError, match="float32"):
            model.infer(x.astype(np.float64))


def test_batches_above_the_engine_max_are_split(xception_bundles):
    with runtime_py.load(xception_bundles["fp16"]) as model:
        model.max_batch_size = 2          # as if the engine took 2: the split path runs
        x = read_reference_inputs(xception_bundles["fp16"])
        whole = model.infer(x)["logits"]
        parts = np.concatenate([model.infer(x[i:i + 1])["logits"] for i in range(len(x))])
        assert whole.shape == (len(x), 1000)
        np.testing.assert_allclose(whole, parts, rtol=0, atol=1e-5)


def read_reference_inputs(path):
    with open_bundle(path) as b:
        return read_reference(b).inputs["input"]


def test_serving_the_fp8_bundle(xception_bundles):
    with runtime_py.load(xception_bundles["fp8"]) as model:
        batcher = Batcher(model, max_delay_ms=1)
        app = create_app({model.name: model}, {model.name: batcher})
        x = read_reference_inputs(xception_bundles["fp8"])[:2]

        async def requests():
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t",
                                         timeout=120) as c:
                meta = (await c.get(f"/v2/models/{model.name}")).json()
                header = json.dumps({"inputs": [{
                    "name": "input", "shape": list(x.shape), "datatype": "FP32",
                    "parameters": {"binary_data_size": x.nbytes}}],
                    "parameters": {"binary_data_output": True}}).encode()
                infer = await c.post(f"/v2/models/{model.name}/infer",
                                     content=header + x.tobytes(), headers={HL: str(len(header))})
                classify = await c.post(f"/v2/models/{model.name}/classify?top_k=3",
                                        content=jpeg(3), headers={"Content-Type": "image/jpeg"})
                bad = await c.post(f"/v2/models/{model.name}/infer", content=b"{nope")
                ready = await c.get(f"/v2/models/{model.name}/ready")
                return meta, infer, classify, bad, ready

        try:
            meta, infer, classify, bad, ready = asyncio.run(requests())
        finally:
            batcher.close()
        assert meta["name"] == "timm_xception-fp8-1.0.0"
        assert meta["inputs"][0] == {"name": "input", "datatype": "FP32", "shape": [-1, 3, 299, 299]}
        assert infer.status_code == 200
        n = int(infer.headers[HL])
        out = np.frombuffer(infer.content[n:], "<f4").reshape(2, 1000)
        np.testing.assert_array_equal(out, model.infer(x)["logits"])
        assert classify.status_code == 200 and len(classify.json()["predictions"]) == 3
        assert bad.status_code == 400 and "error" in bad.json()
        assert ready.status_code == 200


@pytest.mark.parametrize("name,backend,served", [
    ("timm_xception-fp8-1.0.0-onnxruntime", "onnxruntime", "timm_xception-fp8-1.0.0"),
    ("timm_xception-fp16-1.0.0-tensorrt-sm90-trt11.4", "tensorrt", "timm_xception-fp16-1.0.0"),
    ("timm_xception-fp8-depthwise-1.0.0-torch-aoti", "torch-aoti",
     "timm_xception-fp8-depthwise-1.0.0")])
def test_served_name_drops_the_engine_target(name, backend, served):
    from runtime_py.model import served_name

    assert served_name({"name": name, "engine": {"backend": backend}}) == served
