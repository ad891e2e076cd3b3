"""Herald's storage engine: partitioned, file-backed, append-only logs.

The synchronous core (segments, indexes, recovery) is owned by writer threads;
the server talks to it through the awaitable facade in :mod:`storage.engine`.
"""
