"""Consumers of one subscription and their credit (PROTOCOL §3 `credit`).

Credit adds up, capped at 1,000,000 outstanding; one record spends one credit; acks
never give credit back.
"""

from __future__ import annotations

from herald.protocol.limits import MAX_CREDIT  # PROTOCOL §3: a `credit` frame's n, and the cap


class Consumer:
    __slots__ = ("credit", "id")

    def __init__(self, id: str, credit: int) -> None:
        self.id = id
        self.credit = credit


class Consumers:
    """Attached consumers in round-robin order, with the total outstanding credit."""

    __slots__ = ("_by_id", "_next", "total_credit")

    def __init__(self) -> None:
        self._by_id: dict[str, Consumer] = {}
        self._next = 0  # rotation start, so single-record sends spread too
        self.total_credit = 0

    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, id: str) -> bool:
        return id in self._by_id

    def attach(self, id: str, credit: int) -> None:
        if id in self._by_id:
            raise ValueError(f"consumer {id!r} is already attached")
        credit = max(0, min(credit, MAX_CREDIT))
        self._by_id[id] = Consumer(id, credit)
        self.total_credit += credit

    def detach(self, id: str) -> bool:
        consumer = self._by_id.pop(id, None)
        if consumer is None:
            return False
        self.total_credit -= consumer.credit
        return True

    def grant(self, id: str, n: int) -> None:
        consumer = self._by_id.get(id)
        if consumer is None or n <= 0:
            return
        granted = min(n, MAX_CREDIT - consumer.credit)
        consumer.credit += granted
        self.total_credit += granted

    def credit_of(self, id: str) -> int:
        consumer = self._by_id.get(id)
        return 0 if consumer is None else consumer.credit

    def split(self, n: int) -> list[tuple[Consumer, int]]:
        """Share ``n`` ≤ total_credit records fairly: round-robin over consumers with
        credit, in even chunks, each never beyond its credit. Spends the credit."""
        ready = [c for c in self._by_id.values() if c.credit > 0]
        if not ready or n <= 0:
            return []
        start = self._next % len(ready)
        self._next += 1
        ready = ready[start:] + ready[:start]
        shares: list[tuple[Consumer, int]] = []
        left = min(n, self.total_credit)
        while left > 0 and ready:
            chunk = -(-left // len(ready))  # ceil
            still: list[Consumer] = []
            for consumer in ready:
                take = min(chunk, consumer.credit, left)
                if take <= 0:
                    break
                consumer.credit -= take
                left -= take
                shares.append((consumer, take))
                if consumer.credit > 0:
                    still.append(consumer)
            ready = still
        self.total_credit -= n - left
        return shares
