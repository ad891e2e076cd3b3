"""``herald serve``'s flags for a cluster's trust (docs/security.md "A cluster"): how a
node reaches a closed etcd (Patroni's names: user, password, CA, client certificate)
and what the nodes share to trust each other (the cluster secret, the peers' CA)."""

from __future__ import annotations

import argparse
from pathlib import Path

TRUST_FIELDS = (
    "etcd_user",
    "etcd_password",
    "etcd_ca_file",
    "etcd_cert_file",
    "etcd_key_file",
    "cluster_secret_file",
    "peer_ca_file",
)


def add_trust_flags(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--etcd-user",
        help="etcd user name, when etcd has auth enabled "
        "(env HERALD_ETCD_USER; the password: env HERALD_ETCD_PASSWORD)",
    )
    group.add_argument(
        "--etcd-password",
        help="etcd password (prefer env HERALD_ETCD_PASSWORD: a flag shows in `ps`)",
    )
    group.add_argument(
        "--etcd-ca-file", type=Path, help="PEM CA bundle etcd's https:// certificate chains to"
    )
    group.add_argument(
        "--etcd-cert-file",
        type=Path,
        help="PEM client certificate for etcd's --client-cert-auth (with --etcd-key-file)",
    )
    group.add_argument("--etcd-key-file", type=Path, help="PEM private key of --etcd-cert-file")
    group.add_argument(
        "--cluster-secret-file",
        type=Path,
        help="key file all nodes share (`herald encryption-key --id 1`): seals push secrets "
        "in etcd and proves a node to the others before credentials are forwarded to it; "
        "default: the --encryption-key-file keys. Required with --auth-file "
        "(env HERALD_CLUSTER_SECRET_FILE)",
    )
    group.add_argument(
        "--peer-ca-file",
        type=Path,
        help="PEM CA bundle the other nodes' https:// certificates chain to "
        "(default: the system's; env HERALD_PEER_CA_FILE)",
    )
