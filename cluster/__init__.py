"""Herald's cluster layer (PROTOCOL §7): coordination on etcd, membership, partition state.

Imports ``storage`` at most (STYLE: ``server → cluster → storage``); never ``server``,
``subscribers`` or ``delivery``.
"""
