"""Detached bundle signatures: who made a bundle, checked before anything loads.

`check_trust` is what the runtime calls after opening a bundle. With no trust configured
it returns at once and imports nothing: `cryptography` (the `sign` extra) is imported only
when a service asks for signatures. The format is in `envelope.py` (standard library
only), keys in `keys.py`, trust in `trust.py`, the check in `verify.py`; docs/signing.md
explains the choices.
"""

from __future__ import annotations

import os

from runtime_py.signing.envelope import default_signature_path

__all__ = ["check_trust", "default_signature_path"]


def check_trust(bundle, trusted_keys, signature_path: str | os.PathLike | None = None
                ) -> dict | None:
    """Refuse `bundle` unless its signature verifies against `trusted_keys` (a folder, a PEM
    file, a list of those, or a `TrustPolicy`); return who signed. None: trust not asked."""
    if trusted_keys is None:
        return None
    try:
        from runtime_py.signing.trust import as_trust_policy
        from runtime_py.signing.verify import verify_bundle_signature
    except ImportError as exc:  # the optional dependency, named in the message
        from runtime_py.errors import CompatibilityError

        raise CompatibilityError(f"signature checks need the `cryptography` package ({exc}): "
                         "pip install 'trt-bundle[sign]'") from None
    return verify_bundle_signature(bundle, as_trust_policy(trusted_keys), signature_path)
