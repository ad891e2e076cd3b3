"""The process's open-files limit (PROTOCOL §6: open files are bounded below it).

At start the soft limit is raised to the hard one (as nginx's
``worker_rlimit_nofile`` or systemd's ``LimitNOFILE`` would): a default soft limit
of 1024 is far below what a server with thousands of topics and connections needs.
Half of it goes to the partitions' segment files (storage/open_files.py), the rest
to sockets, reads and everything else.
"""

from __future__ import annotations

import logging
import resource

log = logging.getLogger("herald.server")

_HEADROOM = 32  # descriptors that are neither sockets nor segment files: meta.db, logs...
_MIN_SEGMENT_FILES = 16


def raise_open_files_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit; returns the soft limit now in
    force (unchanged if raising it was refused)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            log.warning("open files limit: %d (cannot raise it to %d: %s)", soft, target, exc)
            return soft
        log.info("open files limit: %d (raised from %d)", target, soft)
        return target
    log.info("open files limit: %d (the hard limit)", soft)
    return soft


def open_files_limit() -> int:
    """The soft limit in force now."""
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def segment_file_budget(limit: int, configured: int = 0) -> int:
    """How many descriptors partitions may keep open: ``configured`` if given, else half
    of ``limit`` less some headroom (the other half is for sockets)."""
    if configured > 0:
        return configured
    return max(_MIN_SEGMENT_FILES, limit // 2 - _HEADROOM)
