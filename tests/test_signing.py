"""Signed bundles: `bundle sign`, `bundle verify --key/--trusted-keys/--certificate-chain`,
`runtime_py.load(trusted_keys=...)`, `bundle serve --trusted-keys`, `bundle make --sign-key`.

Keys and certificates are generated here with `cryptography`, in each test's own tmp
folder; the bundles are the tiny synthetic ones (a few KiB)."""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

pytest.importorskip("cryptography", reason="signing needs the `sign` extra (cryptography)")

from cryptography import x509  # noqa: E402
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa  # noqa: E402
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID  # noqa: E402

import runtime_py  # noqa: E402
from bundler.cli import cli  # noqa: E402
from bundler.sign import sign_bundle  # noqa: E402
from runtime_py.errors import (BundleError, CompatibilityError, KeyFileError,  # noqa: E402
                               SignatureError, SignatureFormatError, SignatureMismatchError,
                               SignatureMissingError, UntrustedSignerError)
from synthetic_bundles import tensorrt_engine, write_source_bundle  # noqa: E402

NOW = dt.datetime.now(dt.timezone.utc)
DAY = dt.timedelta(days=1)


# --- keys, certificates, bundles ------------------------------------------------------------

def new_key(kind: str = "p256"):
    if kind == "ed25519":
        return ed25519.Ed25519PrivateKey.generate()
    if kind == "rsa":
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return ec.generate_private_key({"p256": ec.SECP256R1(), "p384": ec.SECP384R1()}[kind])


def write_private(path: Path, key, mode: int = 0o600, password: bytes | None = None) -> Path:
    enc = (serialization.BestAvailableEncryption(password) if password
           else serialization.NoEncryption())
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8, enc))
    os.chmod(path, mode)
    return path


def write_public(path: Path, key) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return path


def fingerprint_of(key) -> str:
    import hashlib

    return hashlib.sha256(key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)).hexdigest()


def name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def make_ca(cn: str = "trt-bundle test CA"):
    key = new_key()
    cert = (x509.CertificateBuilder().subject_name(name(cn)).issuer_name(name(cn))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(NOW - 30 * DAY).not_valid_after(NOW + 365 * DAY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False,
                                         False), critical=True)
            .sign(key, hashes.SHA256()))
    return key, cert


def make_leaf(ca_key, ca_cert, key, *, not_before=None, not_after=None,
              email="release-job@example.com"):
    return (x509.CertificateBuilder().subject_name(name("release job"))
            .issuer_name(ca_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before or NOW - DAY).not_valid_after(not_after or NOW + 30 * DAY)
            .add_extension(x509.SubjectAlternativeName([x509.RFC822Name(email)]), critical=False)
            .add_extension(x509.KeyUsage(True, False, False, False, False, False, False, False,
                                         False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CODE_SIGNING]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))


def write_cert(path: Path, *certs) -> Path:
    path.write_bytes(b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certs))
    return path


@pytest.fixture(scope="module")
def bundles(tmp_path_factory) -> dict[str, Path]:
    """Two different sound tiny bundles (different names, so different ids)."""
    d = tmp_path_factory.mktemp("signing_bundles")
    return {"a": write_source_bundle(d / "a", name="tiny-fp32-1-onnxruntime"),
            "b": write_source_bundle(d / "b", name="other-fp32-1-onnxruntime")}


@pytest.fixture
def signed(tmp_path, bundles):
    """A copy of bundle A signed with a fresh P-256 key; the trust folder holds its key."""
    path = tmp_path / bundles["a"].name
    shutil.copyfile(bundles["a"], path)
    key = new_key()
    priv = write_private(tmp_path / "release.key", key)
    trust = tmp_path / "trusted"
    write_public(trust / "release.pub", key)
    sign_bundle(path, priv)
    return {"path": path, "key": key, "priv": priv, "trust": trust,
            "sig": path.with_name(path.name + ".sig")}


def run(*args: str):
    result = CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=True)
    combined = result.output + (result.stderr or "")
    assert "Traceback" not in combined
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        repr(result.exception)
    return result


# --- round trip ----------------------------------------------------------------------------

def test_sign_verify_round_trip_cli(tmp_path, bundles):
    path = tmp_path / bundles["a"].name
    shutil.copyfile(bundles["a"], path)
    before = path.read_bytes()
    key = new_key()
    priv = write_private(tmp_path / "k.pem", key)
    pub = write_public(tmp_path / "k.pub", key)

    r = run("sign", path, "--key", priv)
    assert r.exit_code == 0, r.output
    sig = path.with_name(path.name + ".sig")
    assert r.stdout.strip() == str(sig) and sig.is_file()
    assert path.read_bytes() == before  # detached: the bundle's bytes (and id) are unchanged

    r = run("verify", path, "--key", pub, "--json")
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    with runtime_py.open_bundle(path) as b:
        bundle_id = b.id
    s = report["signature"]
    assert s["method"] == "key" and s["scheme"] == "ecdsa-p256-sha256"
    assert s["key_fingerprint"] == f"sha256:{fingerprint_of(key)}" == s["identity"]
    assert s["bundle_id"] == report["id"] == bundle_id
    assert s["trusted_key_file"] == str(pub)
    assert "signed by: sha256:" in run("verify", path, "--key", pub).stdout


@pytest.mark.parametrize("kind,scheme", [("p384", "ecdsa-p384-sha384"), ("ed25519", "ed25519")])
def test_other_key_types_round_trip(tmp_path, bundles, kind, scheme):
    path = tmp_path / bundles["a"].name
    shutil.copyfile(bundles["a"], path)
    key = new_key(kind)
    result = sign_bundle(path, write_private(tmp_path / "k.pem", key))
    assert result["scheme"] == scheme
    with runtime_py.load(path, trusted_keys=write_public(tmp_path / "t" / "k.pem", key)) as m:
        assert m.infer(__import__("numpy").zeros((1, 3, 8, 8), "float32"))["logits"].shape == (1, 4)


def test_signature_file_is_a_sigstore_bundle_with_an_in_toto_statement(signed):
    doc = json.loads(signed["sig"].read_text())
    assert doc["mediaType"] == "application/vnd.dev.sigstore.bundle.v0.3+json"
    env = doc["dsseEnvelope"]
    assert env["payloadType"] == "application/vnd.in-toto+json"
    stmt = json.loads(base64.b64decode(env["payload"]))
    import hashlib

    assert stmt["_type"] == "https://in-toto.io/Statement/v1"
    assert stmt["subject"][0]["digest"]["sha256"] == \
        hashlib.sha256(signed["path"].read_bytes()).hexdigest()
    with runtime_py.open_bundle(signed["path"]) as b:
        assert stmt["predicate"]["bundle_id"] == b.id
    # the DSSE signature is over PAE(type, payload), checkable with cryptography alone
    payload = base64.b64decode(env["payload"])
    pae = b"DSSEv1 %d %s %d %s" % (len(env["payloadType"]), env["payloadType"].encode(),
                                   len(payload), payload)
    signed["key"].public_key().verify(base64.b64decode(env["signatures"][0]["sig"]), pae,
                                      ec.ECDSA(hashes.SHA256()))


def test_load_with_trust_folder(signed):
    with runtime_py.load(signed["path"], trusted_keys=signed["trust"]) as model:
        assert model.id
    # without trust configured, today's behaviour: an unsigned copy loads
    unsigned = signed["path"].with_name("unsigned.bundle")
    shutil.copyfile(signed["path"], unsigned)
    runtime_py.load(unsigned).close()


# --- tampering -----------------------------------------------------------------------------

def _flipped(src: Path, dst: Path, offset: int, mask: int = 0xFF) -> Path:
    data = bytearray(src.read_bytes())
    data[offset] ^= mask
    dst.write_bytes(bytes(data))
    return dst


def test_flipped_byte_anywhere_in_the_bundle_is_rejected(signed, tmp_path):
    src, size = signed["path"], signed["path"].stat().st_size
    offsets = sorted({0, 12, 40, 63, 64, size - 1, *range(0, size, max(1, size // 60))})
    for offset in offsets:
        bad = _flipped(src, tmp_path / "bad.bundle", offset)
        shutil.copyfile(signed["sig"], tmp_path / "bad.bundle.sig")
        with pytest.raises(BundleError):
            runtime_py.load(bad, trusted_keys=signed["trust"]).close()
        # The signature alone covers every byte, even with the integrity pass skipped.
        try:
            runtime_py.load(bad, trusted_keys=signed["trust"], verify=False).close()
        except BundleError as exc:
            assert not isinstance(exc, CompatibilityError), (offset, exc)
        else:
            pytest.fail(f"flipped byte at offset {offset} was loaded")


def test_flip_inside_a_member_is_caught_by_the_signature_as_a_changed_file(signed, tmp_path):
    with runtime_py.open_bundle(signed["path"]) as b:
        entry = b.member_entry("labels.msgpack")
    bad = _flipped(signed["path"], tmp_path / "bad.bundle", entry["offset"] + entry["stored_size"] // 2)
    shutil.copyfile(signed["sig"], tmp_path / "bad.bundle.sig")
    with pytest.raises(SignatureMismatchError, match="changed after signing"):
        runtime_py.load(bad, trusted_keys=signed["trust"], verify=False)
    r = run("verify", bad, "--trusted-keys", signed["trust"])
    assert r.exit_code == 1  # integrity problems first: "verify found problems"
    assert "signature:" in r.stderr and "sha256 mismatch" in r.stderr


def test_flipped_bit_anywhere_in_the_signature_is_rejected(signed, tmp_path):
    good = signed["sig"].read_bytes()
    target = signed["path"]
    for offset in range(len(good)):
        for mask in (0x01, 0x80):
            data = bytearray(good)
            data[offset] ^= mask
            signed["sig"].write_bytes(bytes(data))
            with pytest.raises(SignatureError):
                runtime_py.load(target, trusted_keys=signed["trust"], verify=False)
    signed["sig"].write_bytes(good)
    runtime_py.load(target, trusted_keys=signed["trust"]).close()


def test_signature_of_bundle_a_does_not_verify_bundle_b(signed, bundles, tmp_path):
    b = tmp_path / "b.bundle"
    shutil.copyfile(bundles["b"], b)
    shutil.copyfile(signed["sig"], tmp_path / "b.bundle.sig")
    with pytest.raises(SignatureMismatchError, match="signature of another bundle"):
        runtime_py.load(b, trusted_keys=signed["trust"])
    r = run("verify", b, "--trusted-keys", signed["trust"])
    assert r.exit_code == 8 and "another bundle" in r.stderr


# --- who is trusted ------------------------------------------------------------------------

def test_wrong_key_is_refused(signed, tmp_path):
    other = write_public(tmp_path / "other.pub", new_key())
    with pytest.raises(UntrustedSignerError, match=fingerprint_of(signed["key"])):
        runtime_py.load(signed["path"], trusted_keys=other)
    r = run("verify", signed["path"], "--key", other, "--json")
    assert r.exit_code == 8
    report = json.loads(r.stdout)
    assert report["ok"] is False and "not trusted here" in report["problems"][0]


def test_unknown_key_among_several_trusted_is_refused(signed, tmp_path):
    trust = tmp_path / "others"
    for i in range(3):
        write_public(trust / f"k{i}.pub", new_key())
    (trust / "README.txt").write_text("ignored: not a trust file suffix")
    with pytest.raises(UntrustedSignerError, match=r"3 trusted key\(s\)"):
        runtime_py.load(signed["path"], trusted_keys=trust)
    # adding the signer's key to the folder makes it load
    write_public(trust / "release.pub", signed["key"])
    runtime_py.load(signed["path"], trusted_keys=trust).close()


def test_signature_claiming_a_trusted_key_but_made_by_another_is_refused(signed, tmp_path):
    forger = new_key()
    sign_bundle(signed["path"], write_private(tmp_path / "forger.pem", forger))
    doc = json.loads(signed["sig"].read_text())
    trusted_fp = fingerprint_of(signed["key"])
    doc["verificationMaterial"]["publicKey"]["hint"] = trusted_fp
    doc["dsseEnvelope"]["signatures"][0]["keyid"] = trusted_fp
    signed["sig"].write_text(json.dumps(doc))
    with pytest.raises(SignatureMismatchError, match="does not verify"):
        runtime_py.load(signed["path"], trusted_keys=signed["trust"])


def test_missing_signature_when_required(signed, tmp_path):
    signed["sig"].unlink()
    with pytest.raises(SignatureMissingError, match="bundle sign"):
        runtime_py.load(signed["path"], trusted_keys=signed["trust"])
    r = run("verify", signed["path"], "--trusted-keys", signed["trust"])
    assert r.exit_code == 8 and "no signature" in r.stderr
    assert run("verify", signed["path"]).exit_code == 0  # no trust asked: integrity only


@pytest.mark.skipif(__import__("importlib").util.find_spec("tensorrt") is not None,
                    reason="TensorRT is installed: the tensorrt bundle's activation could get "
                           "further than a CompatibilityError here")
def test_refused_before_any_engine_is_activated(tmp_path):
    """A TensorRT bundle on this host: asking for that backend fails at activation
    (CompatibilityError); with trust configured and no signature, the signature error comes
    first, so no engine was touched."""
    path = write_source_bundle(tmp_path, engine=tensorrt_engine(), engine_member=b"opaque",
                               name="tiny-fp32-1-tensorrt")
    trust = write_public(tmp_path / "trust" / "k.pub", new_key())
    with pytest.raises(CompatibilityError):
        runtime_py.load(path, backend="tensorrt")
    with pytest.raises(SignatureMissingError):
        runtime_py.load(path, backend="tensorrt", trusted_keys=trust)


MALFORMED = {
    "empty": b"",
    "not json": b"\x89PNG not a signature",
    "json array": b"[]",
    "no envelope": json.dumps({"mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json",
                               "verificationMaterial": {"publicKey": {"hint": "0" * 64},
                                                        "tlogEntries": []}}).encode(),
    "huge": b" " * ((1 << 20) + 1),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_signature_files(signed, case):
    signed["sig"].write_bytes(MALFORMED[case])
    with pytest.raises(SignatureFormatError):
        runtime_py.load(signed["path"], trusted_keys=signed["trust"])
    r = run("verify", signed["path"], "--trusted-keys", signed["trust"])
    assert r.exit_code == 8 and "signature" in r.stderr


def test_malformed_signature_variants(signed):
    good = json.loads(signed["sig"].read_text())

    def with_(mutate):
        doc = json.loads(json.dumps(good))
        mutate(doc)
        signed["sig"].write_text(json.dumps(doc))
        with pytest.raises(SignatureFormatError) as info:
            runtime_py.load(signed["path"], trusted_keys=signed["trust"])
        return str(info.value)

    env = "dsseEnvelope"
    assert "exactly one signature" in with_(lambda d: d[env]["signatures"].append(
        d[env]["signatures"][0]))
    assert "base64" in with_(lambda d: d[env].update(payload="***"))
    assert "exactly" in with_(lambda d: d.update(extra=1))
    assert "mediaType" in with_(lambda d: d.update(mediaType="application/json"))
    assert "tlogEntries" in with_(lambda d: d["verificationMaterial"].update(tlogEntries=[{}]))


# --- key files -----------------------------------------------------------------------------

def test_private_key_readable_by_others_is_refused(tmp_path, bundles):
    path = tmp_path / "a.bundle"
    shutil.copyfile(bundles["a"], path)
    priv = write_private(tmp_path / "k.pem", new_key(), mode=0o644)
    r = run("sign", path, "--key", priv)
    assert r.exit_code == 6 and "chmod 600" in r.stderr and "0644" in r.stderr
    assert not path.with_name("a.bundle.sig").exists()  # nothing written


@pytest.mark.parametrize("case,message", [
    ("public key", "is a public key"),
    ("garbage", "not a PEM private key"),
    ("rsa", "unsupported key type RSA"),
    ("encrypted, no password", "TRT_BUNDLE_KEY_PASSWORD"),
    ("missing", "no such file"),
])
def test_bad_private_key_files(tmp_path, bundles, case, message):
    path = tmp_path / "a.bundle"
    shutil.copyfile(bundles["a"], path)
    key_path = tmp_path / "k.pem"
    if case == "public key":
        write_public(key_path, new_key())
        os.chmod(key_path, 0o600)
    elif case == "garbage":
        key_path.write_bytes(b"-----BEGIN PRIVATE KEY-----\nnot base64\n-----END PRIVATE KEY-----\n")
        os.chmod(key_path, 0o600)
    elif case == "rsa":
        write_private(key_path, new_key("rsa"))
    elif case == "encrypted, no password":
        write_private(key_path, new_key(), password=b"s3cret")
    r = run("sign", path, "--key", key_path)
    assert r.exit_code == 6, r.output
    assert message in r.stderr
    assert not path.with_name("a.bundle.sig").exists()


def test_encrypted_key_with_password_from_environment(tmp_path, bundles):
    path = tmp_path / "a.bundle"
    shutil.copyfile(bundles["a"], path)
    key = new_key()
    priv = write_private(tmp_path / "k.pem", key, password=b"s3cret")
    result = CliRunner(env={"TRT_BUNDLE_KEY_PASSWORD": "s3cret"}).invoke(
        cli, ["sign", str(path), "--key", str(priv)])
    assert result.exit_code == 0, result.output
    runtime_py.load(path, trusted_keys=write_public(tmp_path / "k.pub", key)).close()


@pytest.mark.parametrize("case,message", [
    ("private key in trust", "holds a private key"),
    ("empty folder", "no trusted public keys"),
    ("not pem", "not a PEM file"),
    ("missing", "no such file"),
])
def test_bad_trust_configuration(signed, tmp_path, case, message):
    trust = tmp_path / "trust"
    trust.mkdir()
    if case == "private key in trust":
        write_public(trust / "ok.pub", signed["key"])
        shutil.copyfile(signed["priv"], trust / "oops.pem")
    elif case == "not pem":
        (trust / "k.pub").write_bytes(b"\x30\x59 DER bytes")
    elif case == "missing":
        trust = tmp_path / "nowhere"
    with pytest.raises(KeyFileError, match=message):
        runtime_py.load(signed["path"], trusted_keys=trust)
    r = run("verify", signed["path"], "--trusted-keys", trust)
    assert r.exit_code == 6 and message in r.stderr


def test_signature_option_without_trust_is_a_usage_error(signed):
    r = run("verify", signed["path"], "--signature", signed["sig"])
    assert r.exit_code == 6 and "need trust" in r.stderr


# --- certificates --------------------------------------------------------------------------

@pytest.fixture
def pki(tmp_path):
    ca_key, ca = make_ca()
    return {"ca_key": ca_key, "ca": ca, "ca_pem": write_cert(tmp_path / "ca.pem", ca)}


def _sign_with_certificate(tmp_path, bundles, pki, **leaf_args):
    path = tmp_path / "a.bundle"
    shutil.copyfile(bundles["a"], path)
    key = new_key()
    leaf = make_leaf(pki["ca_key"], pki["ca"], key, **leaf_args)
    run_result = run("sign", path, "--key", write_private(tmp_path / "leaf.key", key),
                     "--certificate", write_cert(tmp_path / "leaf.pem", leaf))
    assert run_result.exit_code == 0, run_result.output
    return path, leaf


def test_certificate_signature_round_trip(tmp_path, bundles, pki):
    path, leaf = _sign_with_certificate(tmp_path, bundles, pki)
    r = run("verify", path, "--certificate-chain", pki["ca_pem"], "--json")
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)["signature"]
    assert s["method"] == "certificate" and s["identity"] == "release-job@example.com"
    assert s["certificate"]["issuer"] == "CN=trt-bundle test CA"
    assert s["certificate"]["sha256"] == leaf.fingerprint(hashes.SHA256()).hex()
    # a trust folder holding the CA certificate works the same for load / serve
    trust = tmp_path / "trust"
    trust.mkdir()
    shutil.copyfile(pki["ca_pem"], trust / "ca.crt")
    runtime_py.load(path, trusted_keys=trust).close()


def test_expired_certificate_is_refused(tmp_path, bundles, pki):
    path, _ = _sign_with_certificate(tmp_path, bundles, pki, not_before=NOW - 20 * DAY,
                                     not_after=NOW - 10 * DAY)
    with pytest.raises(UntrustedSignerError, match="expired"):
        runtime_py.load(path, trusted_keys=pki["ca_pem"])
    r = run("verify", path, "--certificate-chain", pki["ca_pem"])
    assert r.exit_code == 8 and "expired" in r.stderr


def test_revoked_certificate_is_refused(tmp_path, bundles, pki):
    path, leaf = _sign_with_certificate(tmp_path, bundles, pki)
    crl = (x509.CertificateRevocationListBuilder().issuer_name(pki["ca"].subject)
           .last_update(NOW - DAY).next_update(NOW + 7 * DAY)
           .add_revoked_certificate(x509.RevokedCertificateBuilder()
                                    .serial_number(leaf.serial_number)
                                    .revocation_date(NOW - DAY).build())
           .sign(pki["ca_key"], hashes.SHA256()))
    crl_pem = tmp_path / "ca.crl"
    crl_pem.write_bytes(crl.public_bytes(serialization.Encoding.PEM))
    assert run("verify", path, "--certificate-chain", pki["ca_pem"]).exit_code == 0
    r = run("verify", path, "--certificate-chain", pki["ca_pem"], "--crl", crl_pem)
    assert r.exit_code == 8 and "revoked" in r.stderr
    trust = tmp_path / "trust"
    trust.mkdir()
    shutil.copyfile(pki["ca_pem"], trust / "ca.pem")
    shutil.copyfile(crl_pem, trust / "ca.crl")
    with pytest.raises(UntrustedSignerError, match="revoked"):
        runtime_py.load(path, trusted_keys=trust)


def test_certificate_from_an_untrusted_ca_is_refused(tmp_path, bundles, pki):
    path, _ = _sign_with_certificate(tmp_path, bundles, pki)
    _, other_ca = make_ca("some other CA")
    other = write_cert(tmp_path / "other-ca.pem", other_ca)
    with pytest.raises(UntrustedSignerError, match="does not chain to a trusted root"):
        runtime_py.load(path, trusted_keys=other)
    only_keys = write_public(tmp_path / "k.pub", new_key())
    with pytest.raises(UntrustedSignerError, match="no trusted root"):
        runtime_py.load(path, trusted_keys=only_keys)


def test_certificate_of_another_key_is_refused_when_signing(tmp_path, bundles, pki):
    leaf = make_leaf(pki["ca_key"], pki["ca"], new_key())
    r = run("sign", bundles["a"], "--key", write_private(tmp_path / "k.pem", new_key()),
            "--certificate", write_cert(tmp_path / "leaf.pem", leaf))
    assert r.exit_code == 6 and "not the certificate of key" in r.stderr


# --- make / serve --------------------------------------------------------------------------

def test_make_refuses_a_bad_sign_key_before_building(tmp_path):
    out = tmp_path / "out"
    priv = write_private(tmp_path / "k.pem", new_key(), mode=0o640)
    r = run("make", "timm_xception", "--precision", "fp32", "--random-weights", "--out", out,
            "--sign-key", priv)
    assert r.exit_code == 6 and "chmod 600" in r.stderr
    assert "[export]" not in r.stderr and not out.exists()


def test_serve_refuses_an_unsigned_bundle_before_serving(signed):
    signed["sig"].unlink()
    r = run("serve", signed["path"], "--trusted-keys", signed["trust"], "--port", "0")
    assert r.exit_code == 8 and "no signature" in r.stderr
    assert "serving on" not in r.stderr


def test_runtime_import_stays_light_without_trust(signed):
    """Loading without trust never imports cryptography; with trust it does."""
    code = ("import sys, runtime_py; m = runtime_py.load(sys.argv[1]); m.close(); "
            "print('cryptography' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(signed["path"])],
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
    code = ("import sys, runtime_py; m = runtime_py.load(sys.argv[1], trusted_keys=sys.argv[2]); "
            "m.close(); print('cryptography' in sys.modules, 'torch' in sys.modules, "
            "'bundler' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(signed["path"]), str(signed["trust"])],
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == "True False False"


@pytest.mark.slow
def test_make_signs_the_bundle_it_writes(tmp_path):
    """`bundle make --sign-key`: the real family build (its fp32 export is cached after the
    first build of the session), then the signature verifies against the key."""
    key = new_key()
    priv = write_private(tmp_path / "release.key", key)
    trust = write_public(tmp_path / "trusted" / "release.pub", key)
    r = run("make", "timm_xception", "--precision", "fp32", "--random-weights",
            "--reference-count", "2", "--backend", "onnxruntime", "--out", tmp_path / "out",
            "--sign-key", priv, "--json")
    assert r.exit_code == 0, r.output
    made = json.loads(r.stdout)
    assert made["signature"]["bundle_id"] == made["id"]
    assert Path(made["signature"]["signature"]) == Path(made["path"] + ".sig")
    v = run("verify", made["path"], "--trusted-keys", trust.parent, "--json")
    assert v.exit_code == 0, v.output
    assert json.loads(v.stdout)["signature"]["key_fingerprint"] == f"sha256:{fingerprint_of(key)}"
