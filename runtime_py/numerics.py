"""Numeric verification: does this bundle's engine reproduce the bundle's stored outputs?

`reference.safetensors` holds a few preprocessed inputs (`input.<name>`), the fp32
graph's outputs on them (`fp32.<output>`) and the bundle's own outputs computed with ONNX
Runtime CPU on `model.onnx` (`bundle.<output>`). `check_numerics` runs the inputs through
the bundle's engine on this host and compares:

* against `bundle.<output>`: pass/fail, within the precision's tolerance below. Engines
  pick different kernels (summation order, fused ops, fp16 accumulation, real fp8 math
  where ONNX Runtime simulates Q/DQ in float), so the comparison is never bit-exact;
* against `fp32.<output>`: reported only (that gap is the precision's cost, summarised
  in the manifest's `quality`, not an engine defect).

Used by `bundle verify --numerics`; returns a report and prints nothing.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np

from runtime_py.errors import BundleError, BundleFormatError, CompatibilityError, ManifestError
from runtime_py.reference import read_reference

REFERENCE_MEMBER = "reference.safetensors"


@dataclass(frozen=True)
class Tolerance:
    """How far an engine's outputs may be from the bundle's ONNX Runtime CPU outputs.

    max_abs: largest allowed |engine - reference| over every output element, for outputs
        whose largest reference magnitude is at most `TYPICAL_PEAK` (trained classifiers'
        logits); above it the allowance grows in proportion (`allowed`): rounding errors
        are relative, and seeded random weights give logits in the thousands (ResNet-50:
        ~1,500, where two correct fp8 engines differ by ~20).
    near_tie_flips: whether a top-1 disagreement is excused on a row whose reference top-1
        leads the engine's pick by no more than 2 * the allowance (a difference the
        tolerance already allows can reorder near-equal classes); a flip on a clear lead
        always fails.
    """

    max_abs: float
    near_tie_flips: bool

    def allowed(self, reference: np.ndarray) -> float:
        """The allowance for one output: `max_abs`, scaled by the reference's peak
        magnitude over `TYPICAL_PEAK` when that is larger."""
        peak = float(np.max(np.abs(reference))) if reference.size else 0.0
        return self.max_abs * max(1.0, peak / TYPICAL_PEAK)


#: The output magnitude the absolute tolerances below were set for (logits of ~10).
TYPICAL_PEAK = 10.0


TOLERANCES: dict[str, Tolerance] = {
    # Same fp32 graph, fp32 math (TF32 is disabled when plans are built): differences
    # come from summation order only, ~1e-5 relative on logits of magnitude ~10.
    "fp32": Tolerance(max_abs=1e-3, near_tie_flips=False),
    # Every tensor is fp16 (10-bit mantissa, eps ~ 1e-3): kernels that accumulate in
    # fp16 vs fp32, or fuse differently, move logits by a few 1e-3 to 1e-2.
    "fp16": Tolerance(max_abs=5e-2, near_tie_flips=True),
    # FP8 E4M3 activations/weights (3-bit mantissa) on the recipe's convolutions: ONNX
    # Runtime dequantizes and computes in float, TensorRT runs real fp8 GEMMs, and a
    # value on a rounding boundary lands one fp8 step (12.5%) apart before scaling.
    "fp8": Tolerance(max_abs=2.5e-1, near_tie_flips=True),
}


@dataclass
class OutputComparison:
    name: str
    max_abs_diff: float
    allowed_max_abs: float                # the tolerance at this output's magnitude
    top1_agreement: float | None          # None for outputs that are not [N, classes]
    top1_mismatches: int
    decisive_top1_mismatches: int         # flips on rows with a clear reference lead
    fp32_max_abs_diff: float | None       # reported only
    fp32_top1_agreement: float | None


@dataclass
class NumericsReport:
    bundle_id: str
    backend: str
    precision: str
    tolerance: Tolerance
    inputs: int                            # reference rows run
    ran: bool
    passed: bool | None                    # None when the engine could not run here
    outputs: list[OutputComparison] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def _top1(a: np.ndarray) -> np.ndarray:
    return np.argmax(a.reshape(a.shape[0], -1), axis=1)


def compare_output(name: str, got: np.ndarray, ref: np.ndarray, tol: Tolerance,
                   fp32: np.ndarray | None = None) -> OutputComparison:
    """Compare one output (pure: tested directly)."""
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if got.shape != ref.shape:
        raise BundleError(f"output {name!r}: engine gave shape {list(got.shape)}, the "
                          f"reference has {list(ref.shape)}")
    max_abs = float(np.max(np.abs(got - ref))) if got.size else 0.0
    allowed = tol.allowed(ref)
    top1 = None
    mismatches = decisive = 0
    if got.ndim == 2 and got.shape[1] > 1 and got.shape[0] > 0:
        g, r = _top1(got), _top1(ref)
        wrong = np.nonzero(g != r)[0]
        mismatches = int(wrong.size)
        top1 = float(np.mean(g == r))
        for row in wrong:
            lead = ref[row, r[row]] - ref[row, g[row]]
            if not (tol.near_tie_flips and lead <= 2 * allowed):
                decisive += 1
    fp32_abs = fp32_top1 = None
    if fp32 is not None and fp32.shape == got.shape:
        fp32 = np.asarray(fp32, dtype=np.float64)
        fp32_abs = float(np.max(np.abs(got - fp32))) if got.size else 0.0
        if got.ndim == 2 and got.shape[1] > 1 and got.shape[0] > 0:
            fp32_top1 = float(np.mean(_top1(got) == _top1(fp32)))
    return OutputComparison(name, max_abs, allowed, top1, mismatches, decisive, fp32_abs,
                            fp32_top1)


def _default_factory(backend: str | None):
    from runtime_py.engines import runner_class

    def make(bundle):
        return runner_class(backend or bundle.manifest["engine"]["backend"])(bundle)

    return make


def check_numerics(bundle, runner_factory: Callable | None = None, *,
                   backend: str | None = None, skip_unavailable: bool = False) -> NumericsReport:
    """Run the reference inputs through the bundle's engine and compare (see module doc).

    runner_factory(bundle) -> Runner overrides the engine (default: the runner of
    `backend`, else of the bundle's own engine target). If the engine cannot run on this
    host its CompatibilityError/EngineUnavailableError propagates, unless
    `skip_unavailable`, which returns a report with ran=False, passed=None and the reason.
    """
    manifest = bundle.manifest
    precision = manifest["precision"]
    tol = TOLERANCES[precision]
    make = runner_factory or _default_factory(backend)
    runner = make(bundle)
    report = NumericsReport(bundle_id=bundle.id, backend=runner.backend, precision=precision,
                            tolerance=tol, inputs=0, ran=False, passed=None)
    if not bundle.has_member(REFERENCE_MEMBER):
        report.passed = False
        report.reasons.append(f"the bundle has no {REFERENCE_MEMBER}: nothing to compare")
        return report
    try:
        ref = read_reference(bundle)
    except BundleFormatError as exc:
        raise ManifestError(str(exc)) from None
    in_specs, out_specs = runner.input_metadata(), runner.output_metadata()
    missing = [f"input.{s.name}" for s in in_specs if s.name not in ref.inputs]
    missing += [f"bundle.{s.name}" for s in out_specs if s.name not in ref.bundle]
    if missing:
        report.passed = False
        report.reasons.append(f"{REFERENCE_MEMBER} lacks {', '.join(missing)}")
        return report
    feeds_all = {s.name: np.ascontiguousarray(ref.inputs[s.name].astype(s.dtype, copy=False))
                 for s in in_specs}
    n = next(iter(feeds_all.values())).shape[0]
    try:
        runner.activate()
    except CompatibilityError as exc:   # EngineUnavailableError is a subclass
        if not skip_unavailable:
            raise
        report.reasons.append(str(exc))
        return report
    try:
        step = runner.max_batch_size
        chunks: dict[str, list[np.ndarray]] = {s.name: [] for s in out_specs}
        for start in range(0, n, step):
            feeds = {k: v[start:start + step] for k, v in feeds_all.items()}
            out = runner.infer(feeds)
            for s in out_specs:
                chunks[s.name].append(np.asarray(out[s.name]))
    finally:
        runner.deactivate()
    report.ran, report.inputs = True, int(n)
    for s in out_specs:
        got = np.concatenate(chunks[s.name], axis=0)
        cmp = compare_output(s.name, got, ref.bundle[s.name], tol, ref.fp32.get(s.name))
        report.outputs.append(cmp)
        if not np.all(np.isfinite(got)):
            report.reasons.append(f"{s.name}: the engine produced NaN or Inf")
        if cmp.max_abs_diff > cmp.allowed_max_abs:
            report.reasons.append(f"{s.name}: max |diff| {cmp.max_abs_diff:.3g} > "
                                  f"{cmp.allowed_max_abs:.3g} allowed for {precision} at this "
                                  "output's magnitude")
        if cmp.decisive_top1_mismatches:
            report.reasons.append(
                f"{s.name}: top-1 differs on {cmp.decisive_top1_mismatches} of {n} input(s) "
                "where the reference's lead is larger than the tolerance")
    report.passed = not report.reasons
    return report
