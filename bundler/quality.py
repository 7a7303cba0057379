"""Quality of a bundle's outputs against the fp32 reference: the numbers every report uses.

One implementation for `bundle make`'s quality summary, `bundle eval` and `bundle study`,
so that a figure means the same thing wherever it is printed. Pure numpy.
"""

from __future__ import annotations

import numpy as np


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = np.asarray(logits, dtype=np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def kl_divergence(reference_logits: np.ndarray, test_logits: np.ndarray) -> np.ndarray:
    """KL(p_ref || p_test) per row, in nats, from logits (float64, stable)."""
    log_p = log_softmax(reference_logits)
    log_q = log_softmax(test_logits)
    return (np.exp(log_p) * (log_p - log_q)).sum(axis=-1)


def compare_logits(reference: np.ndarray, test: np.ndarray) -> dict:
    """Top-1 agreement, mean KL, max |diff| and non-finite counts of `test` vs `reference`.

    Rows where either side is not finite are left out of the agreement, KL and diff (and
    counted); with no finite row at all those three are NaN.
    """
    reference = np.asarray(reference, dtype=np.float64)
    test = np.asarray(test, dtype=np.float64)
    if reference.shape != test.shape or reference.ndim != 2:
        raise ValueError(f"logits shapes differ or are not 2-D: {reference.shape} vs {test.shape}")
    nan_count = int(np.isnan(test).sum())
    inf_count = int(np.isinf(test).sum())
    finite = np.isfinite(test).all(axis=1) & np.isfinite(reference).all(axis=1)
    n = int(finite.sum())
    if n:
        ref, tst = reference[finite], test[finite]
        agreement = float((ref.argmax(axis=1) == tst.argmax(axis=1)).mean())
        kl_mean = float(kl_divergence(ref, tst).mean())
        max_abs = float(np.abs(ref - tst).max())
    else:
        agreement = kl_mean = max_abs = float("nan")
    return {"images": int(reference.shape[0]), "top1_agreement": agreement, "kl_mean": kl_mean,
            "max_abs_diff": max_abs, "nan_count": nan_count, "inf_count": inf_count}


def top1_accuracy(logits: np.ndarray, labels: np.ndarray) -> float:
    return float((np.asarray(logits).argmax(axis=1) == np.asarray(labels)).mean())


def decimal(x: float) -> str:
    """A float as the manifest writes it: 6 significant digits, a plain decimal string."""
    if np.isnan(x):
        return "nan"
    if np.isinf(x):
        return "inf" if x > 0 else "-inf"
    text = format(float(x), ".6g")
    return text.replace("e+", "e")


def manifest_quality(comparison: dict, reference: str, inputs_source: str) -> dict:
    """`compare_logits` output in the manifest's form (decimal strings, no floats)."""
    return {
        "reference": reference,
        "images": comparison["images"],
        "inputs_source": inputs_source,
        "top1_agreement": decimal(comparison["top1_agreement"]),
        "kl_mean": decimal(comparison["kl_mean"]),
        "max_abs_diff": decimal(comparison["max_abs_diff"]),
        "nan_count": comparison["nan_count"],
        "inf_count": comparison["inf_count"],
    }
