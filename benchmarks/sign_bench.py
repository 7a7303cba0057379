"""Cost of signing and of checking a signature, against hashing the file (target <= 1.2).

    sign      = `bundler.sign.sign_bundle(path, key)`: the whole `bundle sign` minus the CLI:
                load and check the key file, open the bundle (header, manifest, id), sha256
                of the whole file, ECDSA P-256 over the statement, atomic write of .sig.
    check     = `runtime_py.signing.check_trust(bundle, trust folder)` on an opened bundle:
                load the trust folder, parse .sig, verify ECDSA, sha256 of the whole file.
    baseline  = hashlib.file_digest(open(path), "sha256"): the sha256 of the file, nothing
                else (what a signature over the file's digest cannot avoid).
    Boundaries: a 100 MB bundle (one incompressible member: the file is as large as asked) already
    on disk and in the page cache (a warm-up pass reads it); one thread; the sides run in one
    loop, order rotated each repeat so that load from other processes hits all of them; the
    median over repeats is reported.

    python benchmarks/sign_bench.py [--mb 100] [--repeats 9] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import tempfile
import time
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

import numpy as np
from format_bench import MB, body

from bundler.sign import sign_bundle
from bundler.writer import write_bundle
from runtime_py.format import open_bundle
from runtime_py.signing import check_trust


def file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        tmp = Path(tmp)
        path, _ = write_bundle(tmp / "bench-fp32-1-onnxruntime.bundle",
                               body("bench-fp32-1-onnxruntime"),
                               {"model.onnx": np.random.default_rng(0).bytes(args.mb * MB)})
        key = ec.generate_private_key(ec.SECP256R1())
        priv = tmp / "release.key"
        priv.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
        os.chmod(priv, 0o600)
        trust = tmp / "trusted"
        trust.mkdir()
        (trust / "release.pub").write_bytes(key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))

        times: dict[str, list[float]] = {"baseline": [], "sign": [], "check": []}

        def baseline():
            file_sha256(path)

        def sign():
            sign_bundle(path, priv)

        def check():
            with open_bundle(path) as bundle:
                check_trust(bundle, trust)

        steps = {"baseline": baseline, "sign": sign, "check": check}
        for fn in steps.values():                               # warm-up (page cache, imports)
            fn()
        order = list(steps)
        for i in range(args.repeats):
            for name in order[i % 3:] + order[:i % 3]:
                t0 = time.perf_counter()
                steps[name]()
                times[name].append(time.perf_counter() - t0)

        med = {k: statistics.median(v) for k, v in times.items()}
        size = path.stat().st_size
        print(f"bundle {size / MB:.1f} MB, {args.repeats} repeats, medians:")
        print(f"  sha256 of the file     {med['baseline'] * 1e3:8.1f} ms")
        print(f"  sign_bundle            {med['sign'] * 1e3:8.1f} ms")
        print(f"  check_trust (verify)   {med['check'] * 1e3:8.1f} ms")
        print(f"sign / sha256 ratio:   {med['sign'] / med['baseline']:.3f}  (target <= 1.2)")
        print(f"verify / sha256 ratio: {med['check'] / med['baseline']:.3f}  (informative)")


if __name__ == "__main__":
    main()
