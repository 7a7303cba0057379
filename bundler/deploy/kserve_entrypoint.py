"""The container entrypoint of the KServe runtime: verify what was fetched, then serve.

    python -m bundler.deploy.kserve_entrypoint --model-dir /mnt/models --port 8080

KServe's storage initializer has copied the storage URI into the model folder. Before
anything listens, every `*.bundle` there is verified (`bundle verify`: header, manifest,
id, every member's sha256), and the ids must be exactly those in `TRT_BUNDLE_IDS` (the
manifests written by `bundle export kserve` pin them): a bucket path that now holds
another bundle, or a truncated download, stops the pod with the reason in its log instead
of serving it. Then the process becomes `bundle serve` (exec: it gets the signals).

Settings from the InferenceService's env: TRT_BUNDLE_IDS (comma-separated),
TRT_BUNDLE_BACKEND, TRT_BUNDLE_MAX_BATCH, TRT_BUNDLE_MAX_DELAY_MS.
Only the runtime and the bundle reader are imported: it runs in the slim image.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path
from typing import Callable, Mapping

from runtime_py.errors import BundleNotFoundError, SignatureError, VerificationError


def find_bundles(model_dir: Path) -> list[Path]:
    """The bundle files under the model folder (a storage URI may name a file or a folder)."""
    if not model_dir.is_dir():
        raise BundleNotFoundError(f"model folder {model_dir} does not exist: is the "
                                  "InferenceService's storageUri set?")
    found = sorted(p for p in model_dir.rglob("*.bundle") if p.is_file())
    if not found:
        raise BundleNotFoundError(f"no *.bundle file under {model_dir}: the storage URI must "
                                  "name a bundle file or a folder holding bundles")
    return found


def verify_bundles(paths: list[Path], expected_ids: list[str], trust=None) -> list[str]:
    """Verify each bundle (and, with ``trust``, its signature ``BUNDLE.sig``); returns the
    ids. Raises VerificationError listing every problem."""
    from bundler.inspect import verify_report

    problems: list[str] = []
    ids: list[str] = []
    codes: set[int] = set()
    for path in paths:
        report = verify_report(path, trust=trust)
        if not report["ok"]:
            problems += [f"{path}: {p}" for p in report["problems"]]
            codes.add(report["exit_code"])
        elif report["id"]:
            ids.append(report["id"])
    if expected_ids:
        for bundle_id in expected_ids:
            if bundle_id not in ids:
                problems.append(f"bundle {bundle_id} is not in the model folder (found "
                                f"{', '.join(i[:16] for i in ids) or 'none'}): the storage "
                                "URI holds other bundles than the manifest names")
        for path, bundle_id in zip(paths, ids):
            if bundle_id not in expected_ids:
                problems.append(f"{path} (id {bundle_id[:16]}) is not one of TRT_BUNDLE_IDS")
    if problems:
        error = VerificationError("; ".join(problems), problems=problems)
        if codes == {SignatureError.exit_code}:   # intact bundles, refused signatures: 8
            error = SignatureError("; ".join(problems), problems=problems)
        raise error
    return ids


def serve_command(paths: list[Path], port: int, env: Mapping[str, str]) -> list[str]:
    cmd = [shutil.which("bundle") or "bundle", "serve", *map(str, paths),
           "--host", "0.0.0.0", "--port", str(port),
           "--backend", env.get("TRT_BUNDLE_BACKEND", "auto"),
           "--max-delay-ms", env.get("TRT_BUNDLE_MAX_DELAY_MS", "2")]
    if env.get("TRT_BUNDLE_MAX_BATCH"):
        cmd += ["--max-batch", env["TRT_BUNDLE_MAX_BATCH"]]
    if env.get("TRT_BUNDLE_GRPC_PORT"):
        cmd += ["--grpc-port", env["TRT_BUNDLE_GRPC_PORT"]]
    if env.get("TRT_BUNDLE_TRUSTED_KEYS"):
        cmd += ["--trusted-keys", env["TRT_BUNDLE_TRUSTED_KEYS"]]
    return cmd


def main(argv: list[str] | None = None, env: Mapping[str, str] | None = None,
         execute: Callable[[str, list[str]], object] = os.execv) -> int:
    parser = argparse.ArgumentParser(prog="kserve_entrypoint", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", default="/mnt/models", type=Path)
    parser.add_argument("--port", default=8080, type=int)
    args = parser.parse_args(argv)
    env = os.environ if env is None else env
    expected = [i.strip() for i in env.get("TRT_BUNDLE_IDS", "").split(",") if i.strip()]
    from runtime_py.errors import BundleError

    try:
        trust = None
        if env.get("TRT_BUNDLE_TRUSTED_KEYS"):   # a mounted folder of keys / CAs (a Secret)
            from runtime_py.signing.trust import load_trust

            trust = load_trust([Path(env["TRT_BUNDLE_TRUSTED_KEYS"])])
        paths = find_bundles(args.model_dir)
        ids = verify_bundles(paths, expected, trust)
    except BundleError as exc:
        for problem in exc.problems:
            print(f"error: {problem}", file=sys.stderr, flush=True)
        # as `bundle verify`: 1 for problems found, 8 when only signatures were refused
        return 1 if isinstance(exc, VerificationError) else exc.exit_code
    for path, bundle_id in zip(paths, ids):
        print(f"verified {path} ({bundle_id})", file=sys.stderr, flush=True)
    cmd = serve_command(paths, args.port, env)
    execute(cmd[0], cmd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
