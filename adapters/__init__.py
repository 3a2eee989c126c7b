"""Adapters: one module per target the conformance suite can drive (``--adapter NAME``)."""
