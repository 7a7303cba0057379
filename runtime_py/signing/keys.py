"""Key and certificate files: loading with checks that say what to do, fingerprints, and the
one signature scheme per key type. Imports `cryptography` (the `sign` extra): import this
module only when signing or when trust is configured.

Key types: EC P-256 / P-384 / P-521 (ECDSA with SHA-256 / SHA-384 / SHA-512, as Sigstore
and model-signing use them) and Ed25519. RSA and others are refused with the reason, so a
trust folder never silently accepts a scheme nobody reviewed.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from runtime_py.errors import KeyFileError

PASSWORD_ENV = "TRT_BUNDLE_KEY_PASSWORD"
_CURVE_HASH = {"secp256r1": hashes.SHA256, "secp384r1": hashes.SHA384,
               "secp521r1": hashes.SHA512}
_PEM_BLOCK = re.compile(rb"-----BEGIN ([A-Z0-9 ]+)-----\r?\n.*?-----END \1-----", re.S)
_MAX_KEY_FILE = 1 << 20


def fingerprint(public_key) -> str:
    """sha256 (hex) of the DER SubjectPublicKeyInfo: `openssl pkey -pubin -outform DER |
    sha256sum` gives the same, so a key is recognisable outside this tool."""
    der = public_key.public_bytes(serialization.Encoding.DER,
                                  serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(der).hexdigest()


def scheme(public_key) -> str:
    """The signature scheme of a supported key, e.g. `ecdsa-p256-sha256`; refuses others."""
    if isinstance(public_key, ed25519.Ed25519PublicKey):
        return "ed25519"
    if isinstance(public_key, ec.EllipticCurvePublicKey) and public_key.curve.name in _CURVE_HASH:
        bits = public_key.curve.key_size
        return f"ecdsa-p{bits}-{_CURVE_HASH[public_key.curve.name].name}"
    kind = type(public_key).__name__.replace("PublicKey", "").replace("_", "")
    curve = getattr(getattr(public_key, "curve", None), "name", "")
    raise KeyFileError(f"unsupported key type {kind} {curve}".rstrip()
                       + ": use an EC P-256/P-384/P-521 or an Ed25519 key (e.g. `openssl "
                       "genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out key.pem`)")


def sign_bytes(private_key, data: bytes) -> bytes:
    if isinstance(private_key, ed25519.Ed25519PrivateKey):
        return private_key.sign(data)
    return private_key.sign(data, ec.ECDSA(_CURVE_HASH[private_key.curve.name]()))


def signature_valid(public_key, signature: bytes, data: bytes) -> bool:
    try:
        if isinstance(public_key, ed25519.Ed25519PublicKey):
            public_key.verify(signature, data)
        else:
            public_key.verify(signature, data, ec.ECDSA(_CURVE_HASH[public_key.curve.name]()))
    except InvalidSignature:
        return False
    return True


def read_key_file(path: Path, what: str) -> bytes:
    """A key/certificate/CRL file's bytes, refusing what cannot be one (missing, a folder,
    over 1 MiB) with a message naming it."""
    if not path.exists():
        raise KeyFileError(f"{what} {path}: no such file")
    if not path.is_file():
        raise KeyFileError(f"{what} {path}: not a regular file")
    if path.stat().st_size > _MAX_KEY_FILE:
        raise KeyFileError(f"{what} {path}: larger than 1 MiB: not a key file")
    return path.read_bytes()


def pem_blocks(path: Path, data: bytes) -> list[tuple[str, bytes]]:
    """(type, block bytes) of every PEM block; refuses a file with none."""
    blocks = [(m.group(1).decode(), m.group(0)) for m in _PEM_BLOCK.finditer(data)]
    if not blocks:
        raise KeyFileError(f"{path}: not a PEM file (expected '-----BEGIN PUBLIC KEY-----', "
                           "'-----BEGIN CERTIFICATE-----' or '-----BEGIN X509 CRL-----'; convert "
                           "DER with `openssl pkey -pubin -inform DER -outform PEM`)")
    return blocks


def check_private_key_permissions(path: Path) -> None:
    """Refuse a private key that others can read or write: it may already be leaked, and a
    CI job that signs must keep its key to itself (ssh refuses such keys for the same reason)."""
    if os.name != "posix":
        return
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise KeyFileError(f"private key {path} is accessible by group or others (mode "
                           f"{mode:04o}): run `chmod 600 {path}`, and treat the key as leaked if "
                           "others could read it")


def load_private_key(path: str | os.PathLike):
    """A supported private key from a PEM file (PKCS#8, SEC1 or OpenSSH), permission-checked.
    An encrypted key takes its password from $TRT_BUNDLE_KEY_PASSWORD."""
    path = Path(path)
    data = read_key_file(path, "private key")
    check_private_key_permissions(path)
    if b"PUBLIC KEY-----" in data and b"PRIVATE KEY-----" not in data:
        raise KeyFileError(f"{path} is a public key: signing needs the private key (verifying "
                           "takes the public one, with --key PUB or --trusted-keys DIR)")
    if b"CERTIFICATE-----" in data and b"PRIVATE KEY-----" not in data:
        raise KeyFileError(f"{path} is a certificate: pass the private key with --key and the "
                           "certificate with --certificate")
    password = os.environ.get(PASSWORD_ENV)
    password_bytes = password.encode() if password is not None else None
    try:
        if b"-----BEGIN OPENSSH PRIVATE KEY-----" in data:
            key = serialization.load_ssh_private_key(data, password_bytes)
        else:
            key = serialization.load_pem_private_key(data, password_bytes)
    except TypeError as exc:  # encrypted without a password, or a password it does not need
        if password is None:
            raise KeyFileError(f"private key {path} is encrypted: set ${PASSWORD_ENV} to its "
                               "password") from None
        raise KeyFileError(f"private key {path}: {exc}") from None
    except (ValueError, UnsupportedAlgorithm) as exc:
        hint = ("wrong password in $" + PASSWORD_ENV) if password is not None and \
            b"ENCRYPTED" in data else "not a PEM private key"
        raise KeyFileError(f"private key {path}: cannot be read ({hint}; {exc})") from None
    scheme(key.public_key())
    return key


def load_public_key_block(path: Path, block: bytes):
    try:
        key = serialization.load_pem_public_key(block)
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise KeyFileError(f"{path}: public key cannot be read ({exc})") from None
    try:
        scheme(key)
    except KeyFileError as exc:
        raise KeyFileError(f"{path}: {exc}") from None
    return key


def load_certificates(path: str | os.PathLike, what: str = "certificate") -> list[x509.Certificate]:
    """Every certificate of a PEM file; refuses a file with anything else in it."""
    path = Path(path)
    blocks = pem_blocks(path, read_key_file(path, what))
    others = sorted({kind for kind, _ in blocks if kind != "CERTIFICATE"})
    if others:
        raise KeyFileError(f"{what} {path}: holds {', '.join(others)}, expected certificates only")
    try:
        return [x509.load_pem_x509_certificate(block) for _, block in blocks]
    except ValueError as exc:
        raise KeyFileError(f"{what} {path}: certificate cannot be read ({exc})") from None
