"""A rollout backend's memory calls written down in order (tests of train/memory_order.py)."""

from __future__ import annotations


class RecordsMemoryCalls:
    """Mixed into a backend: sleep and the wakes append their names to `self.calls`."""

    calls: list[str]

    def sleep(self) -> None:
        self.calls.append("sleep")

    def wake_weights(self) -> None:
        self.calls.append("wake_weights")

    def wake_kv_cache(self) -> None:
        self.calls.append("wake_kv_cache")
