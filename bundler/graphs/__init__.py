"""Precision graphs derived from the fp32 export: ``fp16`` (typed) and ``fp8`` (Q/DQ)."""
