"""LoRA filtering: an adapter's requests stay on its replica set (HST-016 to HST-018)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import attrs


@attrs.define
class LoraFilter:
    replicas: dict[str, frozenset[int]] = attrs.field(factory=dict)
    _inflight: dict[str, int] = attrs.field(factory=dict)

    def replica_set(self, lora_name: str) -> frozenset[int]:
        return self.replicas.get(lora_name, frozenset())

    def track(self, lora_name: str) -> Callable[[], None]:
        """Count one request of the adapter until the returned release is called (HST-017)."""
        self._inflight[lora_name] = self._inflight.get(lora_name, 0) + 1

        def release() -> None:
            self._inflight[lora_name] -= 1
            if not self._inflight[lora_name]:
                del self._inflight[lora_name]

        return release

    def inflight(self) -> Mapping[str, int]:
        return dict(self._inflight)
