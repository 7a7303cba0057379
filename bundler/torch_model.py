"""The family's torch model, in eval mode, with BatchNorm folded into its convolutions.

Every graph trt-bundle builds (the fp32 ONNX export, and from it fp16 and fp8) and the
torch-aoti engine start from this one module, so the fold happens once, here, in float64:
the exported graph then has no BatchNormalization nodes, and the per-output-channel FP8
weight scales are computed on the kernels the engine really runs (the folded ones).

Weights come either from a state dict (loaded strictly: a checkpoint that does not fit the
family is refused, not half-loaded) or from a seed (deterministic random weights, with
non-trivial BatchNorm statistics so that the fold is exercised, for ``--random-weights``).

torch and timm are imported inside the functions: importing this module costs nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from runtime_py.errors import FamilyError, UsageError, WeightsError

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from bundler.families import Family

__all__ = ["build_torch_model", "fold_batchnorm", "random_state_dict", "DEFAULT_SEED"]

#: The seed used for ``--random-weights`` when none is given.
DEFAULT_SEED = 0

# BatchNorm buffers that carry no information in eval mode; a checkpoint may omit them.
_OPTIONAL_KEYS_SUFFIX = ".num_batches_tracked"


def build_torch_model(
    family: Family,
    state_dict: Mapping[str, Any] | None = None,
    seed: int | None = None,
) -> torch.nn.Module:
    """Create the family's model, load its weights, fold BatchNorm, return it in eval mode.

    Exactly one source of weights: ``state_dict`` (name -> tensor, e.g. read from a
    safetensors checkpoint) or ``seed`` (seeded random weights; ``None`` for both means
    ``DEFAULT_SEED``). The same seed always gives identical weights on the same torch/timm.
    Raises ``WeightsError`` when the state dict does not match the architecture.
    """
    import torch

    if state_dict is not None and seed is not None:
        raise UsageError("give either a state dict or a seed for random weights, not both")
    model = _create_unfolded(family)
    if state_dict is None:
        state_dict = random_state_dict(family, DEFAULT_SEED if seed is None else seed)
    _load_strict(model, state_dict, family)
    model.eval()
    with torch.no_grad():
        fold_batchnorm(model, family)
    model.requires_grad_(False)
    return model


def random_state_dict(family: Family, seed: int) -> dict[str, torch.Tensor]:
    """Seeded random weights for the family's architecture.

    Convolution and linear weights follow timm's own initialisation (run under a forked
    RNG seeded with ``seed``, so the caller's global RNG is untouched); BatchNorm affine
    parameters and running statistics are then drawn from a dedicated generator so that the
    fold is a real transformation (timm initialises them to the identity).
    """
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = _create_unfolded(family)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
                n = module.num_features
                module.weight.copy_(torch.empty(n).uniform_(0.5, 1.5, generator=gen))
                module.bias.copy_(torch.empty(n).normal_(0.0, 0.1, generator=gen))
                module.running_mean.copy_(torch.empty(n).normal_(0.0, 0.1, generator=gen))
                module.running_var.copy_(torch.empty(n).uniform_(0.5, 1.5, generator=gen))
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def unfolded_model(family: Family, state_dict: Mapping[str, Any]) -> torch.nn.Module:
    """The family's model with ``state_dict`` loaded and BatchNorm *not* folded (eval mode).

    Only for checking the fold against the original computation (tests, quality reports).
    """
    model = _create_unfolded(family)
    _load_strict(model, state_dict, family)
    return model.eval().requires_grad_(False)


def fold_batchnorm(model: torch.nn.Module, family: Family | None = None) -> int:
    """Fold every BatchNorm that directly follows a convolution into it, in place.

    A pair is a ``Conv2d`` child immediately followed, in registration order, by a
    ``BatchNorm2d`` child of the same parent (timm's ``ConvNormAct``, ``SeparableConv2d``
    and similar). The fold is exact in float64 and cast back to the convolution's dtype:
    ``w' = w * g / sqrt(v + eps)``, ``b' = beta + (b - m) * g / sqrt(v + eps)``. The
    BatchNorm is replaced by what it applied after the normalisation (timm's
    ``BatchNormAct2d`` carries its dropout and activation), else by ``Identity``.

    ``family``: its ``fold_batchnorm`` hook (``family.py``) runs first, for pairs this rule
    does not see. Returns how many were folded. Raises ``FamilyError`` if a BatchNorm is
    left over (the architecture needs a fold rule this function does not know: the
    exported graph would otherwise carry BatchNormalization nodes).
    """
    import torch
    from torch import nn

    folded = 0
    if family is not None and (own := family.hook("fold_batchnorm")) is not None:
        folded += int(own(model))
    for parent in list(model.modules()):
        names = list(parent._modules)
        for conv_name, bn_name in zip(names, names[1:]):
            conv, bn = parent._modules[conv_name], parent._modules[bn_name]
            if not (isinstance(conv, nn.Conv2d) and isinstance(bn, nn.BatchNorm2d)):
                continue
            if bn.num_features != conv.out_channels or not bn.track_running_stats:
                continue
            _fold_pair(conv, bn)
            after = [m for m in (getattr(bn, "drop", None), getattr(bn, "act", None)) if m is not None]
            parent._modules[bn_name] = nn.Sequential(*after) if after else nn.Identity()
            folded += 1
    left = [n for n, m in model.named_modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if left:
        raise FamilyError(
            f"cannot fold {len(left)} BatchNorm layer(s) into a preceding convolution "
            f"(first: {left[0]!r}); this architecture needs a fold rule: define "
            "fold_batchnorm(model) in its family's family.py (bundler.families)"
        )
    return folded


def _fold_pair(conv: torch.nn.Conv2d, bn: torch.nn.BatchNorm2d) -> None:
    import torch

    w = conv.weight.detach().to(torch.float64)
    b = conv.bias.detach().to(torch.float64) if conv.bias is not None else torch.zeros(w.shape[0], dtype=torch.float64)
    mean = bn.running_mean.detach().to(torch.float64)
    var = bn.running_var.detach().to(torch.float64)
    gamma = bn.weight.detach().to(torch.float64) if bn.affine else torch.ones_like(mean)
    beta = bn.bias.detach().to(torch.float64) if bn.affine else torch.zeros_like(mean)
    factor = gamma / torch.sqrt(var + bn.eps)
    new_w = w * factor.reshape(-1, *([1] * (w.dim() - 1)))
    new_b = beta + (b - mean) * factor
    dtype = conv.weight.dtype
    conv.weight = torch.nn.Parameter(new_w.to(dtype), requires_grad=False)
    conv.bias = torch.nn.Parameter(new_b.to(dtype), requires_grad=False)


def _create_unfolded(family: Family) -> torch.nn.Module:
    try:
        import timm
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise UsageError(
            "building the model needs torch and timm: install trt-bundle[export]"
        ) from exc
    create = family.hook("create_model")
    if create is not None:
        return create(family).eval()
    name = family.checkpoint.timm_model
    try:
        model = timm.create_model(name, pretrained=False, num_classes=family.num_classes)
    except RuntimeError as exc:  # timm raises RuntimeError for an unknown model name
        raise FamilyError(
            f"family {family.name!r}: timm {timm.__version__} has no model {name!r}: {exc}"
        ) from exc
    return model.eval()


def _load_strict(model: torch.nn.Module, state_dict: Mapping[str, Any], family: Family) -> None:
    """Load every tensor, refusing missing, unexpected or mis-shaped ones with their names."""
    import torch

    expected = model.state_dict()
    given = dict(state_dict)
    missing = sorted(k for k in expected if k not in given and not k.endswith(_OPTIONAL_KEYS_SUFFIX))
    unexpected = sorted(k for k in given if k not in expected)
    mis_shaped = sorted(
        f"{k}: checkpoint {tuple(given[k].shape)}, model {tuple(expected[k].shape)}"
        for k in expected
        if k in given and tuple(given[k].shape) != tuple(expected[k].shape)
    )
    problems = (
        [f"missing: {k}" for k in missing]
        + [f"unexpected: {k}" for k in unexpected]
        + [f"shape mismatch: {s}" for s in mis_shaped]
    )
    if problems:
        shown = "; ".join(problems[:5]) + (f"; ... ({len(problems) - 5} more)" if len(problems) > 5 else "")
        raise WeightsError(
            f"the checkpoint does not match family {family.name!r} "
            f"(timm model {family.checkpoint.timm_model!r}): {shown}. "
            "Use a checkpoint of that model, or --random-weights",
            problems=problems,
        )
    tensors = {k: torch.as_tensor(v) for k, v in given.items()}
    for k in expected:
        if k not in tensors:  # an optional buffer: keep the model's own
            tensors[k] = expected[k]
    model.load_state_dict(tensors, strict=True)
