"""`bundle sign`: write a detached signature beside a bundle.

One pass over the file (its sha256), one signature over a small statement, one atomic
write: signing costs what hashing the file costs. The bundle is opened first (header,
manifest against the id) so that the statement can name the id; member hashes are not
re-checked here (that is `bundle verify`, which the CI recipe runs before signing).

The key is loaded (and its file checked) by `BundleSigner.from_files`, separately from
signing, so that `bundle make --sign-key` refuses a bad key before a build of minutes.
"""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass
from pathlib import Path

from runtime_py.errors import KeyFileError
from runtime_py.format import open_bundle
from runtime_py.signing.envelope import default_signature_path, encode_signature_file, pae, \
    statement, PAYLOAD_TYPE
from runtime_py.signing.keys import (fingerprint, load_certificates, load_private_key, scheme,
                                     sign_bytes)


@dataclass(frozen=True)
class BundleSigner:
    """A loaded private key, with the certificate chain (leaf first) when signing by
    certificate."""

    private_key: object
    certificates: tuple = ()

    @classmethod
    def from_files(cls, key: str | os.PathLike, certificate: str | os.PathLike | None = None,
                   chain: tuple[str | os.PathLike, ...] = ()) -> "BundleSigner":
        private_key = load_private_key(key)
        certs: list = []
        if certificate is not None:
            certs = load_certificates(certificate)
            if fingerprint(certs[0].public_key()) != fingerprint(private_key.public_key()):
                raise KeyFileError(f"certificate {certificate} is not the certificate of key "
                                   f"{key} (their public keys differ)")
            for c in chain:
                certs += load_certificates(c, "certificate chain")
        elif chain:
            raise KeyFileError("a certificate chain needs the signing certificate too "
                               "(--certificate CERT)")
        return cls(private_key, tuple(certs))

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.private_key.public_key())

    def sign_bundle(self, bundle_path: str | os.PathLike,
                    signature_path: str | os.PathLike | None = None) -> dict:
        """Sign one bundle file; return where the signature went and what it says."""
        from cryptography.hazmat.primitives import serialization

        from bundler.writer import atomic_write

        bundle_path = Path(bundle_path)
        out = Path(signature_path) if signature_path else default_signature_path(bundle_path)
        with open_bundle(bundle_path) as bundle:
            file_sha256 = bundle.file_sha256()
            size = bundle.path.stat().st_size
            payload = statement(file_name=bundle_path.name, file_sha256=file_sha256,
                                bundle_id=bundle.id, bundle_name=bundle.manifest["name"],
                                file_size=size, signed_at=_now())
            bundle_id = bundle.id
        signature = sign_bytes(self.private_key, pae(PAYLOAD_TYPE, payload))
        der = tuple(c.public_bytes(serialization.Encoding.DER) for c in self.certificates)
        atomic_write(out, [encode_signature_file(payload=payload, signature=signature,
                                                 key_hint=self.fingerprint, certificates=der)])
        result = {"bundle": str(bundle_path), "signature": str(out), "bundle_id": bundle_id,
                  "file_sha256": file_sha256, "key_fingerprint": f"sha256:{self.fingerprint}",
                  "scheme": scheme(self.private_key.public_key()),
                  "method": "certificate" if der else "key"}
        if self.certificates:
            result["certificate"] = self.certificates[0].subject.rfc4514_string()
        return result


def sign_bundle(bundle_path: str | os.PathLike, key: str | os.PathLike, *,
                certificate: str | os.PathLike | None = None,
                chain: tuple[str | os.PathLike, ...] = (),
                signature_path: str | os.PathLike | None = None) -> dict:
    """Sign `bundle_path` with the private key file `key` (see `BundleSigner`)."""
    return BundleSigner.from_files(key, certificate, chain).sign_bundle(bundle_path,
                                                                       signature_path)


def _now() -> str:
    """When the signature was made, as the signer's clock says (informative: nothing
    trusts it; certificates are checked at verification time)."""
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat()
