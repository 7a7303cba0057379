"""Bundle format v1: the reader shared by the runtime, the CLI and the tests."""

from runtime_py.format.layout import FORMAT_MAJOR, FORMAT_MINOR, HEADER_SIZE, MAGIC, Header
from runtime_py.format.manifest import (bundle_id_of, decode_manifest, encode_manifest,
                                        validate_manifest)
from runtime_py.format.reader import Bundle, open_bundle

__all__ = ["Bundle", "open_bundle", "Header", "MAGIC", "HEADER_SIZE", "FORMAT_MAJOR",
           "FORMAT_MINOR", "encode_manifest", "decode_manifest", "validate_manifest",
           "bundle_id_of"]
