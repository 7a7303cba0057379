"""What `bundle inspect` and `bundle verify` report, as data (the CLI only prints it).

Lives in the bundler package but imports only the runtime's reader, so both commands
work with the core install (no torch, no onnx).
"""

from __future__ import annotations

import os
from pathlib import Path

from runtime_py.errors import BundleError, SignatureError, VerificationError
from runtime_py.format import open_bundle


def inspect_summary(path: str | os.PathLike) -> dict:
    """The manifest plus what a reader derives: id, path, file size, ratios.

    This exact shape is also what `cpp_stub`'s `bundle-inspect-cpp --json` prints.
    """
    with open_bundle(path) as bundle:
        summary = dict(bundle.manifest)
        summary["id"] = bundle.id
        summary["path"] = str(path)
        summary["file_size"] = Path(path).stat().st_size
        summary["random_weights"] = bundle.manifest["source"]["kind"] == "random-weights"
        summary["members"] = [
            dict(m, ratio=f"{m['raw_size'] / m['stored_size']:.3f}")
            for m in bundle.manifest["members"]
        ]
        return summary


#: The manifest's decimal-string fields (schemas/manifest.schema.json `$defs/decimal`)
#: that `bundle inspect --json` prints as numbers.
DECIMAL_FIELDS = {"quality": ("top1_agreement", "kl_mean", "max_abs_diff"),
                  "calibration": ("percentile",)}


def json_summary(summary: dict) -> dict:
    """What `bundle inspect --json` prints: the summary with numbers where the manifest
    keeps decimal strings (members' `ratio`, the quality and calibration figures).

    The manifest stores measured values as decimal strings (its canonical form has no
    floats, docs/architecture.md); programs reading inspect's JSON want numbers.
    `inspect_summary` itself stays in the manifest's form, which the C++ reader prints.
    """
    out = dict(summary)
    out["members"] = [dict(m, ratio=float(m["ratio"])) for m in summary["members"]]
    for record, keys in DECIMAL_FIELDS.items():
        if out.get(record):
            out[record] = {k: _number(v) if k in keys else v for k, v in out[record].items()}
    return out


def _number(text: object) -> object:
    """A decimal string as a number; "nan"/"inf"/"-inf" stay strings (JSON has no such
    numbers, and null would hide which one it was)."""
    if not isinstance(text, str) or text.lstrip("-") in ("nan", "inf"):
        return text
    return float(text)


def verify_report(path: str | os.PathLike, numerics: bool = False, backend: str | None = None,
                  trust=None, signature_path: str | os.PathLike | None = None) -> dict:
    """Every check of a bundle; `{"path", "id", "ok", "problems", "checks", ...}`.

    Structure, header, manifest schema and id are checked on open; then every member's
    size and sha256; with `numerics`, the reference inputs are run through the engine;
    with `trust` (a `TrustPolicy`), the detached signature, reported as `signature` (who
    signed, with what). Exit code: 1 when an integrity or numerics check fails, else 8
    when only the signature is refused.
    """
    report: dict = {"path": str(path), "id": None, "ok": False, "problems": [], "checks": [],
                    "exit_code": 1}
    try:
        bundle = open_bundle(path)
    except BundleError as exc:
        # Not a bundle at all (missing, a directory, wrong magic...): the error's own exit
        # code, as for every other command, rather than "verify found problems".
        report["problems"] = exc.problems
        report["exit_code"] = exc.exit_code
        report["opened"] = False
        return report
    with bundle:
        report["id"] = bundle.id
        report["random_weights"] = bundle.manifest["source"]["kind"] == "random-weights"
        report["checks"] += ["header", "manifest sha256 = bundle id", "manifest schema",
                             "member layout"]
        try:
            bundle.verify()
            report["checks"].append(f"{len(bundle.member_names)} member hashes")
        except VerificationError as exc:
            report["problems"] += exc.problems
        if numerics and not report["problems"]:
            from runtime_py.numerics import check_numerics

            try:
                numerics_report = check_numerics(bundle, backend=backend)
            except BundleError as exc:
                report["problems"].append(f"numerics: {exc}")
            else:
                report["numerics"] = numerics_report.to_dict()
                if numerics_report.passed:
                    report["checks"].append("numerics vs reference outputs")
                else:
                    report["problems"] += [f"numerics: {r}" for r in numerics_report.reasons]
        integrity_ok = not report["problems"]
        if trust is not None:
            from runtime_py.signing import check_trust

            try:
                report["signature"] = check_trust(bundle, trust, signature_path)
                report["checks"].append(f"signature by {report['signature']['identity']}")
            except SignatureError as exc:
                report["problems"].append(f"signature: {exc}")
                if integrity_ok:
                    report["exit_code"] = exc.exit_code
    report["ok"] = not report["problems"]
    if report["ok"]:
        report["exit_code"] = 0
    return report
