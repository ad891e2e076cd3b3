"""A Jepsen-style nemesis for the Herald cluster (issue 25): ``python -m tests.nemesis``.

cluster.py (the processes and their addresses), network.py (partitions with iptables),
faults.py (the seeded schedule), workload.py (the SDK clients), history.py (every
operation and what it showed), checker.py (PROTOCOL §7 over the history), report.py,
run.py (one run, start to report)."""
