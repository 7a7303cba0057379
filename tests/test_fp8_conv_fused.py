"""The fused epilogues of the Triton FP8 convolution (residual, ReLU, e4m3 out with the next
layer's scale) and the fused ResNet bottlenecks built on them
(bundler/targets/torch_aoti/fused.py, ``fp8_conv="triton-fused"``).

No GPU here: the kernels run under Triton's CPU interpreter in a child process
(tests/fp8_conv_fused_interpret.py, with the interpreter's e4m3 rounding corrected, see
there); export shows the fused model reaches AOTInductor as one op per FP8 convolution with
a dynamic batch. Its speed is benchmarks/fp8_conv_bench.py --model's (variant fp8-fused).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from runtime_py.errors import UsageError  # noqa: E402
from triton_interpret import load_script, needs_triton, run_interpreted  # noqa: E402

SCRIPT = "fp8_conv_fused_interpret.py"


def _script():
    return load_script(SCRIPT)


@pytest.fixture(scope="module")
def interpreted():
    """The interpreter's results (tests/fp8_conv_fused_interpret.py), run once."""
    pytest.importorskip("timm")
    return run_interpreted(SCRIPT)


@needs_triton
def test_the_epilogue_quantizer_equals_division_bit_for_bit(interpreted):
    """The e4m3 epilogue divides by the scale as a reciprocal multiply plus one fma
    correction (kernels/fp8_conv.py ``_quantize_e4m3``): bit for bit torch's ``x / scale``
    QuantizeLinear on exact ties to even, their neighbours, saturation, +-inf, +-0 and random
    values; a bare ``x * (1 / scale)`` gets some of those ties wrong (the cases can fail)."""
    r = interpreted["quantizer"]
    assert r["cases"] > 30000
    assert r["mismatches"] == 0
    assert r["naive_mismatches"] > 0


@needs_triton
@pytest.mark.parametrize("case", list(_script().CASES))
def test_each_fused_epilogue_equals_the_torch_reference(interpreted, case):
    """fp16 out: conv2d of the dequantized operands x scale + bias (+ a strided residual,
    ReLU), to fp16 rounding. e4m3 out: bit for bit QuantizeLinear of the kernel's own fp16
    value with the next scale (saturating), and within one e4m3 step of quantizing the
    reference. An output not asked for is not returned."""
    _n, _h, _w, _c, _o, _k, _s, _p, _relu, _res, out16, out8 = _script().CASES[case]
    r = interpreted["cases"][case]
    assert (r["f16_given"], r["f8_given"]) == (out16, out8)
    if out16:
        assert r["f16_err"] < 2e-3
    if out8:
        assert r["f8_vs_ref_ulps"] <= 1
        assert r["f8_saturated"] > 0           # the clamp to +-448 was exercised
        if out16:
            assert r["f8_vs_own_f16_ulps"] == 0


@needs_triton
@pytest.mark.parametrize("which", ["all", "pointwise", "own-downsample-scale"])
def test_the_fused_bottlenecks_equal_the_unfused_fp8_model(interpreted, which):
    """A small ResNet of timm bottlenecks: the fused model vs the unfused fp8 NHWC model on
    the same scales (the same FP8 operands and fp16 roundings: 0 measured; a wrong scale
    or residual gives 0.16+). "pointwise": the 3x3 layers unselected (fp16 cuDNN, the
    producer writes fp16 only); "own-downsample-scale": a downsample whose scale is not
    conv1's quantizes for itself."""
    r = interpreted["blocks"][which]
    assert r["err"] < 1e-2 and r["err"] < r["err_vs_fp32"] / 5
    assert r["fp8_layers"] == (8 if which == "pointwise" else 11)
    assert r["emits_fp8"] == [True, True, False]           # the last block feeds the pool
    downsample_reads = which != "own-downsample-scale"
    assert r["reads_fp8"] == [[False, False], [True, False], [True, downsample_reads]]
    # block 2 (the next stage's first) reads only e4m3 where its downsample shares it:
    # then block 1 writes no fp16 (the model still equals the unfused one, above)
    assert r["writes_f16"] == [True, not downsample_reads, True]


@needs_triton
def test_timm_resnet50_fused_equals_its_unfused_fp8_model(interpreted):
    """The family's model (random weights; 32x32 and large tiles for the interpreter): all
    16 bottlenecks and 52 FP8 convolutions fused; 15 blocks read the e4m3 their predecessor wrote (the
    first quantizes after the max pool), and the 3 later downsamples share it."""
    r = interpreted["blocks"]["resnet50"]
    assert r["fp8_layers"] == 52 and len(r["emits_fp8"]) == 16
    assert r["emits_fp8"] == [True] * 15 + [False]
    assert [c1 for c1, _ in r["reads_fp8"]] == [False] + [True] * 15
    assert sum(d for _, d in r["reads_fp8"]) == 3
    # the last block of stages 1-3 (blocks 2, 6, 12) writes e4m3 only: the next stage's
    # first block reads that (conv1 and downsample); every other block writes fp16 too
    assert [i for i, w in enumerate(r["writes_f16"]) if not w] == [2, 6, 12]
    assert r["err"] < 1e-2 and r["err"] < r["err_vs_fp32"] / 5
    assert r["top1_agree"] == 1.0


@pytest.fixture(scope="module")
def stem_interpreted():
    """The stem kernel's interpreter results (tests/stem_pool_interpret.py)."""
    return run_interpreted("stem_pool_interpret.py")


@needs_triton
@pytest.mark.parametrize("name", ["c40-f16", "c80-nchw", "c64"])
def test_the_stem_op_equals_bias_relu_max_pool_and_quantize_in_torch(stem_interpreted, name):
    """kernels/stem_pool.py on odd sides (9x11 -> 5x6), one channel block and two (40, 80
    channels), an input with NCHW strides: the fp16 bits and e4m3 codes of torch's
    computation; the fp16 map only where asked."""
    r = stem_interpreted[name]
    assert r["shape"][1:3] == [5, 6] and r["e4m3_nonzero"] > 100
    assert r["e4m3_codes_differing"] == 0
    assert r["f16_out"] == name.endswith("-f16")
    if r["f16_out"]:
        assert r["f16_bits_differing"] == 0


@needs_triton
def test_timm_resnet50s_stem_hands_the_first_block_its_e4m3_input(interpreted):
    """The fused model's stem: the convolution without its bias, then one kernel for the
    bias, ReLU, max pool and quantize; the first block's conv1 and downsample both read
    that e4m3 (no fp16 map: nothing reads it), which equals the unfused stem's computation
    code for code; the model stays as close to fp32 as with the stem unfused (the stem's
    fp16 rounds the bias separately, as Inductor's unfused graph does)."""
    r = interpreted["stem"]
    assert r["modules"] == ["StemConv", "Identity", "StemPool"]
    assert r["first_reads_fp8"] == [True, True] and r["hands_f16"] is False
    assert r["e4m3_codes_differing"] == 0 and r["e4m3_nonzero"] > 1000
    fused, unfused = r["fused"], interpreted["blocks"]["resnet50"]
    assert [c1 for c1, _ in fused["reads_fp8"]] == [True] * 16
    assert fused["fused_vs_fp32"] < 1.5 * unfused["err_vs_fp32"]
    assert fused["top1_agree"] == 1.0


@needs_triton
def test_only_timm_resnets_plain_stem_is_fused():
    """``stem_parts``: timm's ResNet with a folded 7x7 stem, ReLU and MaxPool2d(3, 2, 1);
    not another pool, an unfolded BatchNorm, or a model that is not timm's ResNet."""
    timm = pytest.importorskip("timm")
    from bundler.targets.torch_aoti.fused import stem_parts
    from bundler.torch_model import fold_batchnorm

    model = timm.create_model("resnet18", pretrained=False).eval()
    assert stem_parts(model) is None                        # bn1 not folded
    fold_batchnorm(model)
    assert stem_parts(model) is not None
    model.maxpool = nn.MaxPool2d(2)
    assert stem_parts(model) is None
    assert stem_parts(_script().tiny_resnet()) is None        # not timm's ResNet


def _tiny_and_scales(select=None):
    script = _script()
    model = script.tiny_resnet()
    paths = [n for n, m in model.named_modules() if isinstance(m, nn.Conv2d) and n != "conv1"]
    fp8 = script.calibrate(model, torch.randn(1, 3, 16, 16), select or paths)
    return model, fp8


@needs_triton
def test_the_fused_model_is_exported_with_a_dynamic_batch():
    """torch.export of the engine module: one fused op per FP8 convolution (11), a
    symbolic batch, no other convolution than the fp16 stem, one quantize."""
    pytest.importorskip("timm")
    from bundler.targets.torch_aoti.build import engine_model

    model, fp8 = _tiny_and_scales()
    module, padding = engine_model(model, "fp8", fp8, fp8_conv="triton-fused")
    assert padding == {} and module.channels_last and not module.nhwc
    program = torch.export.export(module.eval(), (torch.randn(2, 3, 16, 16),), dynamic_shapes=(
        {0: torch.export.Dim("batch", min=1, max=32)},))
    targets = [str(n.target) for n in program.graph.nodes if n.op == "call_function"]
    fused = [n for n in program.graph.nodes if "fp8_conv_nhwc_fused" in str(n.target)]
    assert len(fused) == 11
    first_e4m3, last_f16 = fused[0].meta["val"][1], fused[-1].meta["val"][0]
    assert first_e4m3.dtype == torch.float8_e4m3fn and last_f16.dtype == torch.float16
    assert isinstance(first_e4m3.shape[0], torch.SymInt)
    assert isinstance(last_f16.shape[0], torch.SymInt)
    assert sum("conv2d" in t for t in targets) == 1            # the fp16 stem
    # one quantize pass in the whole model: the first block's input (after the max pool),
    # shared by its conv1 and downsample; every other FP8 input is written by its producer
    assert sum(t == "aten.div.Tensor" for t in targets) == 1
    out = [n for n in program.graph.nodes if n.op == "output"][0].args[0][0].meta["val"]
    assert tuple(out.shape[1:]) == (10,) and isinstance(out.shape[0], torch.SymInt)


@needs_triton
def test_selected_convolutions_outside_a_bottleneck_and_unfusable_blocks_are_refused():
    pytest.importorskip("timm")
    from bundler.targets.torch_aoti.fused import rewrite_fused

    model, fp8 = _tiny_and_scales()
    with_stem = {**fp8, "conv1": fp8["layer1.0.conv1"]}
    with pytest.raises(UsageError, match="outside one .first: 'conv1'.*torch_aoti.fp8_conv.*to triton or im2col"):
        rewrite_fused(model, with_stem)
    model.layer1[1].se = nn.Identity()
    with pytest.raises(UsageError, match="squeeze-excitation"):
        rewrite_fused(model, fp8)
    with pytest.raises(UsageError, match="no NHWC rewrite"):
        from bundler.targets.torch_aoti.build import engine_model

        engine_model(_tiny_and_scales()[0], "fp8", fp8, fp8_conv="triton-fused", nhwc=True)


def test_the_switch_names_the_fused_form(monkeypatch):
    from bundler.targets.torch_aoti.build import FP8_CONV_ENV, default_fp8_conv, engine_details

    monkeypatch.setenv(FP8_CONV_ENV, "triton-fused")
    assert default_fp8_conv() == "triton-fused"
    monkeypatch.delenv(FP8_CONV_ENV)
    assert default_fp8_conv() == "im2col"                      # the default is unchanged
    host = {"torch_version": "2", "cuda_version": "13.0", "compute_capability": "9.0",
            "device_name": "H200", "device": "cuda"}
    details = engine_details(host, "fp8", {}, nhwc=False, fast_accum=False, padding={},
                             batch_sizes=[1], seconds=None, fp8_conv="triton-fused",
                             channels_last=True)
    assert details["compile_options"]["fp8_conv"].startswith("channels_last model, ResNet")
    assert details["compile_options"]["layout"].startswith("channels_last")


@needs_triton
def test_torch_compile_traces_the_fused_model_into_one_graph():
    """Dynamo (fullgraph: no break at the tuple hand-over between blocks) and AOT autograd
    see one graph with a Triton launch per FP8 convolution, what Inductor compiles (the
    launch itself needs a GPU: its failure on this CPU host is not what is checked)."""
    pytest.importorskip("timm")
    from torch._dynamo.backends.common import aot_autograd

    from bundler.targets.torch_aoti.build import engine_model

    model, fp8 = _tiny_and_scales()
    module, _ = engine_model(model, "fp8", fp8, fp8_conv="triton-fused")
    graphs = []

    def keep(graph, _inputs):
        graphs.append(graph)
        return graph.forward

    torch._dynamo.reset()
    compiled = torch.compile(module.eval(), backend=aot_autograd(fw_compiler=keep),
                             fullgraph=True)
    try:
        with torch.no_grad():
            compiled(torch.randn(2, 3, 16, 16))
    except Exception:  # noqa: BLE001 - launching a GPU kernel on a CPU host
        pass
    assert len(graphs) == 1
    launches = [n for n in graphs[0].graph.nodes if "triton_kernel_wrapper" in str(n.target)]
    assert len(launches) == 11
    assert sum(n.kwargs["kwargs"]["RESIDUAL"] for n in launches) == 3       # the conv3s
    assert sum(n.kwargs["kwargs"]["OUT_F8"] for n in launches) == 8        # 2 per block + 2


#: The fused op's tile arguments, by name (the op's schema: block_m .. group_m).
_TILE_ARGS = ("block_m", "block_n", "block_k", "num_warps", "num_stages", "group_m")


def _launch_tiles(node) -> tuple:
    """The tiles an exported fused-op node launches with."""
    names = [a.name for a in node.target._schema.arguments]
    return tuple(node.args[names.index(a)] for a in _TILE_ARGS)


@needs_triton
def test_a_tile_table_sets_the_tiles_of_the_layers_it_names():
    """rewrite_fused(tiles=...) (fp8_conv_bench.py --fused-layers' measured table): the
    layers of a shape it names launch with its tiles, the others with default_config's;
    the launches in the exported graph carry them."""
    pytest.importorskip("timm")
    from bundler.targets.torch_aoti.fused import FusedConv, rewrite_fused
    from bundler.targets.torch_aoti.kernels.fp8_conv import (Fp8ConvConfig, config_for,
                                                             default_config, tile_key)
    from bundler.targets.torch_aoti.nhwc_modules import EngineModule

    model, fp8 = _tiny_and_scales()
    chosen = Fp8ConvConfig(64, 32, 32, 4, 2, 4)
    # the 1x1 16 -> 32 shape: layer1's downsample only; the 3x3 8 -> 8 s1 shape: two conv2s
    table = {tile_key(16, 32, (1, 1), (1, 1)): chosen,
             tile_key(8, 8, (3, 3), (1, 1)): Fp8ConvConfig(32, 16, 32, 2, 2, 8)}
    body = rewrite_fused(model, fp8, tiles=table)
    convs = {n: m for n, m in body.named_modules() if isinstance(m, FusedConv) and m.fp8}
    assert convs["layer1.0.downsample"].tiles == chosen
    assert convs["layer1.0.conv2"].tiles == convs["layer1.1.conv2"].tiles == (32, 16, 32, 2, 2, 8)
    assert convs["layer2.0.conv2"].tiles == default_config(16, 16, (3, 3))   # stride 2: not named
    assert convs["layer1.0.conv1"].tiles == default_config(16, 8, (1, 1))
    assert config_for(16, 32, (1, 1), (1, 1)) == default_config(16, 32, (1, 1))  # no table
    program = torch.export.export(EngineModule(body, torch.float16, False, True).eval(),
                                  (torch.randn(2, 3, 16, 16),))
    launched = sorted(_launch_tiles(n) for n in program.graph.nodes
                      if "fp8_conv_nhwc_fused" in str(n.target))
    assert launched.count(tuple(chosen)) == 1 and launched.count((32, 16, 32, 2, 2, 8)) == 2


@needs_triton
def test_a_graph_traced_for_a_static_batch_launches_that_batchs_tiles():
    """Tile tables per static batch (family.json torch_aoti.static_batches): the graph
    exported for batch 1 launches the batch-1 table's tiles, the dynamic-batch graph of the
    same module the default ones; a caller's one table wins over both."""
    pytest.importorskip("timm")
    from bundler.targets.torch_aoti.fused import rewrite_fused
    from bundler.targets.torch_aoti.kernels.fp8_conv import (Fp8ConvConfig, default_config,
                                                             tile_key)
    from bundler.targets.torch_aoti.nhwc_modules import EngineModule

    model, fp8 = _tiny_and_scales()
    small = Fp8ConvConfig(16, 32, 128, 2, 4, 8)
    batch1 = {1: {tile_key(8, 8, (3, 3), (1, 1)): small}}    # layer1's two conv2s
    module = EngineModule(rewrite_fused(model, fp8, batch_tiles=batch1), torch.float16,
                          False, True).eval()

    def launched(program):
        return [_launch_tiles(n) for n in program.graph.nodes
                if "fp8_conv_nhwc_fused" in str(n.target)]

    static = launched(torch.export.export(module, (torch.randn(1, 3, 16, 16),)))
    dynamic = launched(torch.export.export(module, (torch.randn(2, 3, 16, 16),),
                                           dynamic_shapes=({0: torch.export.Dim(
                                               "batch", min=1, max=32)},)))
    other = launched(torch.export.export(module, (torch.randn(4, 3, 16, 16),)))
    assert len(static) == len(dynamic) == len(other) == 11
    assert static.count(tuple(small)) == 2
    assert dynamic.count(tuple(small)) == 0 and other.count(tuple(small)) == 0
    assert dynamic == other
    changed = [(a, b) for a, b in zip(static, dynamic) if a != b]
    assert changed == [(tuple(small), tuple(default_config(8, 8, (3, 3))))] * 2
    chosen = Fp8ConvConfig(32, 16, 32, 2, 2, 8)
    mine = EngineModule(rewrite_fused(model, fp8, tiles={tile_key(8, 8, (3, 3), (1, 1)): chosen},
                                      batch_tiles=batch1), torch.float16, False, True).eval()
    assert launched(torch.export.export(mine, (torch.randn(1, 3, 16, 16),))).count(
        tuple(chosen)) == 2


def _bench():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "fp8_conv_bench.py"
    spec = importlib.util.spec_from_file_location("fp8_conv_bench", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


@needs_triton
def test_the_benchmark_measures_each_layer_with_its_fused_epilogue():
    """fp8_conv_bench.py --fused-layers reads the epilogues off the fused timm resnet50:
    the 52 layers, conv1/conv2 ReLU -> e4m3, conv3 residual + ReLU -> fp16 + e4m3 (the last
    one fp16 only), downsamples fp16; its tile choice weighs a shape's epilogues by count and
    comes back as the table rewrite_fused takes."""
    pytest.importorskip("timm")
    from bundler.targets.torch_aoti.kernels.fp8_conv import Fp8ConvConfig, tile_key

    bench = _bench()
    found = bench.fused_layer_epilogues()
    assert {s: sum(e.values()) for s, e in found.items()} == bench.RESNET50_CONVS
    relu_f8, res_f16_f8, res_f16, f16 = ((True, False, False, True), (True, True, True, True),
                                         (True, True, True, False), (False, False, True, False))
    res_f8 = (True, True, False, True)
    assert found[(64, 64, 56, 3, 1, 1)] == {relu_f8: 3}
    # conv3s + downsample; the stage's last conv3 writes e4m3 only (the next stage's first
    # block reads nothing else)
    assert found[(64, 256, 56, 1, 1, 0)] == {res_f16_f8: 2, res_f8: 1, f16: 1}
    assert found[(128, 512, 28, 1, 1, 0)] == {res_f16_f8: 3, res_f8: 1}
    assert found[(256, 1024, 14, 1, 1, 0)] == {res_f16_f8: 5, res_f8: 1}
    assert found[(512, 2048, 7, 1, 1, 0)] == {res_f16_f8: 2, res_f16: 1}   # the last block
    assert found[(1024, 2048, 14, 1, 2, 0)] == {f16: 1}
    assert sum(e.get(relu_f8, 0) for e in found.values()) == 32

    shape = (64, 256, 56, 1, 1, 0)
    a, b = "128x128x64/w8s4", "64x64x128/w4s3"
    rows = {"conv3": {"shape": list(shape), "count": 3, "default": a,
                      "tried": {a: {"fused": 1.0}, b: {"fused": 1.2}}},
            "down": {"shape": list(shape), "count": 1, "default": a,
                     "tried": {a: {"fused": 2.0}, b: {"fused": 0.5}}}}
    chosen = bench.choose_tiles(rows)       # b: 3 x 1.2 + 0.5 = 4.1 beats a: 3 x 1.0 + 2.0 = 5
    assert chosen[shape]["tiles"] == b and chosen[shape]["default_ms"] == pytest.approx(5.0)
    rows["down"]["tried"][b] = {"failed": "OutOfResources"}       # not measured for all
    assert bench.choose_tiles(rows)[shape]["tiles"] == a
    assert bench.tile_table(chosen) == {tile_key(64, 256, (1, 1), (1, 1)):
                                        Fp8ConvConfig(64, 64, 128, 4, 3)}


def test_the_measured_tile_table_covers_resnet50s_fp8_layers_with_measured_configs():
    """MEASURED_TILES (batch 32, and the dynamic graph) and MEASURED_TILES_BATCH1, 2 and 4
    (static graphs) are timm ResNet-50's tables: one entry per shape of its 52 FP8
    convolutions (every conv but the 7x7 stem), each a config the benchmark measures (a
    candidate or the default rule's), and config_for hands each out for its batch."""
    timm = pytest.importorskip("timm")
    from bundler.targets.torch_aoti.kernels.fp8_conv import (CANDIDATE_CONFIGS,
                                                             FEW_STAGE_CONFIGS, MEASURED_TILES,
                                                             MEASURED_TILES_BATCH1,
                                                             MEASURED_TILES_BATCH2,
                                                             MEASURED_TILES_BATCH4,
                                                             MEASURED_TILES_BY_BATCH,
                                                             SMALL_BATCH_CONFIGS, config_for,
                                                             default_config, tile_key)

    model = timm.create_model("resnet50", pretrained=False)
    shapes = {tile_key(m.in_channels, m.out_channels, m.kernel_size, m.stride)
              for name, m in model.named_modules()
              if isinstance(m, torch.nn.Conv2d) and name != "conv1"}
    assert set(MEASURED_TILES) == shapes
    for key, tiles in MEASURED_TILES.items():
        cin, cout, kh, kw, sh, sw = key
        assert tiles in CANDIDATE_CONFIGS + FEW_STAGE_CONFIGS \
            or tiles == default_config(cin, cout, (kh, kw)), key
        assert config_for(cin, cout, (kh, kw), (sh, sw)) == tiles
        assert config_for(cin, cout, (kh, kw), (sh, sw), batch=32) == tiles
    # the small-batch tables (measured with the small-batch candidates too), for static graphs
    assert set(MEASURED_TILES_BY_BATCH) == {1, 2, 4, 32}
    assert MEASURED_TILES_BY_BATCH[32] is MEASURED_TILES
    measured = set(CANDIDATE_CONFIGS) | set(SMALL_BATCH_CONFIGS)
    for batch, table in ((1, MEASURED_TILES_BATCH1), (2, MEASURED_TILES_BATCH2),
                         (4, MEASURED_TILES_BATCH4)):
        assert MEASURED_TILES_BY_BATCH[batch] is table
        assert set(table) == shapes, batch
        for key, tiles in table.items():
            cin, cout, kh, kw, sh, sw = key
            assert tiles in measured or tiles == default_config(cin, cout, (kh, kw)), key
            assert config_for(cin, cout, (kh, kw), (sh, sw), batch=batch) == tiles
        assert table != MEASURED_TILES, batch
    # a static batch without a table of its own (8) takes the dynamic graph's
    key = next(iter(MEASURED_TILES))
    cin, cout, kh, kw, sh, sw = key
    assert config_for(cin, cout, (kh, kw), (sh, sw), batch=8) == MEASURED_TILES[key]


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs torch with a CUDA GPU (none visible)")


@pytest.mark.gpu
@needs_cuda
@needs_triton
@pytest.mark.parametrize("static", [(), (1,)], ids=["dynamic", "static-batch-1"])
def test_gpu_the_fused_model_compiles_with_aotinductor_and_matches_eager(tmp_path, static):
    """The bundle path, not torch.compile's: torch.export with a dynamic batch (and a graph
    for static batch 1 beside it, with its own small tiles) + AOTInductor's cpp wrapper
    launching the Triton kernel (its output scales must reach it as buffers,
    fused.SCALE_SLOTS), then the package against the eager module."""
    pytest.importorskip("timm")
    from bundler.targets.torch_aoti.build import compile_package, smoke_check
    from bundler.targets.torch_aoti.fused import rewrite_fused
    from bundler.targets.torch_aoti.kernels.fp8_conv import Fp8ConvConfig, tile_key
    from bundler.targets.torch_aoti.nhwc_modules import EngineModule

    model, fp8 = _tiny_and_scales()
    batch1 = {1: {tile_key(8, 8, (3, 3), (1, 1)): Fp8ConvConfig(16, 32, 128, 2, 4, 8)}}
    module = EngineModule(rewrite_fused(model, fp8, batch_tiles=batch1), torch.float16,
                          False, True).cuda().eval()
    path, _ = compile_package(module, (3, 16, 16), {"min": 1, "max": 8}, "cuda",
                              {"max_autotune": False}, tmp_path / "fused.pt2",
                              static_batches=static)
    diffs = smoke_check(path, module, (3, 16, 16), [1, 3, 8], "cuda", static_batches=static)
    with torch.no_grad():
        scale = float(module(torch.randn(4, 3, 16, 16, device="cuda")).abs().max())
    assert max(diffs.values()) <= 1e-2 * scale, diffs


@needs_triton
def test_no_fused_op_takes_a_0d_buffer():
    """AOTInductor lowers a 0-d constant buffer to a scalar literal, and its cpp wrapper
    then cannot launch the Triton kernel with it (the bundle build failed on the H200 until
    the output scales had fused.SCALE_SLOTS elements). Checked here on the exported graph,
    without a GPU: every buffer a fused op reads has at least one dimension."""
    pytest.importorskip("timm")
    from bundler.targets.torch_aoti.build import engine_model

    model, fp8 = _tiny_and_scales()
    module, _ = engine_model(model, "fp8", fp8, fp8_conv="triton-fused")
    program = torch.export.export(module.eval(), (torch.randn(2, 3, 16, 16),))
    buffers = program.graph_signature.inputs_to_buffers
    state = program.state_dict
    read = [(n.name, buffers[a.name]) for n in program.graph.nodes
            if "fp8_conv_nhwc_fused" in str(n.target)
            for a in n.args if isinstance(a, torch.fx.Node) and a.name in buffers]
    assert len(read) >= 11 * 3                      # weight, scale, bias of each of the 11
    assert [r for r in read if state[r[1]].dim() == 0] == []
    assert any(name.endswith("out_scale") for _, name in read)


@pytest.mark.gpu
@needs_cuda
@needs_triton
def test_gpu_the_stem_compiles_with_aotinductor_and_matches_eager(tmp_path):
    """The fused stem (``StemConv`` then ``StemPool``: cuDNN's convolution, then the one
    kernel for bias, ReLU, max pool and e4m3) through torch.export with a dynamic batch
    and AOTInductor, against the eager module; and against the unfused fp16 stem (the
    convolution with its bias, ReLU, max pool, then QuantizeLinear): e4m3 codes at most
    one step apart (the bias is added after the convolution's rounding)."""
    import torch.nn.functional as F

    from bundler.targets.torch_aoti.build import compile_package, smoke_check
    from bundler.targets.torch_aoti.fp8_layers import quantize
    from bundler.targets.torch_aoti.fused import StemConv, StemPool
    from bundler.targets.torch_aoti.nhwc_modules import EngineModule

    torch.manual_seed(0)
    conv = nn.Conv2d(3, 64, 7, 2, 3)

    class Stem(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.pool = StemConv(conv), StemPool(conv, 0.01, out16=True)

        def forward(self, x):
            y16, y8 = self.pool(self.conv(x))
            return torch.cat([y16.permute(0, 2, 3, 1).float(), y8.float()], -1)

    module = EngineModule(Stem(), torch.float16, False, True).cuda().eval()
    path, _ = compile_package(module, (3, 64, 64), {"min": 1, "max": 8}, "cuda",
                              {"max_autotune": False}, tmp_path / "stem.pt2")
    diffs = smoke_check(path, module, (3, 64, 64), [1, 3, 8], "cuda")
    x = torch.randn(4, 3, 64, 64, device="cuda")
    with torch.no_grad():
        got = module(x)
        ref16 = F.max_pool2d(torch.relu(F.conv2d(x.half(), conv.weight.half().cuda(),
                                                 conv.bias.half().cuda(), 2, 3)), 3, 2, 1)
        ref8 = quantize(ref16.permute(0, 2, 3, 1), torch.tensor(0.01, device="cuda"))
    scale = float(got.abs().max())
    assert max(diffs.values()) <= 1e-2 * scale, diffs
    steps = got[..., 64:].to(torch.float8_e4m3fn).view(torch.uint8).int() \
        - ref8.view(torch.uint8).int()
    assert int(steps.abs().max()) <= 1 and float(got[..., 64:].abs().max()) > 10
