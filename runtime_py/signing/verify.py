"""Check a bundle's detached signature against a trust policy.

Order, each step refusing with its own error class: the signature file is read and
parsed; the signer is found among the trusted keys (by fingerprint) or its certificate
chain is validated against the trusted roots; the DSSE signature is checked with that
key; only then is the payload read, and it must name this bundle's id and this file's
sha256. The bundle has already been opened (header, manifest, id) by the caller.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from runtime_py.errors import SignatureFormatError, SignatureMismatchError, UntrustedSignerError
from runtime_py.format import Bundle
from runtime_py.signing.envelope import (PAYLOAD_TYPE, default_signature_path, parse_statement,
                                         read_signature_file)
from runtime_py.signing.keys import fingerprint, scheme, signature_valid
from runtime_py.signing.trust import TrustPolicy, verify_certificate_chain

log = logging.getLogger(__name__)


def verify_bundle_signature(bundle: Bundle, policy: TrustPolicy,
                            signature_path: str | os.PathLike | None = None) -> dict:
    """Verify, or raise a SignatureError subclass; return who signed, and with what."""
    path = Path(signature_path) if signature_path is not None \
        else default_signature_path(bundle.path)
    sig = read_signature_file(path)

    if sig.certificates:
        public_key, certificate = verify_certificate_chain(policy, sig.certificates)
        signer = {"method": "certificate", "certificate": certificate,
                  "identity": certificate["san"][0] if certificate["san"]
                  else certificate["subject"]}
    else:
        trusted = policy.key_by_fingerprint(sig.key_hint)
        if trusted is None:
            raise UntrustedSignerError(
                f"{bundle.path.name} is signed by key sha256:{sig.key_hint}, which is not "
                f"trusted here ({policy.describe()}): add its public key to the trusted keys "
                "only if you trust whoever holds it")
        public_key = trusted.key
        signer = {"method": "key", "trusted_key_file": trusted.source,
                  "identity": f"sha256:{trusted.fingerprint}"}

    signer.update(key_fingerprint=f"sha256:{fingerprint(public_key)}", scheme=scheme(public_key))
    if sig.keyid != fingerprint(public_key):
        raise SignatureMismatchError(f"{path}: keyid {sig.keyid[:16]}... is not the signer's key "
                                     f"{signer['key_fingerprint']}: the signature file was altered")
    if not signature_valid(public_key, sig.signature, sig.signed_bytes):
        raise SignatureMismatchError(
            f"{path}: the signature does not verify with the signer's key "
            f"{signer['key_fingerprint']}: the signature file was altered or not made with "
            "that key")
    if sig.payload_type != PAYLOAD_TYPE:
        raise SignatureFormatError(f"{path}: signed payload type {sig.payload_type!r} is not "
                                   f"{PAYLOAD_TYPE!r}")
    stmt = parse_statement(sig.payload, path)
    if stmt.bundle_id != bundle.id:
        raise SignatureMismatchError(
            f"{path} is the signature of another bundle ({stmt.bundle_name}, id "
            f"{stmt.bundle_id[:16]}...), not of {bundle.path.name} (id {bundle.id[:16]}...)")
    actual = bundle.file_sha256()
    if stmt.file_sha256 != actual:
        raise SignatureMismatchError(
            f"{bundle.path.name}: the file's sha256 {actual[:16]}... is not the signed "
            f"{stmt.file_sha256[:16]}... (same bundle id): the file was changed after signing")
    signer.update(signature=str(path), bundle_id=stmt.bundle_id, file_sha256=actual,
                  signed_at=stmt.signed_at)
    log.info("%s: signature by %s (%s) verified", bundle.path.name, signer["identity"],
             signer["scheme"])
    return signer
