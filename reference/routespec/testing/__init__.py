"""What exists to test a target, apart from the product: the target protocol the conformance
suite drives, the trio portal, scripted in-process workers and the transport drill workers.

Nothing under the product packages imports this package (tests/test_layers.py).
"""
