"""Who is trusted to sign bundles: public keys, CA certificates and revocation lists.

A trust folder (`--trusted-keys DIR`, `load(..., trusted_keys=DIR)`) holds PEM files
(`*.pem`, `*.pub`, `*.crt`, `*.crl`; other files are ignored): each `PUBLIC KEY` is a
trusted signer, each `CERTIFICATE` a trusted root for certificate signatures, each
`X509 CRL` a revocation list. A private key there is refused: a trust folder is copied to
every service, and a signing key must never travel with it.

Certificates are checked at verification time, not at signing time: without a trusted
timestamp the signing time is only the signer's word, so a signature by a certificate
that has since expired or been revoked is refused (re-sign with a current certificate).
"""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.x509 import verification
from cryptography.x509.oid import ExtendedKeyUsageOID

from runtime_py.errors import KeyFileError, UntrustedSignerError
from runtime_py.signing.keys import (fingerprint, load_certificates, load_public_key_block,
                                     pem_blocks, read_key_file, scheme)

TRUST_SUFFIXES = (".pem", ".pub", ".crt", ".crl")
MAX_CHAIN_DEPTH = 8


@dataclass(frozen=True)
class TrustedKey:
    fingerprint: str
    key: object
    source: str


@dataclass(frozen=True)
class TrustPolicy:
    """Trusted keys (by fingerprint), trusted CA roots and the CRLs to honour."""

    keys: tuple[TrustedKey, ...] = ()
    roots: tuple[x509.Certificate, ...] = ()
    crls: tuple[x509.CertificateRevocationList, ...] = field(default=())

    def key_by_fingerprint(self, fp: str) -> TrustedKey | None:
        return next((k for k in self.keys if k.fingerprint == fp), None)

    def describe(self) -> str:
        parts = [f"{len(self.keys)} trusted key(s)"]
        if self.roots:
            parts.append(f"{len(self.roots)} trusted root certificate(s)")
        return ", ".join(parts)


def as_trust_policy(trusted_keys) -> TrustPolicy:
    """What `load(trusted_keys=...)` accepts: a TrustPolicy, or a folder / PEM file path, or
    a list of those paths."""
    if isinstance(trusted_keys, TrustPolicy):
        return trusted_keys
    if isinstance(trusted_keys, (str, os.PathLike)):
        return load_trust([trusted_keys])
    return load_trust(list(trusted_keys))


def load_trust(paths: Iterable[str | os.PathLike] = (),
               certificate_chains: Iterable[str | os.PathLike] = (),
               crls: Iterable[str | os.PathLike] = ()) -> TrustPolicy:
    """Read trust folders / key files, CA certificate files and CRL files into one policy.

    Refuses an empty result: asking for trust and trusting nobody is a configuration error
    (it would refuse every bundle, which a service should learn at start, not per request).
    """
    keys: dict[str, TrustedKey] = {}
    roots: list[x509.Certificate] = []
    revocations: list[x509.CertificateRevocationList] = []
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            files += sorted(f for f in p.iterdir()
                            if f.is_file() and f.suffix in TRUST_SUFFIXES
                            and not f.name.startswith("."))
        elif p.exists():
            files.append(p)
        else:
            raise KeyFileError(f"trusted keys {p}: no such file or folder")
    for f in files:
        for kind, block in pem_blocks(f, read_key_file(f, "trust file")):
            if kind == "PUBLIC KEY":
                key = load_public_key_block(f, block)
                fp = fingerprint(key)
                keys.setdefault(fp, TrustedKey(fp, key, str(f)))
            elif kind == "CERTIFICATE":
                roots.append(_load(x509.load_pem_x509_certificate, f, block, "certificate"))
            elif kind == "X509 CRL":
                revocations.append(_load(x509.load_pem_x509_crl, f, block, "CRL"))
            elif "PRIVATE KEY" in kind:
                raise KeyFileError(f"{f} holds a private key: trust takes public keys and CA "
                                   "certificates only; remove it from there (and treat the key as "
                                   "leaked if others can read that folder)")
            else:
                raise KeyFileError(f"{f}: unexpected PEM block {kind!r} (expected PUBLIC KEY, "
                                   "CERTIFICATE or X509 CRL)")
    for chain in certificate_chains:
        roots += load_certificates(chain, "certificate chain")
    for crl in map(Path, crls):
        blocks = pem_blocks(crl, read_key_file(crl, "CRL"))
        others = sorted({k for k, _ in blocks if k != "X509 CRL"})
        if others:
            raise KeyFileError(f"CRL {crl}: holds {', '.join(others)}, expected X509 CRL only")
        revocations += [_load(x509.load_pem_x509_crl, crl, b, "CRL") for _, b in blocks]
    if not keys and not roots:
        where = ", ".join(str(p) for p in [*paths, *certificate_chains]) or "(nothing given)"
        raise KeyFileError(f"no trusted public keys or certificates found in {where}: put PEM "
                           f"public keys ({', '.join(TRUST_SUFFIXES)}) there")
    return TrustPolicy(tuple(keys.values()), tuple(roots), tuple(revocations))


def _load(loader, path: Path, block: bytes, what: str):
    try:
        return loader(block)
    except ValueError as exc:
        raise KeyFileError(f"{path}: {what} cannot be read ({exc})") from None


def verify_certificate_chain(policy: TrustPolicy, chain: tuple[bytes, ...],
                             now: dt.datetime | None = None) -> tuple[object, dict]:
    """Validate the signer's chain (leaf first, DER) against the trusted roots at `now`;
    return the leaf's public key and a description of who it names."""
    if not policy.roots:
        raise UntrustedSignerError("the bundle is signed with a certificate, but no trusted root "
                                   "certificates are configured (--certificate-chain FILE, or CA "
                                   "certificates in the trusted-keys folder)")
    try:
        certs = [x509.load_der_x509_certificate(c) for c in chain]
    except ValueError as exc:
        raise UntrustedSignerError(f"the signature's certificate cannot be read ({exc})") from None
    leaf, intermediates = certs[0], certs[1:]
    now = now or dt.datetime.now(dt.timezone.utc)
    who = describe_certificate(leaf)
    if now > leaf.not_valid_after_utc:
        raise UntrustedSignerError(f"signing certificate {who['subject']} expired on "
                                   f"{leaf.not_valid_after_utc:%Y-%m-%d %H:%M} UTC: re-sign the "
                                   "bundle with a current certificate")
    if now < leaf.not_valid_before_utc:
        raise UntrustedSignerError(f"signing certificate {who['subject']} is not valid before "
                                   f"{leaf.not_valid_before_utc:%Y-%m-%d %H:%M} UTC")
    verifier = (verification.PolicyBuilder()
                .store(verification.Store(list(policy.roots)))
                .time(now)
                .max_chain_depth(MAX_CHAIN_DEPTH)
                .extension_policies(ca_policy=verification.ExtensionPolicy.webpki_defaults_ca(),
                                    ee_policy=verification.ExtensionPolicy.permit_all())
                .build_client_verifier())
    try:
        verified = verifier.verify(leaf, intermediates)
    except verification.VerificationError as exc:
        raise UntrustedSignerError(f"signing certificate {who['subject']} does not chain to a "
                                   f"trusted root ({exc})") from None
    _check_signing_usage(leaf, who)
    _check_revocation(policy, verified.chain)
    scheme(leaf.public_key())
    return leaf.public_key(), who


def describe_certificate(cert: x509.Certificate) -> dict:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        names = [str(v) for v in san.get_values_for_type(x509.RFC822Name)
                 + san.get_values_for_type(x509.UniformResourceIdentifier)
                 + san.get_values_for_type(x509.DNSName)]
    except x509.ExtensionNotFound:
        names = []
    return {"subject": cert.subject.rfc4514_string(), "issuer": cert.issuer.rfc4514_string(),
            "san": names, "serial": format(cert.serial_number, "x"),
            "not_after": cert.not_valid_after_utc.isoformat(),
            "sha256": cert.fingerprint(hashes.SHA256()).hex()}


def _check_signing_usage(leaf: x509.Certificate, who: dict) -> None:
    """A leaf that states its usage must allow signing (digitalSignature / codeSigning)."""
    try:
        usage = leaf.extensions.get_extension_for_class(x509.KeyUsage).value
        if not usage.digital_signature:
            raise UntrustedSignerError(f"certificate {who['subject']} is not for signatures "
                                       "(its key usage lacks digitalSignature)")
    except x509.ExtensionNotFound:
        pass
    try:
        eku = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        if ExtendedKeyUsageOID.CODE_SIGNING not in eku and \
                ExtendedKeyUsageOID.ANY_EXTENDED_KEY_USAGE not in eku:
            raise UntrustedSignerError(f"certificate {who['subject']} is not for code signing "
                                       "(its extended key usage lacks codeSigning)")
    except x509.ExtensionNotFound:
        pass


def _check_revocation(policy: TrustPolicy, chain: list[x509.Certificate]) -> None:
    """Every certificate of the chain below the root against the CRLs its issuer signed
    (a CRL not signed by that issuer is not evidence either way, and is skipped)."""
    for cert, issuer in zip(chain, chain[1:]):
        for crl in policy.crls:
            if crl.issuer != cert.issuer or not crl.is_signature_valid(issuer.public_key()):
                continue
            revoked = crl.get_revoked_certificate_by_serial_number(cert.serial_number)
            if revoked is not None:
                raise UntrustedSignerError(
                    f"certificate {cert.subject.rfc4514_string()} (serial "
                    f"{cert.serial_number:x}) was revoked on "
                    f"{revoked.revocation_date_utc:%Y-%m-%d} by {crl.issuer.rfc4514_string()}")
