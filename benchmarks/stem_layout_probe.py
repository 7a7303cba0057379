"""Issue 18, timm_resnet50: which memory layout AOTInductor gives the fused stem's
convolution. One GPU call, ~2-3 minutes, no bundles.

Why: with the stem fused (``fused.StemConv`` then ``StemPool``, 2026-12-07) the module
under ``torch.compile`` ran 62 us faster at batch 32 on an H100, but the bundle's
package ran the stem's convolution on NCHW data: cuDNN converted its input and weight
to NHWC and its output back (0.065 + 0.053 ms), and a copy made the pool's NHWC input
(0.033 ms), where the unfused stem had none of these (docs/measurements/h100-2026-12-07-d).

Each variant is a stem-only engine module (fp32 NCHW in, the first block's e4m3 input
out, as float), exported with a dynamic batch and compiled by AOTInductor as a bundle
build does (``build.compile_package``), then profiled at batch 32: every kernel a replay
launches, with its time. Variants:

* ``unfused``: the stem as the fused model had it before (the convolution with its bias,
  ReLU, max pool, then the quantize);
* ``fused``: ``StemConv`` then ``StemPool``;
* ``fused-nhwc-out``: the same with ``StemConv``'s output made channels_last explicitly;
* ``fused-force-layout``: ``fused`` compiled with Inductor's ``force_layout_optimization``;
* ``model`` and ``model-unfused``: the whole fused fp8 timm_resnet50 (random weights, the
  family's TMA form) with the stem fused and not, a dynamic-batch graph only (no static
  ones), its stem's kernels printed (the whole model's were where the layout went wrong).

    python3 benchmarks/stem_layout_probe.py [--variants unfused,fused,...] [--batch 32]
        [--strict] [--explain] [--no-fake-cache]

``--explain`` (``explaining``) prints Inductor's layout decisions for each convolution. It
found the cause (forty-ninth session, h100-2026-12-07-e): in the whole model, the
fake-tensor cache of the graph's shape environment held an NCHW answer for the stem
convolution's NHWC arguments, which the fake convolution itself answers NHWC. With
``--no-fake-cache`` the package runs it NHWC; builds now compile that way
(``build.FAKE_TENSOR_CACHE``).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

if str(Path(__file__).resolve().parents[1]) not in sys.path:   # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

VARIANTS = ("unfused", "fused", "fused-nhwc-out", "fused-force-layout", "model",
            "model-unfused")


def model_module(fuse_stem: bool) -> nn.Module:
    """The whole fused fp8 timm_resnet50 engine module (module docstring)."""
    import numpy as np

    from bundler.families import load_family
    from bundler.targets.torch_aoti.fused import rewrite_fused
    from bundler.targets.torch_aoti.kernels.fp8_conv_tma import MEASURED_TMA_TILES_BY_BATCH
    from bundler.targets.torch_aoti.nhwc_modules import EngineModule
    from bundler.torch_model import build_torch_model

    model = build_torch_model(load_family("timm_resnet50"), seed=0)
    fp8 = {n: (0.02, np.full(m.out_channels, 1e-3, np.float32))
           for n, m in model.named_modules() if isinstance(m, nn.Conv2d) and n != "conv1"}
    body = rewrite_fused(model, fp8, tma=True, tma_batch_tiles=MEASURED_TMA_TILES_BY_BATCH,
                         fuse_stem=fuse_stem)
    return EngineModule(body, torch.float16, False, True).cuda().eval()


def stem_module(variant: str) -> nn.Module:
    """The stem-only engine module of ``variant`` (module docstring)."""
    if variant.startswith("model"):
        return model_module(variant == "model")
    from bundler.targets.torch_aoti.fp8_layers import quantize
    from bundler.targets.torch_aoti.fused import StemConv, StemPool, scale_tensor
    from bundler.targets.torch_aoti.nhwc_modules import EngineModule

    torch.manual_seed(0)
    conv = nn.Conv2d(3, 64, 7, 2, 3)

    class Unfused(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 64, 7, 2, 3).half()
            self.conv.load_state_dict(conv.half().state_dict())
            self.act, self.pool = nn.ReLU(), nn.MaxPool2d(3, 2, 1)
            self.register_buffer("scale", scale_tensor(0.01))

        def forward(self, x):
            y = self.pool(self.act(self.conv(x)))
            return quantize(y.permute(0, 2, 3, 1), self.scale[:1]).float()

    class Fused(nn.Module):
        def __init__(self, nhwc_out: bool) -> None:
            super().__init__()
            self.conv, self.pool = StemConv(conv), StemPool(conv, 0.01, out16=False)
            self.nhwc_out = nhwc_out

        def forward(self, x):
            y = self.conv(x)
            if self.nhwc_out:
                y = y.contiguous(memory_format=torch.channels_last)
            return self.pool(y)[1].float()

    body = Unfused() if variant == "unfused" else Fused(variant == "fused-nhwc-out")
    return EngineModule(body.to(memory_format=torch.channels_last), torch.float16, False,
                        True).cuda().eval()


def describe(node) -> str:
    """An Inductor IR node's kind and, once it has one, its layout's kind and strides."""
    try:
        layout = node.get_layout()
    except Exception:   # noqa: BLE001 - an unrealized node has none yet
        return f"{type(getattr(node, 'data', node)).__name__} (no layout yet)"
    return f"{type(layout).__name__} stride {list(layout.stride)}"


@contextlib.contextmanager
def explaining() -> Iterator[None]:
    """Print, for each graph Inductor lowers, its layout-optimization decision and, for
    each convolution, the layouts of its input and weight as the lowering finds them, the
    exported graph's strides for them, and the layout the lowering gives its output: where
    the fused stem's convolution in the whole model turns NCHW."""
    from unittest import mock

    from torch._inductor import lowering
    from torch._inductor.graph import GraphLowering
    from torch._inductor.virtualized import V

    decide = GraphLowering.decide_layout_opt
    conv = lowering.lowerings[torch.ops.aten.convolution.default]

    def decide_layout_opt(gm, *, is_inference):
        answer = decide(gm, is_inference=is_inference)
        nodes = len(list(gm.graph.nodes))
        convs = sum(n.target is torch.ops.aten.convolution.default for n in gm.graph.nodes)
        print(f"   layout_opt={answer} ({nodes} nodes, {convs} aten convolutions)", flush=True)
        return answer

    def convolution(x, weight, *args, **kwargs):
        node = V.graph.current_node
        fx = [getattr(a, "meta", {}).get("val") for a in node.args[:2]]
        print(f"   conv {node.name}: x {describe(x)}, weight {describe(weight)}; "
              f"exported x {list(fx[0].stride()) if fx[0] is not None else '?'}, "
              f"weight {list(fx[1].stride()) if fx[1] is not None else '?'}", flush=True)
        fake_layout(x, weight, *args)
        out = conv(x, weight, *args, **kwargs)
        print(f"      -> out {describe(out)}", flush=True)
        return out

    with mock.patch.object(GraphLowering, "decide_layout_opt", staticmethod(decide_layout_opt)), \
            mock.patch.dict(lowering.lowerings, {torch.ops.aten.convolution.default: convolution}):
        yield


def fake_layout(x, weight, bias, stride, padding, dilation, transposed, output_padding,
                groups) -> None:
    """What the fake convolution Inductor's ``conv_layout`` runs says of these two nodes:
    whether their sizes have hints (without one, the fake convolution leaves its output
    contiguous), the convolution backend it picks and its memory format, and the output's
    strides."""
    import inspect

    from torch._inductor import ir
    from torch._inductor.virtualized import V
    from torch._subclasses import fake_impls

    try:
        with V.graph.fake_mode:
            tx, tw = ir.ir_node_to_tensor(x), ir.ir_node_to_tensor(weight)
            hints = [s.node.has_hint() if isinstance(s, torch.SymInt) else "int"
                     for s in tx.shape]
            print(f"      fake x {list(tx.shape)} stride {list(tx.stride())} hints {hints}; "
                  f"weight stride {list(tw.stride())}", flush=True)
            try:
                backend = torch._C._select_conv_backend(
                    tx, tw, None, list(stride), list(padding), list(dilation), transposed,
                    list(output_padding), groups, None)
                fmt = torch._C._conv_determine_backend_memory_format(tx, tw, backend)
                print(f"      backend {backend}, memory format {fmt}", flush=True)
            except Exception as e:   # noqa: BLE001 - the signature differs between versions
                print(f"      backend: {type(e).__name__}: {str(e)[:200]}", flush=True)
            out = torch.ops.aten.convolution(tx, tw, None, list(stride), list(padding),
                                             list(dilation), transposed,
                                             list(output_padding), groups)
            print(f"      fake out stride {list(out.stride())}", flush=True)
    except Exception as e:   # noqa: BLE001 - a probe: say what failed and go on
        print(f"      fake convolution: {type(e).__name__}: {str(e)[:300]}", flush=True)
    cached_convolutions()
    if not getattr(fake_layout, "shown", False):
        fake_layout.shown = True
        src = inspect.getsource(fake_impls.conv).splitlines()
        print("      this torch's fake convolution, its hint lines:", flush=True)
        for i, line in enumerate(src):
            if "hint" in line or "mem_fmt = " in line:
                print(f"        {i}: {line.strip()}", flush=True)


def cached_convolutions() -> None:
    """The fake-tensor dispatch cache's convolution entries of the graph being lowered: the
    strides of each entry's output (a cached answer is given for every later call whose
    arguments have the same metadata)."""
    from torch._inductor.virtualized import V
    from torch._subclasses.fake_tensor import FakeTensorMode

    shape_env = V.graph.fake_mode.shape_env
    for where, cache in (("shape env", getattr(shape_env, "fake_tensor_cache", {})),
                         ("global", FakeTensorMode.cache)):
        for key, entry in list(cache.items()):
            values = getattr(key, "key", ())
            if not values or values[0] is not torch.ops.aten.convolution.default:
                continue
            infos = getattr(entry, "output_infos", None) or [entry]
            strides = [getattr(getattr(i, "metadata", None), "stride", "?") for i in infos]
            print(f"      cached ({where}): {type(entry).__name__} out strides {strides}",
                  flush=True)
    info = FakeTensorMode.cache_info()
    print(f"      fake cache: {info.hits} hits, {info.misses} misses", flush=True)


def profile_package(path: Path, batch: int, label: str) -> list[dict]:
    """The kernels of one call of the package at ``batch`` (``kernel_profile.kernel_table``:
    name, ms, calls per run), by time, without printing them."""
    from kernel_profile import kernel_table

    runner = torch._inductor.aoti_load_package(str(path))
    x = torch.randn(batch, 3, 224, 224, device="cuda")
    return kernel_table(lambda: runner(x), label, rows=200, log=lambda _line: None)["top"]


def main() -> int:
    from bench_args import positive_int

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--batch", type=positive_int, default=32)
    p.add_argument("--strict", action="store_true",
                   help="export with Dynamo (strict=True), as a build does for a model with "
                        "TMA layers (fused.uses_tma: the family's fp8 form)")
    p.add_argument("--no-fake-cache", action="store_true",
                   help="compile with the fake-tensor dispatch cache off "
                        "(torch._dynamo.config.fake_tensor_cache_enabled)")
    p.add_argument("--explain", action="store_true",
                   help="print Inductor's layout decisions for each variant's convolutions "
                        "(explaining())")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("stem_layout_probe.py needs a CUDA GPU; none is visible", file=sys.stderr)
        return 2
    from bundler.targets.torch_aoti import build
    from bundler.targets.torch_aoti.build import DEFAULT_COMPILE_OPTIONS, compile_package

    if args.strict:      # this process only: every variant exported as a TMA model is
        build.export_strict = lambda *modules: True

    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    for variant in args.variants.split(","):
        if variant not in VARIANTS:
            print(f"{variant}: unknown; choose from {', '.join(VARIANTS)}")
            continue
        options = dict(DEFAULT_COMPILE_OPTIONS)
        if variant == "fused-force-layout":
            options["force_layout_optimization"] = True
        try:
            with tempfile.TemporaryDirectory() as tmp, (
                    explaining() if args.explain else contextlib.nullcontext()), (
                    torch._dynamo.config.patch(fake_tensor_cache_enabled=False)
                    if args.no_fake_cache else contextlib.nullcontext()):
                path, _ = compile_package(stem_module(variant), (3, 224, 224),
                                          {"min": 1, "max": 32}, "cuda", options,
                                          Path(tmp) / "stem.pt2")
                rows = profile_package(path, args.batch, variant)
        except Exception as e:   # noqa: BLE001 - report and go on to the next variant
            print(f"== {variant}: failed {type(e).__name__}: {str(e)[:300]}", flush=True)
            continue
        total = sum(r["ms"] for r in rows)
        print(f"== {variant}{' (strict export)' if args.strict else ''}: {total:.4f} ms of kernels at batch {args.batch}", flush=True)
        for row in rows:
            name, n, t = row["name"], row["calls"], row["ms"]
            if variant.startswith("model") and not any(
                    k in name for k in ("nchw", "nhwc", "Nhwc", "Nchw", "permute", "maxpool",
                                        "max_pool", "image_first", "convolution", "relu_1")):
                continue      # the whole model: the stem's kernels
            print(f"   {t:.4f} ms  x{n}  {name[:110]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
