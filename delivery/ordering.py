"""Per-key ordering (PROTOCOL §2 `ordered_by_key`): at most one record per non-null key
is in flight or awaiting redelivery; later records of that key wait, as small
(partition, offset) refs, in offset order; other keys are never held back.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection

Ref = tuple[int, int]  # (partition, offset)


class KeyGate:
    __slots__ = ("_holder", "_waiting")

    def __init__(self) -> None:
        self._holder: dict[str, Ref] = {}  # key -> the one record that holds it
        self._waiting: dict[str, deque[Ref]] = {}  # key -> later records, offset order

    def try_take(self, key: str, ref: Ref) -> bool:
        """True if ``ref`` may go now; else it is queued behind the key's holder."""
        if key in self._holder:
            queue = self._waiting.get(key)
            if queue is None:
                queue = self._waiting[key] = deque()
            queue.append(ref)
            return False
        self._holder[key] = ref
        return True

    def release(self, key: str, ref: Ref) -> Ref | None:
        """``ref`` is done with its key; returns the next waiting ref, which now holds it."""
        if self._holder.get(key) != ref:
            return None
        queue = self._waiting.get(key)
        if queue:
            following = queue.popleft()
            if not queue:
                del self._waiting[key]
            self._holder[key] = following
            return following
        del self._holder[key]
        return None

    def holder(self, key: str) -> Ref | None:
        return self._holder.get(key)

    def waiting(self) -> int:
        return sum(len(queue) for queue in self._waiting.values())

    def drop_partitions(self, partitions: Collection[int]) -> list[tuple[str, Ref]]:
        """Seek: forget every ref of these partitions. Returns (key, ref) promoted to holder."""
        for key in list(self._waiting):
            kept = deque(ref for ref in self._waiting[key] if ref[0] not in partitions)
            if kept:
                self._waiting[key] = kept
            else:
                del self._waiting[key]
        promoted: list[tuple[str, Ref]] = []
        for key, ref in list(self._holder.items()):
            if ref[0] in partitions:
                following = self.release(key, ref)
                if following is not None:
                    promoted.append((key, following))
        return promoted
