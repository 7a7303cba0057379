"""The one exception hierarchy of trt-bundle.

Every rejection a user can cause (a bad file, a bad flag, a host that cannot run a
bundle) is a ``BundleError`` subclass whose message says what is wrong and what to do.
The CLI prints ``error: <message>`` and exits with the class's ``exit_code``; nothing
else is caught there, so a traceback always means a bug in trt-bundle.

This module lives in ``runtime_py`` because both the runtime and the bundler raise
these, and the runtime must not import the bundler.
"""

from __future__ import annotations


class BundleError(Exception):
    """Base of every error trt-bundle raises on purpose."""

    exit_code = 3

    def __init__(self, message: str, *, problems: list[str] | None = None) -> None:
        self.problems = list(problems) if problems else [message]
        super().__init__(message)


# --- the file and its contents (exit 3) -------------------------------------------

class BundleNotFoundError(BundleError):
    """The path does not exist, or is not a regular file."""

    exit_code = 4


class BundleFormatError(BundleError):
    """The bytes are not a well-formed bundle: magic, header, layout, bounds."""


class BadMagicError(BundleFormatError):
    """The file does not start with the bundle magic: not a bundle at all."""


class UnsupportedVersionError(BundleFormatError):
    """The format major version is one this reader does not know."""


class TruncatedBundleError(BundleFormatError):
    """The file ends before the header, a member or the manifest does."""


class HeaderCorruptError(BundleFormatError):
    """The fixed header fails its CRC32 or holds impossible values."""


class MemberLayoutError(BundleFormatError):
    """A member's offset/size lies outside the data region or overlaps another."""


class ManifestError(BundleError):
    """The manifest cannot be decoded, is not canonical, or fails its schema."""


class IntegrityError(BundleError):
    """A sha256 does not match: a member, or the manifest against the bundle id."""


class DecompressionError(BundleError):
    """A member's zstd stream is corrupt or decompresses to a size other than declared."""


class MemberNotFoundError(BundleError):
    """The bundle has no member of that name."""


class VerificationError(BundleError):
    """One or more checks of ``verify`` failed; ``problems`` lists each one."""


# --- the command line (exit 2) ----------------------------------------------------

class OtherCommandError(BundleError):
    """A job this command cannot do; the message says which command does it."""

    exit_code = 2


# --- running a bundle on this host (exit 5) ----------------------------------------

class CompatibilityError(BundleError):
    """The bundle's engine target cannot run on this host (versions, GPU, backend)."""

    exit_code = 5


class EngineUnavailableError(CompatibilityError):
    """The engine's Python package (or a GPU) is not present on this host."""


class MissingExtraError(CompatibilityError):
    """An optional part of trt-bundle (a pip extra: export, serve...) is not installed.

    ``extra`` names it and ``missing`` the modules this install lacks, so that callers can
    say exactly what to install.
    """

    def __init__(self, message: str, *, extra: str, missing: list[str]) -> None:
        super().__init__(message)
        self.extra = extra
        self.missing = list(missing)


# --- what the user asked for (exit 6) ----------------------------------------------

class UsageError(BundleError):
    """A request that cannot be honoured as asked (bad option combination, refused precision)."""

    exit_code = 6


class OutputPathError(UsageError):
    """The output folder is a file, lies under a file, or cannot be written."""


class BundleExistsError(UsageError):
    """A bundle of the same name is already there and replacing it was not asked for."""


class FamilyError(UsageError):
    """Unknown family, or a family spec that is invalid."""


class WeightsError(UsageError):
    """No weights available, or a checkpoint that does not match the family."""


class CalibrationError(UsageError):
    """Calibration data missing, unreadable, or too small."""


class PreprocessError(UsageError):
    """An input image cannot be decoded or does not fit the preprocessing spec."""


class InferenceInputError(UsageError):
    """Arrays given to ``infer`` have the wrong names, dtypes or shapes."""


# --- who made the bundle (exit 8) ------------------------------------------------

class SignatureError(BundleError):
    """The bundle's signature is missing, unreadable or not from a trusted signer.

    Raised only when trust is configured (`load(..., trusted_keys=...)`, `bundle verify
    --key`, `bundle serve --trusted-keys`); the bundle itself may be perfectly sound.
    """

    exit_code = 8


class SignatureMissingError(SignatureError):
    """Trust is configured but the bundle has no signature file beside it."""


class SignatureFormatError(SignatureError):
    """The signature file is not a signature envelope this reader understands."""


class UntrustedSignerError(SignatureError):
    """Signed by a key or certificate that the configured trust does not accept
    (unknown key, chain to an untrusted root, expired or revoked certificate)."""


class SignatureMismatchError(SignatureError):
    """The signature does not verify, or it is the signature of another bundle."""


class KeyFileError(UsageError):
    """A key, certificate or trust file that cannot be used: wrong format or type, a
    private key others can read, a private key where public keys are expected (exit 6)."""


# --- serving (exit 7) ---------------------------------------------------------------

class BatcherError(BundleError):
    """Base of batcher errors."""

    exit_code = 7


class QueueFullError(BatcherError):
    """The batcher's queue is full: back off and retry (back-pressure)."""


class BatcherClosedError(BatcherError):
    """The batcher was closed; no new requests are accepted."""


class ServingError(BundleError):
    """The server cannot start or keep running (a front-end worker died, ...)."""

    exit_code = 7


class AddressInUseError(ServingError):
    """The HTTP or gRPC port cannot be bound (in use, or not allowed)."""


EXIT_CODES_HELP = """\
Exit codes: 0 success; 1 verify found problems (one line each); 2 bad command line;
3 malformed or corrupt bundle; 4 path not found or not a file; 5 bundle cannot run on
this host (engine missing, GPU/version mismatch); 6 request refused (bad family,
weights, calibration data, precision, inputs, key files, an output place that cannot be
written: full disk, permissions); 7 serving error; 8 signature missing, malformed or not
from a trusted signer."""
