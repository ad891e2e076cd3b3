"""Network partitions on loopback with iptables: a chain of the nemesis's own, jumped to
from OUTPUT, holding DROP rules that match only the nemesis's processes and addresses.

On loopback every connection leaves from 127.0.0.1, whoever opens it, so "n1 cannot
reach n2" is matched as "packets owned by n1's group id, to n2's address"
(``-m owner --gid-owner``): each Herald node runs with a group id of its own
(tests/nemesis/cluster.py). Cutting A → B stops every connection A opens to B (its
requests and B's answers to them); B can still reach A: that is the asymmetric
partition. Cutting both directions is a full partition of the pair.

``Firewall`` is a context manager: the chain is created on entry and, whatever happens
(an exception, Ctrl-C), unhooked, flushed and deleted on exit.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections import Counter
from types import TracebackType


class FirewallUnavailable(RuntimeError):
    pass


class Firewall:
    def __init__(self) -> None:
        self.chain = f"HERALD-NEMESIS-{os.getpid()}"[:28]
        # (owner gid, destination address) -> how many partitions in effect cut it
        self.rules: Counter[tuple[int, str]] = Counter()
        binary = shutil.which("iptables")
        if binary is None:
            raise FirewallUnavailable("iptables is not installed (apt-get install -y iptables)")
        if os.geteuid() != 0:
            raise FirewallUnavailable("iptables needs root")
        self.binary = binary

    def _run(self, *args: str, check: bool = True) -> bool:
        done = subprocess.run(
            [self.binary, "-w", "5", *args], capture_output=True, text=True, timeout=30
        )
        if check and done.returncode != 0:
            raise FirewallUnavailable(f"iptables {' '.join(args)}: {done.stderr.strip()}")
        return done.returncode == 0

    def __enter__(self) -> Firewall:
        self._run("-N", self.chain)
        try:
            self._run("-I", "OUTPUT", "1", "-j", self.chain)
        except FirewallUnavailable:
            self._run("-X", self.chain, check=False)
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        while self._run("-D", "OUTPUT", "-j", self.chain, check=False):
            pass
        self._run("-F", self.chain, check=False)
        self._run("-X", self.chain, check=False)
        self.rules.clear()

    def cut(self, gid: int, destination: str) -> None:
        """Drop what the processes of group ``gid`` send to ``destination`` (partitions
        in effect together may cut one link twice: it is back once both restored it)."""
        self.rules[gid, destination] += 1
        if self.rules[gid, destination] == 1:
            self._run("-A", self.chain, *self._rule(gid, destination))

    def restore(self, gid: int, destination: str) -> None:
        """Undo one :meth:`cut` of the link."""
        if self.rules[gid, destination] <= 0:
            return
        self.rules[gid, destination] -= 1
        if self.rules[gid, destination] == 0:
            del self.rules[gid, destination]
            self._run("-D", self.chain, *self._rule(gid, destination), check=False)

    @staticmethod
    def _rule(gid: int, destination: str) -> tuple[str, ...]:
        return ("-m", "owner", "--gid-owner", str(gid), "-d", destination, "-j", "DROP")

    def heal(self) -> None:
        """Every link back."""
        self._run("-F", self.chain)
        self.rules.clear()
