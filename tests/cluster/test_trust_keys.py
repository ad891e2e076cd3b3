"""The cluster key set (cluster/trust.py) on its own: sealed etcd values open only under
their own key name and with a key the node holds; a peer proof holds only for the URL
it was made for, and under any key id both nodes hold (a rotation in progress)."""

from __future__ import annotations

import os

import pytest

from cluster.trust import SEALED, ClusterKeys, SealError

KEY = "/herald/c/subscriptions/s"


def test_a_sealed_value_opens_with_its_key_name_only() -> None:
    keys = ClusterKeys({1: os.urandom(32)})
    sealed = keys.seal(KEY, b'{"push": {"secret": "whsec_x"}}')
    assert sealed.startswith(SEALED) and b"whsec_x" not in sealed
    assert keys.unseal(KEY, sealed) == b'{"push": {"secret": "whsec_x"}}'
    with pytest.raises(SealError):
        keys.unseal("/herald/c/subscriptions/other", sealed)  # moved to another key


def test_a_value_sealed_under_a_key_the_node_lacks_does_not_open() -> None:
    old, new = os.urandom(32), os.urandom(32)
    rotated = ClusterKeys({1: old, 2: new})
    sealed = rotated.seal(KEY, b"{}")  # the highest id seals
    with pytest.raises(SealError, match="key id 2"):
        ClusterKeys({1: old}).unseal(KEY, sealed)
    assert ClusterKeys({2: new}).unseal(KEY, sealed) == b"{}"
    assert rotated.unseal(KEY, ClusterKeys({1: old}).seal(KEY, b"[]")) == b"[]"


def test_a_value_in_clear_is_read_as_it_is() -> None:
    assert ClusterKeys({1: os.urandom(32)}).unseal(KEY, b'{"topic": "t"}') == b'{"topic": "t"}'


def test_a_proof_holds_for_its_url_and_a_shared_key_id() -> None:
    secret = os.urandom(32)
    prover, checker = ClusterKeys({1: secret}), ClusterKeys({1: secret, 2: os.urandom(32)})
    nonce = "0123456789abcdef0123"
    answer = prover.proofs(nonce, "http://10.0.0.1:8080")
    assert checker.proven(nonce, "http://10.0.0.1:8080", answer)
    assert not checker.proven(nonce, "http://10.0.0.9:8080", answer)  # a borrowed proof
    assert not checker.proven("another-nonce-000000", "http://10.0.0.1:8080", answer)
    assert not ClusterKeys({1: os.urandom(32)}).proven(nonce, "http://10.0.0.1:8080", answer)
    assert not checker.proven(nonce, "http://10.0.0.1:8080", None)
    assert not checker.proven(nonce, "http://10.0.0.1:8080", {"1": 5})
