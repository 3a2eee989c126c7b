"""The routing host: policies, explicit workers, session affinity, LoRA filtering, the
response-stream monitor, cancellation and KV selection above ``PushRouter`` (spec: HST,
AFF, MON, KVS)."""
