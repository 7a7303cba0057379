"""Do Triton kernels in a CUDA graph lose time between launches that programmatic dependent
launch (PDL) would win back? (issue 18: fp8 at batch 1.)

Why: on an H100 timm_resnet50's fp8 batch-1 graph ran 0.353 ms for 0.318 ms of kernel
time, 35 us between its ~57 kernels (52 of them the Triton FP8 convolution), while the
fp16 graph's ~106 cuDNN / cuBLAS kernels left 9 us between them (0.361 against 0.352;
docs/measurements/h100-2026-12-06-j). cuBLAS's and cuDNN's Hopper kernels can start their
prologue while the kernel before them drains (PDL); Triton kernels do only when launched
with ``launch_pdl=True`` and waiting on ``gdc_wait()`` before they read what the previous
kernel wrote.

First the model's own kernel: a chain of ``--chain`` dependent launches of the fused FP8
1x1 convolution (``kernels/fp8_conv.py``, e4m3 out feeding the next, batch-1 tiles) on
two of ResNet-50's batch-1 shapes, without PDL: whether its gap per launch is the ~0.6 us
the model shows, or the model's graph adds it. (The fp16 graph's ~50 Inductor Triton
kernels leave little gap, so a gap of Triton launches as such is not a given.)

Then a chain of small dependent Triton kernels (each reads what the one before wrote:
``y = x * a + b`` over ``--elements`` fp16 values, a layer-sized 1-5 us each) captured in
one CUDA graph, with and without PDL, and the chain's kernel time from the profiler: the
gap per launch with each. No model code is touched.

What a gain here would still need: AOTInductor's C++ wrapper launches every Triton kernel
with a plain ``cuLaunchKernel`` (torch 2.14's ``device_op_overrides.py``), no launch
attributes, so a package's graphs get PDL only from an edit of the captured CUDA graph
(programmatic edges, with kernels that wait in ``gdc_wait``) or from a later torch.

    PYTHONPATH=. python benchmarks/pdl_probe.py [--chain 50] [--elements 65536,262144,1048576]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_args import positive_int, positive_ints  # noqa: E402
from fp8_conv_bench import graph_time  # noqa: E402

try:   # (a Triton kernel is defined at module level: its globals are what it can see)
    import triton
    import triton.language as tl
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError as exc:     # no triton, or one without PDL's device functions
    triton = None
    MISSING = f"{type(exc).__name__}: {exc}"
else:
    MISSING = None

    @triton.jit
    def affine(x_ptr, y_ptr, n, a, b, PDL: tl.constexpr, BLOCK: tl.constexpr):
        """``y = x * a + b``; with PDL, waits for the kernel before it, then lets the next
        one launch once its own loads are done."""
        if PDL:
            gdc_wait()                  # what the kernel before wrote is visible after this
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask)
        if PDL:
            gdc_launch_dependents()     # the next kernel may launch; it waits in gdc_wait
        tl.store(y_ptr + offs, (x * a + b).to(tl.float16), mask=mask)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--chain", type=positive_int, default=50,
                   help="dependent kernels in one graph (default 50)")
    p.add_argument("--elements", type=positive_ints, default=[65536, 262144, 1048576])
    p.add_argument("--iters", type=positive_int, default=100)
    args = p.parse_args(argv)

    import torch

    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        print("pdl_probe.py needs a CUDA GPU of compute capability >= 9.0 (PDL is Hopper's)",
              file=sys.stderr)
        return 2
    if MISSING:
        print(f"pdl_probe.py needs triton with PDL's device functions ({MISSING})",
              file=sys.stderr)
        return 2
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton "
          f"{triton.__version__}, chain of {args.chain}", flush=True)

    from kernel_profile import kernel_table   # (benchmarks/ is on sys.path)

    def kernel_us_of(step) -> float:
        """Profiler kernel time of one ``step()`` (plain launches), us."""
        return kernel_table(step, "", rows=0, log=lambda _line: None)["total_ms"] * 1000

    from bundler.targets.torch_aoti.kernels.fp8_conv import config_for, fp8_conv_fused

    print("| fused FP8 1x1 conv, batch 1 | ms per kernel (graph) | kernel time ms | "
          "gap us per launch |")
    print("| --- | --- | --- | --- |")
    for hw, ch in ((56, 64), (7, 512)):
        x = (torch.randn(1, hw, hw, ch, device="cuda") * 0.5).to(torch.float8_e4m3fn)
        w = (torch.randn(ch, ch, device="cuda") * 0.1).to(torch.float8_e4m3fn)
        scale = torch.full((ch,), 0.01, device="cuda")
        bias = torch.zeros(ch, device="cuda")
        out_scale = torch.full((1,), 0.05, device="cuda")
        cfg = config_for(ch, ch, (1, 1), (1, 1), batch=1)

        def conv_chain(x=x, w=w, scale=scale, bias=bias, out_scale=out_scale, cfg=cfg):
            y = x
            for _ in range(args.chain):
                _, y = fp8_conv_fused(y, w, scale, bias, w.shape[0], (1, 1), (1, 1), (0, 0),
                                      relu=True, out_f16=False, out_scale=out_scale,
                                      config=cfg)
            return y
        ms, _ = graph_time(conv_chain, args.iters)
        kernel_us = kernel_us_of(conv_chain)
        print(f"| {hw}x{hw}x{ch} -> {ch} ({','.join(map(str, cfg))}) | "
              f"{ms / args.chain:.4f} | {kernel_us / 1000 / args.chain:.4f} | "
              f"{(ms * 1000 - kernel_us) / args.chain:.2f} |", flush=True)
    print()
    print("| elements | PDL | ms per kernel (graph) | kernel time ms | gap us per launch |")
    print("| --- | --- | --- | --- | --- |")
    for n in args.elements:
        bufs = [torch.randn(n, device="cuda").half() for _ in range(2)]
        block = 1024
        grid = (triton.cdiv(n, block),)
        results = {}
        for pdl in (False, True):
            def chain(pdl=pdl):
                for i in range(args.chain):
                    src, dst = bufs[i % 2], bufs[(i + 1) % 2]
                    affine[grid](src, dst, n, 0.5, 0.25, PDL=pdl, BLOCK=block,
                                 launch_pdl=pdl)
            try:
                ms, _ = graph_time(chain, args.iters)
            except Exception as e:   # a triton or driver without PDL in graphs
                print(f"| {n} | {pdl} | failed: {type(e).__name__}: {str(e)[:120]} | | |")
                continue
            kernel_us = kernel_us_of(chain)
            per = ms / args.chain
            gap = (ms * 1000 - kernel_us) / args.chain
            results[pdl] = per
            print(f"| {n} | {'on' if pdl else 'off'} | {per:.4f} | "
                  f"{kernel_us / 1000 / args.chain:.4f} | {gap:.2f} |", flush=True)
        if len(results) == 2:
            print(f"| {n} | off / on | {results[False] / results[True]:.3f}x | | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
