import math
from dynamo._core import LoadThresholdConfig as L
cases = [
    dict(active_decode_blocks_threshold=1.5),
    dict(active_decode_blocks_threshold=-0.1),
    dict(active_decode_blocks_threshold=float("nan")),
    dict(active_decode_blocks_threshold=float("inf")),
    dict(active_decode_blocks_threshold=0.0),
    dict(active_decode_blocks_threshold=1.0),
    dict(active_prefill_tokens_threshold_frac=-1.0),
    dict(active_prefill_tokens_threshold_frac=float("nan")),
    dict(active_prefill_tokens_threshold_frac=float("inf")),
    dict(active_prefill_tokens_threshold_frac=0.0),
    dict(active_prefill_tokens_threshold_frac=5.0),
    dict(active_prefill_tokens_threshold=-1),
    dict(active_prefill_tokens_threshold=0),
    dict(active_prefill_tokens_threshold=2**64 - 1),
    dict(active_prefill_tokens_threshold=2**64),
    dict(),
]
for kw in cases:
    try:
        c = L(**kw)
        print(kw, "->", "ok", c.active_decode_blocks_threshold, c.active_prefill_tokens_threshold, c.active_prefill_tokens_threshold_frac)
    except BaseException as e:
        print(kw, "->", type(e).__module__ + "." + type(e).__name__, str(e))
