"""The signature file: a Sigstore bundle (v0.3 JSON) holding a DSSE envelope whose payload
is an in-toto Statement about one bundle file. Standard library only.

Why these three layers (docs/signing.md says more): DSSE signs the payload *type* with the
payload (pre-authentication encoding), so a signature over some other JSON can never pass
for ours; the in-toto Statement names the signed file by its sha256, the shape supply-chain
tools (and OpenSSF model-signing) already read; the Sigstore bundle is the container those
tools expect, with the signer's key fingerprint or certificate chain beside the envelope.

What is signed: the whole file's sha256 (which covers the header and so the bundle id,
the manifest and every member's stored bytes) and, named on its own, the bundle id. The
bundle file is never touched: the signature lives in `<bundle>.sig`, so the id keeps its
one meaning (sha256 of the manifest) and an unsigned reader sees the same bytes.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from dataclasses import dataclass
from pathlib import Path

from runtime_py.errors import SignatureFormatError, SignatureMissingError

MEDIA_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://trt-bundle/signature/v1"
SIGNATURE_SUFFIX = ".sig"
MAX_SIGNATURE_BYTES = 1 << 20  # a key hint or a few certificates: kilobytes, never more


def default_signature_path(bundle_path: str | os.PathLike) -> Path:
    """`<bundle>.sig`: beside the bundle, so copying both keeps them together."""
    bundle_path = Path(bundle_path)
    return bundle_path.with_name(bundle_path.name + SIGNATURE_SUFFIX)


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding: what the key actually signs."""
    t = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(payload), payload)


def statement(*, file_name: str, file_sha256: str, bundle_id: str, bundle_name: str,
              file_size: int, signed_at: str) -> bytes:
    """The in-toto Statement v1 for one bundle file, as the exact bytes to sign."""
    body = {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": file_name, "digest": {"sha256": file_sha256}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": {"bundle_id": bundle_id, "bundle_name": bundle_name,
                      "file_size": file_size, "signed_at": signed_at},
    }
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


@dataclass(frozen=True)
class SignedStatement:
    """What a verified payload says (only trusted after its signature verified)."""

    file_name: str
    file_sha256: str
    bundle_id: str
    bundle_name: str
    file_size: int
    signed_at: str


@dataclass(frozen=True)
class SignatureFile:
    """A parsed signature file. Nothing in it is trusted until `verify` checks it."""

    path: Path
    payload_type: str
    payload: bytes
    signature: bytes
    key_hint: str | None                 # sha256 hex of the signer's public key (DER SPKI)
    keyid: str                           # the same fingerprint, as DSSE names the key
    certificates: tuple[bytes, ...]      # DER: leaf first, then intermediates

    @property
    def signed_bytes(self) -> bytes:
        return pae(self.payload_type, self.payload)


def encode_signature_file(*, payload: bytes, signature: bytes, key_hint: str,
                          certificates: tuple[bytes, ...] = ()) -> bytes:
    """The Sigstore bundle JSON: a public-key hint, or the certificate chain (leaf first)."""
    if certificates:
        material: dict = {"x509CertificateChain": {"certificates": [
            {"rawBytes": _b64(c)} for c in certificates]}}
    else:
        material = {"publicKey": {"hint": key_hint}}
    material["tlogEntries"] = []
    doc = {
        "mediaType": MEDIA_TYPE,
        "verificationMaterial": material,
        "dsseEnvelope": {"payload": _b64(payload), "payloadType": PAYLOAD_TYPE,
                         "signatures": [{"sig": _b64(signature), "keyid": key_hint}]},
    }
    return (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()


def read_signature_file(path: str | os.PathLike) -> SignatureFile:
    """Parse a signature file, refusing anything but the one shape we write."""
    path = Path(path)
    if not path.is_file():
        raise SignatureMissingError(
            f"no signature: {path} does not exist (sign the bundle with `bundle sign BUNDLE "
            "--key KEY`, or pass --signature PATH if it lies elsewhere)")
    with path.open("rb") as f:
        raw = f.read(MAX_SIGNATURE_BYTES + 1)
    if len(raw) > MAX_SIGNATURE_BYTES:
        raise SignatureFormatError(f"{path}: larger than {MAX_SIGNATURE_BYTES} bytes: not a "
                                   "signature file")
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SignatureFormatError(f"{path}: not a signature file (not JSON: {exc})") from None

    def need(cond: bool, what: str) -> None:
        if not cond:
            raise SignatureFormatError(f"{path}: malformed signature file: {what}")

    def fields(obj: object, where: str, *names: str) -> dict:
        # Exactly these keys: a file we would not write is refused, not half-read.
        need(isinstance(obj, dict) and set(obj) == set(names),
             f"{where} must hold exactly {', '.join(names)}")
        return obj

    doc = fields(doc, "the file", "mediaType", "verificationMaterial", "dsseEnvelope")
    need(doc["mediaType"] == MEDIA_TYPE, f"mediaType is not {MEDIA_TYPE!r}")
    env = fields(doc["dsseEnvelope"], "dsseEnvelope", "payload", "payloadType", "signatures")
    need(isinstance(env["payloadType"], str), "dsseEnvelope.payloadType is not a string")
    sigs = env["signatures"]
    need(isinstance(sigs, list) and len(sigs) == 1,
         "dsseEnvelope.signatures must hold exactly one signature")
    sig = fields(sigs[0], "the signature", "keyid", "sig")
    material = doc["verificationMaterial"]
    need(isinstance(material, dict) and material.get("tlogEntries") == [],
         "verificationMaterial.tlogEntries must be [] (transparency logs are not used)")
    if "publicKey" in material:
        material = fields(material, "verificationMaterial", "publicKey", "tlogEntries")
        hint = fields(material["publicKey"], "publicKey", "hint")["hint"]
        need(_is_fingerprint(hint), "publicKey.hint is not a sha256 hex fingerprint")
        key_hint, certificates = hint, ()
    else:
        material = fields(material, "verificationMaterial", "x509CertificateChain",
                          "tlogEntries")
        certs = fields(material["x509CertificateChain"], "x509CertificateChain",
                       "certificates")["certificates"]
        need(isinstance(certs, list) and 1 <= len(certs) <= 8,
             "x509CertificateChain.certificates must list 1 to 8 certificates")
        key_hint = None
        certificates = tuple(_unb64(fields(c, "a certificate", "rawBytes")["rawBytes"],
                                    "certificate rawBytes", path) for c in certs)
    need(_is_fingerprint(sig["keyid"]), "keyid is not a sha256 hex fingerprint")
    need(key_hint is None or sig["keyid"] == key_hint, "keyid differs from publicKey.hint")
    return SignatureFile(
        path=path, payload_type=env["payloadType"],
        payload=_unb64(env["payload"], "dsseEnvelope.payload", path),
        signature=_unb64(sig["sig"], "signature", path),
        key_hint=key_hint, keyid=sig["keyid"], certificates=certificates)


def parse_statement(payload: bytes, origin: Path) -> SignedStatement:
    """The verified payload as a statement about one bundle file."""
    def need(cond: bool, what: str) -> None:
        if not cond:
            raise SignatureFormatError(f"{origin}: signed statement is malformed: {what}")

    try:
        doc = json.loads(payload)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SignatureFormatError(f"{origin}: signed payload is not JSON ({exc})") from None
    need(isinstance(doc, dict) and doc.get("_type") == STATEMENT_TYPE,
         f"_type is not {STATEMENT_TYPE!r}")
    need(doc.get("predicateType") == PREDICATE_TYPE,
         f"predicateType is {doc.get('predicateType')!r}, not {PREDICATE_TYPE!r} (a signature "
         "made by another tool for another purpose)")
    subjects = doc.get("subject")
    need(isinstance(subjects, list) and len(subjects) == 1 and isinstance(subjects[0], dict),
         "exactly one subject expected")
    subject = subjects[0]
    digest = subject.get("digest")
    need(isinstance(digest, dict) and isinstance(digest.get("sha256"), str),
         "subject has no sha256 digest")
    pred = doc.get("predicate")
    need(isinstance(pred, dict), "no predicate")
    fields = {"bundle_id": str, "bundle_name": str, "file_size": int, "signed_at": str}
    for name, kind in fields.items():
        need(isinstance(pred.get(name), kind), f"predicate.{name} missing or not a {kind.__name__}")
    return SignedStatement(file_name=str(subject.get("name", "")), file_sha256=digest["sha256"],
                           **{name: pred[name] for name in fields})


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(value: object, what: str, path: Path) -> bytes:
    if not isinstance(value, str):
        raise SignatureFormatError(f"{path}: malformed signature file: {what} missing")
    try:
        data = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        data = None
    # Canonical only: unused low bits in the last character would let two texts carry the
    # same bytes, and a changed signature file must never pass for the one that was made.
    if data is None or base64.b64encode(data).decode() != value:
        raise SignatureFormatError(f"{path}: malformed signature file: {what} is not "
                                   "canonical base64")
    return data


def _is_fingerprint(text: object) -> bool:
    return isinstance(text, str) and len(text) == 64 and all(c in "0123456789abcdef"
                                                             for c in text)
