"""The TCP transport, wire-compatible with Dynamo 1.6.1 (spec: TRN).

Pure wire formats first (``frames``, ``control``, ``codecs``, ``wire_errors``), then the I/O
that uses them: ``connection`` (length-checked reads), ``request_plane`` and
``response_plane`` (the caller's two halves), ``tcp_dispatch`` (the caller's
``StreamingDispatch``) and ``worker_server`` (the worker side).
"""
