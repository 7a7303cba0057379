"""The fused FP8 1x1 convolution with TMA (kernels/fp8_conv_tma.py) and fp8_conv
"triton-fused-tma", the timm_resnet50 form that puts its dense 1x1 layers on it.

Without a GPU: under Triton's interpreter the kernel gives the shipped fused op's outputs bit
for bit, and the fused model with it equals the one without; the build exports such a model
with Dynamo, which the rest of the settings and the recorded form follow. The GPU test builds
the package as a bundle build does."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from family_copies import family_with  # noqa: E402
from triton_interpret import needs_triton, run_interpreted  # noqa: E402

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs torch with a CUDA GPU (none visible)")


@pytest.fixture(scope="module")
def interpreted():
    return run_interpreted("fp8_conv_tma_interpret.py")


@needs_triton
@pytest.mark.parametrize("name", ["res+relu>f16+f8", "relu>f8", ">f16", "res+relu>f16"])
def test_each_epilogue_equals_the_shipped_kernel_bit_for_bit(interpreted, name):
    r = interpreted["layers"][name]
    wants16, wants8 = "f16" in name.split(">")[1], "f8" in name.split(">")[1]
    assert r["outputs"] == [wants16, wants8]
    if wants16:
        assert r["f16_bits_differing"] == 0 and r["f16_scale"] > 1.0
    if wants8:
        assert r["e4m3_codes_differing"] == 0 and r["e4m3_nonzero"] > 500


@needs_triton
def test_an_input_with_nchw_strides_is_read_as_its_values(interpreted):
    r = interpreted["nchw_strides"]
    assert r["f16_bits_differing"] == 0 and r["e4m3_codes_differing"] == 0


@needs_triton
def test_the_fused_model_takes_the_tma_kernel_only_outside_small_static_batches(interpreted):
    """Five 1x1 layers of 16-multiple channels go on the TMA kernel in a dynamic-batch graph
    and none in a graph of static batch 2 (the shipped kernel was the faster at batch 1),
    unless batch 2 has TMA tiles of its own (fp8_conv triton-fused-tma-small's form): then
    all five; every output equals the model without TMA."""
    r = interpreted["model"]
    assert r["tma_layers"] == 5 and r["uses_tma"] == [False, True]
    assert r["dynamic_launches"] == 5 and r["small_static_launches"] == 0
    assert r["small_tma_launches"] == 5
    assert r["max_diff"] == 0.0 and r["small_max_diff"] == 0.0 and r["scale"] > 0.01
    assert r["small_tma_max_diff"] == 0.0


@needs_triton
def test_the_3x3_form_puts_stride1_3x3_layers_on_the_4d_tma_kernel_outside_small_batches(
        interpreted):
    """fp8_conv triton-fused-tma-3x3's layers: both 3x3 layers of a small ResNet (32
    channels on 6x6 maps) launch the 4-D TMA kernel in a dynamic-batch graph, with the box
    ``box_tiles_for`` gives 6x6 maps of 32 channels (8 images x 2 rows x 8 columns, 32
    channels a side and a block); none in a graph of static batch 2; the outputs equal the
    model without TMA."""
    r = interpreted["box_model"]
    assert r["box_layers"] == 2 and r["uses_tma"] == [False, True]
    assert r["dynamic_launches"] == [[[6, 6, 32], 1, [8, 2, 8, 32, 32, 4, 4]]] * 2
    assert r["small_static_launches"] == 0
    assert r["max_diff"] == 0.0 and r["small_max_diff"] == 0.0 and r["scale"] > 0.01


@needs_triton
def test_strided_layers_take_the_box_kernel_once_their_maps_are_measured(interpreted):
    """At stride 2 (the first block's 3x3 layer and its 1x1 downsample, on 6x6 maps) the
    box kernel reads the input's parity view; with tiles in MEASURED_BOX_TILES for them,
    the three box layers launch it at their strides and the outputs equal the model
    without TMA. Unmeasured, a strided layer stays on the shipped kernel (below)."""
    r = interpreted["strided_box_model"]
    assert r["box_layers"] == 3 and r["uses_tma"] == [False, True]
    assert [(shape, stride) for shape, stride, _t in r["dynamic_launches"]] == [
        ([6, 6, 32], 2), ([6, 6, 32], 2), ([3, 3, 32], 1)]
    assert r["small_static_launches"] == 0
    assert r["max_diff"] == 0.0 and r["small_max_diff"] == 0.0 and r["scale"] > 0.01


@needs_triton
def test_which_layers_the_4d_tma_kernel_takes_and_their_tiles():
    from bundler.targets.torch_aoti.kernels.fp8_conv_tma import (
        MAX_BOX_IMAGES, MEASURED_BOX_TILES, box_eligible, box_tiles_for, pixel_boxes,
        useful_share)

    assert box_eligible(64, 64, (3, 3), (1, 1), (1, 1), (1, 1))
    assert box_eligible(128, 128, (3, 3), (2, 2), (1, 1), (1, 1))         # strided
    assert box_eligible(256, 512, (1, 1), (2, 2), (0, 0), (1, 1))         # a downsample
    assert not box_eligible(64, 64, (3, 3), (3, 3), (1, 1), (1, 1))       # stride 3
    assert not box_eligible(64, 64, (1, 3), (1, 1), (0, 1), (1, 1))       # not square
    assert not box_eligible(64, 64, (3, 3), (1, 1), (0, 0), (1, 1))       # not "same"
    assert not box_eligible(64, 256, (1, 1), (1, 1), (0, 0), (1, 1))      # the 1x1 kernel's
    assert not box_eligible(16, 16, (3, 3), (1, 1), (1, 1), (1, 1))       # 16-byte blocks
    assert not box_eligible(64, 64, (3, 3), (1, 1), (2, 2), (2, 2))       # dilated
    # ResNet-50's maps at batch 32: no waste at 56 and 28, one row or column in eight at
    # 14 and 7; never more than MAX_BOX_IMAGES images a box (a dynamic graph's batch 3)
    for cin, hw, share in ((64, 56, 1.0), (128, 28, 1.0), (256, 14, 0.875), (512, 7, 0.875)):
        bi, bh, bw, bn, bk, _w, _s = box_tiles_for(cin, cin, 3, 1, hw, hw, {})
        assert useful_share(32, hw, hw, bi, bh, bw) == share, hw
        assert bi * bh * bw in (64, 128) and bi <= MAX_BOX_IMAGES
        assert cin % bk == 0 and bk <= 128 and bn == 64
    assert all(b[0] <= 2 for b in pixel_boxes(2, 7, 7, 64, 5))       # a static batch of 2
    for (cin, cout, k, stride, h, w), tiles in MEASURED_BOX_TILES.items():
        assert box_tiles_for(cin, cout, k, stride, h, w) == tiles
        assert tiles is None or cin % tiles[4] == 0
    assert box_tiles_for(64, 64, 3, 1, 56, 56) is None   # measured slower than the shipped one
    assert box_tiles_for(64, 64, 3, 1, 56, 56, {}) is not None
    # a strided layer takes the box kernel only once measured
    assert box_tiles_for(128, 128, 3, 2, 56, 56, {}) is None
    assert box_tiles_for(128, 128, 3, 2, 56, 56, {(128, 128, 3, 2, 56, 56): (
        8, 4, 4, 64, 128, 4, 3)}) == (8, 4, 4, 64, 128, 4, 3)


@needs_triton
def test_which_layers_tma_can_tile_and_the_tiles_they_take():
    from bundler.targets.torch_aoti.kernels.fp8_conv_tma import (
        DEFAULT_TMA_TILES, MEASURED_TMA_TILES, tiles_fit, tma_eligible, tma_tiles_for)

    assert tma_eligible(64, 256, (1, 1), (1, 1), (0, 0), (1, 1))
    assert not tma_eligible(64, 256, (3, 3), (1, 1), (1, 1), (1, 1))     # gathers its taps
    assert not tma_eligible(256, 512, (1, 1), (2, 2), (0, 0), (1, 1))    # strided rows
    assert not tma_eligible(24, 64, (1, 1), (1, 1), (0, 0), (1, 1))      # 24-byte rows
    assert not tma_eligible(64, 40, (1, 1), (1, 1), (0, 0), (1, 1))
    # every tile the build may take has rows AOTInductor's descriptors can encode
    assert all(tiles_fit(t) for t in MEASURED_TMA_TILES.values()) and tiles_fit(DEFAULT_TMA_TILES)
    assert not tiles_fit((128, 128, 64, 8, 3)) and not tiles_fit((64, 64, 256, 4, 3))
    # under 32 bytes a row (16 e4m3 columns) is refused by the encoding too
    assert not tiles_fit((128, 16, 64, 4, 3)) and not tiles_fit((128, 64, 16, 4, 3))
    assert tiles_fit((64, 32, 128, 4, 3))
    assert tma_tiles_for(1024, 256) == MEASURED_TMA_TILES[(1024, 256)]
    assert tma_tiles_for(48, 96) == DEFAULT_TMA_TILES


@needs_triton
def test_tiles_aotinductor_cannot_encode_and_unaligned_rows_are_refused_before_a_launch():
    from bundler.targets.torch_aoti.kernels.fp8_conv_tma import fp8_conv_1x1_tma

    x = torch.zeros(1, 2, 2, 32).to(torch.float8_e4m3fn)
    w = torch.zeros(32, 32).to(torch.float8_e4m3fn)
    s, b = torch.ones(32), torch.zeros(32)
    for tiles in ((64, 128, 64, 4, 3), (64, 16, 64, 4, 3)):      # too wide, too narrow
        with pytest.raises(ValueError, match=r"rows outside 32\.\.128 bytes"):
            fp8_conv_1x1_tma(x, w, s, b, 32, tiles=tiles)
    with pytest.raises(ValueError, match="16-byte"):
        fp8_conv_1x1_tma(x[..., :24], w[:, :24], s, b, 32)
    with pytest.raises(ValueError, match="neither output"):
        fp8_conv_1x1_tma(x, w, s, b, 32, out_f16=False)


@needs_triton
def test_timm_resnet50_puts_its_33_dense_1x1_layers_on_the_tma_kernel():
    pytest.importorskip("timm")
    import numpy as np

    from bundler.families import load_family
    from bundler.targets.torch_aoti.build import export_strict
    from bundler.targets.torch_aoti.fused import rewrite_fused, uses_tma
    from bundler.torch_model import build_torch_model

    model = build_torch_model(load_family("timm_resnet50"), seed=0)
    fp8 = {n: (0.01, np.full(m.out_channels, 1e-3, np.float32)) for n, m in model.named_modules()
           if isinstance(m, torch.nn.Conv2d) and n != "conv1"}
    fused = rewrite_fused(model, fp8, tma=True)
    on_tma = [n for n, m in fused.named_modules() if getattr(m, "tma_tiles", None) is not None]
    # 52 FP8 layers: 16 3x3 and 3 strided downsamples stay on the implicit GEMM
    assert len(on_tma) == 33 and uses_tma(fused) and export_strict(fused)
    assert not export_strict(rewrite_fused(model, fp8))


def test_timm_resnet50s_3x3_form_puts_the_measured_maps_on_the_box_kernel():
    """fp8_conv triton-fused-tma-3x3 on timm_resnet50: the 16 3x3 layers and 3 strided
    downsamples may take the box kernel (box_eligible); at batch 32's input maps the 10
    stride-1 3x3 layers on 28, 14 and 7 take it with their measured tiles, while the three
    on 56x56 (measured slower) and the six strided layers (not measured) keep the shipped
    kernel."""
    pytest.importorskip("timm")
    import numpy as np

    from bundler.families import load_family
    from bundler.targets.torch_aoti.fp8_layers import exporting_batch
    from bundler.targets.torch_aoti.fused import rewrite_fused
    from bundler.torch_model import build_torch_model

    model = build_torch_model(load_family("timm_resnet50"), seed=0)
    fp8 = {n: (0.01, np.full(m.out_channels, 1e-3, np.float32)) for n, m in model.named_modules()
           if isinstance(m, torch.nn.Conv2d) and n != "conv1"}
    fused = rewrite_fused(model, fp8, tma=True, box_tma=True)
    boxed = {n: m for n, m in fused.named_modules() if getattr(m, "box_tma", False)}
    assert len(boxed) == 19
    sides = {"layer1": 56, "layer2": 28, "layer3": 14, "layer4": 7}   # each stage's output
    taken = []
    with exporting_batch(None):
        for name, m in boxed.items():
            stage = name.split(".")[0]
            side = sides[stage] * m.stride[0]           # the layer's input map
            x = torch.empty(32, side, side, m.cin, dtype=torch.float8_e4m3fn)
            if m.box_tiles_at(x) is not None:
                taken.append((stage, m.stride[0]))
    assert sorted(taken) == sorted([("layer2", 1)] * 3 + [("layer3", 1)] * 5
                                   + [("layer4", 1)] * 2), taken


@needs_triton
def test_timm_resnet50s_fp8_static_graphs_each_take_the_tiles_measured_at_their_batch():
    """The family's fp8 package has graphs for static batch 1, 2 and 4: traced for one of
    them, every fused layer launches the shipped kernel (not TMA) with that batch's table,
    and the dynamic graph keeps the batch-32 table and TMA (before the thirty-eighth
    session batches 2 and 4 ran the dynamic graph's tiles: 0.84-0.91x fp16 on an H100)."""
    pytest.importorskip("timm")
    import numpy as np

    from bundler.families import load_family
    from bundler.targets.torch_aoti.fp8_layers import SMALL_BATCH, exporting_batch
    from bundler.targets.torch_aoti.fused import FusedConv, rewrite_fused, small_static_batch
    from bundler.targets.torch_aoti.kernels.fp8_conv import (MEASURED_TILES,
                                                             MEASURED_TILES_BY_BATCH, tile_key)
    from bundler.targets.torch_aoti.settings import settings_of
    from bundler.torch_model import build_torch_model

    family = load_family("timm_resnet50")
    static = settings_of(family).static_batches_for("fp8")
    assert static == (1, 2, 4)
    model = build_torch_model(family, seed=0)
    fp8 = {n: (0.01, np.full(m.out_channels, 1e-3, np.float32)) for n, m in model.named_modules()
           if isinstance(m, torch.nn.Conv2d) and n != "conv1"}
    layers = [m for m in rewrite_fused(model, fp8, tma=True).modules()
              if isinstance(m, FusedConv) and m.fp8]
    assert len(layers) == 52
    x = torch.zeros(1, 2, 2, 8)
    for n in static:
        assert n <= SMALL_BATCH and n in MEASURED_TILES_BY_BATCH, n
        with exporting_batch(n):
            assert small_static_batch(x)          # the shipped kernel, not TMA
            for m in layers:
                key = tile_key(m.cin, m.cout, m.kernel, m.stride)
                assert m.tiles_for(x) == MEASURED_TILES_BY_BATCH[n][key], (n, key)
    with exporting_batch(None):
        assert not small_static_batch(x)
        for m in layers:
            key = tile_key(m.cin, m.cout, m.kernel, m.stride)
            assert m.tiles_for(x) == MEASURED_TILES[key]
    assert sum(m.tma_tiles is not None for m in layers) == 33



@needs_triton
def test_the_small_batch_tma_form_puts_small_static_graphs_on_tma_with_their_own_tiles():
    """fp8_conv "triton-fused-tma-small": the graphs of static batch 1, 2 and 4 launch the
    TMA kernel on the 33 dense 1x1 layers with the tiles measured at that batch
    (MEASURED_TMA_TILES_BY_BATCH), a small batch without a table (8) the shipped kernel, and
    the dynamic graph batch 32's TMA tiles; "triton-fused-tma" keeps every small graph on
    the shipped kernel."""
    pytest.importorskip("timm")
    import numpy as np

    from bundler.families import load_family
    from bundler.targets.torch_aoti.build import engine_model
    from bundler.targets.torch_aoti.fp8_layers import exporting_batch
    from bundler.targets.torch_aoti.fused import FusedConv
    from bundler.targets.torch_aoti.kernels.fp8_conv_tma import (MEASURED_TMA_TILES,
                                                                 MEASURED_TMA_TILES_BY_BATCH)
    from bundler.torch_model import build_torch_model

    model = build_torch_model(load_family("timm_resnet50"), seed=0)
    fp8 = {n: (0.01, np.full(m.out_channels, 1e-3, np.float32)) for n, m in model.named_modules()
           if isinstance(m, torch.nn.Conv2d) and n != "conv1"}
    forms = {}
    for form in ("triton-fused-tma", "triton-fused-tma-small"):
        module, _ = engine_model(model, "fp8", fp8, fp8_conv=form)
        forms[form] = [m for m in module.modules() if isinstance(m, FusedConv)
                       and m.tma_tiles is not None]
        assert len(forms[form]) == 33, form
    x = torch.zeros(1, 2, 2, 8)
    assert sorted(MEASURED_TMA_TILES_BY_BATCH) == [1, 2, 4]
    for n in (1, 2, 4, 8):
        with exporting_batch(n):
            for m in forms["triton-fused-tma"]:
                assert m.tma_tiles_at(x) is None, (n, m.cin, m.cout)
            for m in forms["triton-fused-tma-small"]:
                want = MEASURED_TMA_TILES_BY_BATCH.get(n, {}).get((m.cin, m.cout))
                assert m.tma_tiles_at(x) == want, (n, m.cin, m.cout)
                assert (want is None) == (n == 8)
    with exporting_batch(None):
        for layers in forms.values():
            for m in layers:
                assert m.tma_tiles_at(x) == MEASURED_TMA_TILES[(m.cin, m.cout)]
    # the two forms are told apart where a bundle records them
    from bundler.targets.torch_aoti.build import fp8_conv_named, fp8_conv_recorded

    recorded = {f: fp8_conv_recorded("fp8", "nhwc", f) for f in forms}
    assert len(set(recorded.values())) == 2
    assert all(fp8_conv_named("nhwc", r) == f for f, r in recorded.items())

def test_exporting_batch_answers_for_the_graph_being_traced():
    from bundler.targets.torch_aoti.fp8_layers import exporting_batch, static_batch

    x = torch.zeros(3, 2)
    assert static_batch(x) == 3
    with exporting_batch(None):
        assert static_batch(x) is None
        with exporting_batch(1):
            assert static_batch(x) == 1
        assert static_batch(x) is None
    assert static_batch(x) == 3
    with pytest.raises(RuntimeError), exporting_batch(8):
        raise RuntimeError("left by an exception")
    assert static_batch(x) == 3


@needs_triton
def test_the_fused_model_exports_with_dynamo_and_keeps_a_dynamic_batch():
    """What the build does for a model with TMA layers (strict export inside
    ``exporting_batch``), on the fused model without them (the TMA kernel's descriptors
    need an sm_90 GPU to trace): the batch stays symbolic; without ``exporting_batch``
    Dynamo would specialize it through the static-batch tile tables."""
    pytest.importorskip("timm")
    import numpy as np

    from bundler.targets.torch_aoti.fp8_layers import exporting_batch
    from bundler.targets.torch_aoti.fused import rewrite_fused
    from bundler.targets.torch_aoti.nhwc_modules import EngineModule

    script = __import__("triton_interpret").load_script("fp8_conv_fused_interpret.py")
    model = script.tiny_resnet()
    fp8 = {n: (0.05, np.full(m.out_channels, 2e-3, np.float32))
           for n, m in model.named_modules() if isinstance(m, torch.nn.Conv2d) and n != "conv1"}
    module = EngineModule(rewrite_fused(model, fp8), torch.float16, False, True).eval()
    dynamic = ({0: torch.export.Dim("batch", min=1, max=32)},)
    with exporting_batch(None):
        program = torch.export.export(module, (torch.randn(2, 3, 16, 16),),
                                      dynamic_shapes=dynamic, strict=True)
    fused = [n for n in program.graph.nodes if "fp8_conv_nhwc_fused" in str(n.target)]
    assert len(fused) == 11 and isinstance(fused[0].meta["val"][1].shape[0], torch.SymInt)


def test_the_tma_form_is_a_setting_of_image_families_only(tmp_path):
    from bundler.families import FamilyError

    family = family_with(tmp_path / "a", "timm_resnet50", fp8_conv="triton-fused-tma")
    assert family.target_settings("torch-aoti").fp8_conv == "triton-fused-tma"
    with pytest.raises(FamilyError, match="fp8_conv triton-fused-tma is another"):
        family_with(tmp_path / "b", "timm_resnet50", fp8_conv="triton-fused-tma",
                     fp8_layout="channels_last")
    with pytest.raises(FamilyError, match="triton-fused-tma.*fused MLPs are triton-fused"):
        family_with(tmp_path / "c", "timm_vit_base", fp8_conv="triton-fused-tma")
    small = family_with(tmp_path / "d", "timm_resnet50", fp8_conv="triton-fused-tma-small")
    assert small.target_settings("torch-aoti").fp8_conv == "triton-fused-tma-small"
    with pytest.raises(FamilyError, match="triton-fused-tma-small.*fused MLPs are"):
        family_with(tmp_path / "e", "timm_vit_base", fp8_conv="triton-fused-tma-small")


def test_the_tma_form_is_recorded_and_read_back_by_its_name():
    from bundler.targets.torch_aoti.build import (default_fp8_conv, fp8_conv_named,
                                                  fp8_conv_recorded)

    recorded = fp8_conv_recorded("fp8", "nhwc", "triton-fused-tma")
    assert "TMA" in recorded and recorded != fp8_conv_recorded("fp8", "nhwc", "triton-fused")
    assert fp8_conv_named("nhwc", recorded) == "triton-fused-tma"
    assert default_fp8_conv("triton-fused-tma") == "triton-fused-tma"


def test_the_familys_tma_form_builds_the_shipped_kernel_on_a_gpu_without_tma(monkeypatch):
    """A family whose fp8_conv is triton-fused-tma must still build on an FP8 GPU without
    TMA (sm_89: L4, L40S): there its build makes triton-fused. The form asked for by name
    (the build's fp8_conv, $TRT_BUNDLE_FP8_CONV) is kept, and engine_model refuses it."""
    from bundler.targets.torch_aoti.build import FP8_CONV_ENV, build_fp8_conv

    tma = "triton-fused-tma"
    monkeypatch.delenv(FP8_CONV_ENV, raising=False)
    assert build_fp8_conv(None, tma, (9, 0)) == tma          # Hopper: the family's form
    assert build_fp8_conv(None, tma, (10, 0)) == tma
    assert build_fp8_conv(None, tma, None) == tma             # no GPU: as named
    assert build_fp8_conv(None, tma, (8, 9)) == "triton-fused"
    assert build_fp8_conv(None, "triton-fused", (8, 9)) == "triton-fused"
    assert build_fp8_conv(tma, "triton-fused", (8, 9)) == tma
    monkeypatch.setenv(FP8_CONV_ENV, tma)
    assert build_fp8_conv(None, "triton-fused", (8, 9)) == tma


def test_the_reuse_check_expects_the_form_the_bundles_gpu_builds(tmp_path, monkeypatch):
    """`--reuse` and `bundle study` compare a bundle's recorded form with what this build
    would make on the GPU the bundle records: an sm_89 bundle of a TMA family holds
    triton-fused and is the family's build there; on an sm_90 one it would be rebuilt."""
    from bundler.make import MakeRequest
    from bundler.targets.torch_aoti.build import FP8_CONV_ENV, fp8_conv_recorded
    from bundler.targets.torch_aoti.reuse import recorded_capability, reuse_checks

    monkeypatch.delenv(FP8_CONV_ENV, raising=False)
    family = family_with(tmp_path, "timm_resnet50", fp8_conv="triton-fused-tma")
    req = MakeRequest(family=family.name, precision="fp8", random_weights=True)
    fused = {"compile_options": {"fp8_conv": fp8_conv_recorded("fp8", "nhwc", "triton-fused")}}
    assert recorded_capability({"compute_capability": "8.9"}) == (8, 9)
    assert recorded_capability({"compute_capability": None}) is None
    have, want = reuse_checks({**fused, "compute_capability": "8.9"}, family, req)[
        "fp8 convolution form"]
    assert have == want == "triton-fused"
    have, want = reuse_checks({**fused, "compute_capability": "9.0"}, family, req)[
        "fp8 convolution form"]
    assert (have, want) == ("triton-fused", "triton-fused-tma")


def test_the_reuse_check_rebuilds_a_bundle_whose_stem_is_not_the_familys(tmp_path, monkeypatch):
    """`--reuse` takes an fp8 timm_resnet50 bundle as this build's only when its stem is
    fused as the family says (``compile_options.fp8_stem``); with the setting off, a bundle
    with a fused stem is rebuilt, and the other way round."""
    from bundler.make import MakeRequest
    from bundler.targets.torch_aoti.build import (FP8_CONV_ENV, STEM_DESCRIPTION,
                                                  fp8_conv_recorded)
    from bundler.targets.torch_aoti.reuse import reuse_checks

    monkeypatch.delenv(FP8_CONV_ENV, raising=False)
    req = MakeRequest(family="timm_resnet50", precision="fp8", random_weights=True)
    conv = fp8_conv_recorded("fp8", "nhwc", "triton-fused-tma-small")
    plain = {"compute_capability": "9.0", "compile_options": {"fp8_conv": conv}}
    stem = {"compute_capability": "9.0",
            "compile_options": {"fp8_conv": conv, "fp8_stem": STEM_DESCRIPTION}}
    on = family_with(tmp_path / "on", "timm_resnet50", fp8_fuse_stem=True)
    off = family_with(tmp_path / "off", "timm_resnet50", fp8_fuse_stem=False)
    assert reuse_checks(stem, on, req)["fp8 stem fused"] == (True, True)
    assert reuse_checks(plain, on, req)["fp8 stem fused"] == (False, True)
    assert reuse_checks(stem, off, req)["fp8 stem fused"] == (True, False)
    assert reuse_checks(plain, off, req)["fp8 stem fused"] == (False, False)


@needs_triton
def test_a_token_family_is_refused_the_tma_form_by_name():
    from bundler.targets.torch_aoti.build import engine_model
    from runtime_py.errors import UsageError

    model = torch.nn.Sequential(torch.nn.Linear(16, 16))
    with pytest.raises(UsageError, match="triton-fused-tma.*name triton-fused"):
        engine_model(model, "fp8", {"0": (0.01, [0.001] * 16)}, layout="as_is",
                     fp8_conv="triton-fused-tma")


@pytest.mark.gpu
@needs_cuda
@needs_triton
@pytest.mark.parametrize("small_graph", ["shipped", "tma", "box"])
def test_gpu_the_tma_model_compiles_with_aotinductor_and_matches_eager(tmp_path, small_graph):
    """The bundle path on an sm_90 GPU: strict export with a dynamic batch and a static
    batch-1 graph, AOTInductor encoding the host descriptors, the package against eager.
    small_graph "tma": the batch-1 graph on TMA too, with tiles of its own (fp8_conv
    triton-fused-tma-small's form); "box": a model whose 3x3 layers take the 4-D TMA kernel
    in the dynamic graph (triton-fused-tma-3x3's form)."""
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("TMA needs an sm_90 GPU (Hopper) or newer")
    pytest.importorskip("timm")
    import numpy as np

    from bundler.targets.torch_aoti.build import compile_package, smoke_check
    from bundler.targets.torch_aoti.fp8_layers import exporting_batch
    from bundler.targets.torch_aoti.fused import rewrite_fused
    from bundler.targets.torch_aoti.nhwc_modules import EngineModule

    script = __import__("triton_interpret").load_script("fp8_conv_tma_interpret.py")
    model = script.small_resnet(32 if small_graph == "box" else 16)
    fp8 = {n: (0.05, np.full(m.out_channels, 2e-3, np.float32))
           for n, m in model.named_modules() if isinstance(m, torch.nn.Conv2d) and n != "conv1"}
    small = ({1: dict.fromkeys(script.SMALL_MODEL_1X1, (64, 32, 128, 4, 3))}
             if small_graph == "tma" else None)
    module = EngineModule(rewrite_fused(model, fp8, tma=True, tma_batch_tiles=small,
                                        box_tma=small_graph == "box"),
                          torch.float16, False, True).cuda().eval()
    path, _ = compile_package(module, (3, 12, 12), {"min": 1, "max": 16}, "cuda",
                              {"max_autotune": False}, tmp_path / "tma.pt2", static_batches=(1,))
    with exporting_batch(None):          # eager with the TMA layers, as the dynamic graph
        diffs = smoke_check(path, module, (3, 12, 12), [1, 5, 16], "cuda", static_batches=(1,))
    with torch.no_grad():
        scale = float(module(torch.randn(4, 3, 12, 12, device="cuda")).abs().max())
    assert max(diffs.values()) <= 1e-2 * scale, diffs
