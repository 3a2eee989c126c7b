"""The specification's Markdown, shipped as package data: the conformance registry reads it
through importlib.resources (one source for the suite, the report and the rendered site)."""
