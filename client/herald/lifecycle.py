"""Running things and their one owner (STYLE principles 4 and 14).

Three pieces, shared by the server's layers and the SDK:

- :func:`periodic` — work every N seconds until cancelled; a failed run is logged and
  tried again at the next tick, never the end of the loop.
- :func:`supervised` — a long-running job restarted after an unexpected failure, with
  exponential backoff (tenacity) that starts over once a run has stayed up.
- :class:`Service` and :func:`start_service` — something with ``start``/``stop``,
  started under an :class:`contextlib.AsyncExitStack` that stops what it started in
  reverse order.

Cancellation always propagates: neither helper catches ``CancelledError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import NoReturn, Protocol, TypeVar

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_never
from tenacity.wait import wait_base

from herald.protocol.errors import HeraldError

__all__ = ["Backoff", "Service", "periodic", "start_service", "supervised"]


class Service(Protocol):
    """A part of a process that is started once and stopped once (stop is idempotent)."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


ServiceT = TypeVar("ServiceT", bound=Service)


async def start_service(stack: contextlib.AsyncExitStack, service: ServiceT) -> ServiceT:
    """Start ``service`` and have ``stack`` stop it: services started on one stack stop
    in the reverse order of their starts, also when a later start fails."""
    await service.start()
    stack.push_async_callback(service.stop)
    return service


async def periodic(
    seconds: float, work: Callable[[], Awaitable[object]], *, what: str, logger: logging.Logger
) -> NoReturn:
    """Run ``work`` every ``seconds`` (the first run one interval from now) until cancelled.
    A failed run (a retention pass, an fsync) is logged and tried again at the next tick:
    in one line when it is an error the protocol names (a failing disk, etcd away), which
    a traceback every tick would only bury; with its traceback otherwise."""
    while True:
        await asyncio.sleep(seconds)
        try:
            await work()
        except HeraldError as exc:
            logger.error("%s failed: %s", what, exc)
        except Exception:
            logger.exception("%s failed", what)


@dataclass(frozen=True, slots=True)
class Backoff:
    """How long a supervised job waits before it is restarted: ``first_s`` after its first
    failure, doubling up to ``max_s`` while it keeps failing. A run that stayed up for
    ``healthy_s`` starts the count over. ``first_s == max_s``: a constant delay."""

    first_s: float = 1.0
    max_s: float = 30.0
    healthy_s: float = 60.0

    def __post_init__(self) -> None:
        if not 0 <= self.first_s <= self.max_s:
            raise ValueError("Backoff needs 0 <= first_s <= max_s")


class _RestartDelay(wait_base):
    """tenacity's wait for :func:`supervised`: exponential over *consecutive* failures
    (tenacity's own attempt count never starts over); a run that lasted ``healthy_s``,
    from its start (:meth:`run_starts`, tenacity's ``before``) to its failure, resets it."""

    def __init__(self, backoff: Backoff) -> None:
        self.backoff = backoff
        self._streak = 0
        self._run_started = time.monotonic()

    def run_starts(self, retry_state: RetryCallState) -> None:
        self._run_started = time.monotonic()

    def __call__(self, retry_state: RetryCallState) -> float:
        backoff = self.backoff
        if time.monotonic() - self._run_started >= backoff.healthy_s:
            self._streak = 0
        delay = min(backoff.max_s, backoff.first_s * 2.0**self._streak)
        self._streak = min(self._streak + 1, 62)  # 2**62 * first_s is past any max_s
        return delay


def _unexpected(final: tuple[type[BaseException], ...]) -> Callable[[BaseException], bool]:
    def restart(error: BaseException) -> bool:
        return isinstance(error, Exception) and not isinstance(error, final)

    return restart


async def supervised(
    run: Callable[[], Awaitable[object]],
    *,
    what: str,
    logger: logging.Logger,
    backoff: Backoff = Backoff(),
    final: tuple[type[BaseException], ...] = (),
) -> None:
    """Run ``run`` until it returns, restarting it after each unexpected failure.

    An exception of a type in ``final`` (the job's own "nothing left to do", such as a
    deleted subscription) ends supervision and is raised to the caller, as is a
    cancellation. Anything else is logged and ``run`` is called again after the backoff.
    """

    def log_restart(retry_state: RetryCallState) -> None:
        outcome = retry_state.outcome
        error = outcome.exception() if outcome is not None else None
        logger.error(
            "%s failed; restarting in %.3g s", what, retry_state.upcoming_sleep, exc_info=error
        )

    restart_delay = _RestartDelay(backoff)
    retrying = AsyncRetrying(
        retry=retry_if_exception(_unexpected(final)),
        before=restart_delay.run_starts,
        wait=restart_delay,
        stop=stop_never,
        before_sleep=log_restart,
        reraise=True,
    )
    async for attempt in retrying:
        with attempt:
            await run()
