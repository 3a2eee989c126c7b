"""Deliberately broken variants of the reference; the suite must reject each on its ID."""
