"""SuperNode authentication (docs/deployment.md's main recipe): a SuperLink started with
``--enable-supernode-auth`` admits a SuperNode whose public key was registered with
``flwr supernode register`` and refuses one with an unregistered key or no key at all.

Run alone: ``pytest -m deployment tests/test_deployment_auth.py``."""

from __future__ import annotations

import pytest

from tests.deployment import LocalFederation, wait_for


@pytest.mark.deployment
@pytest.mark.slow
def test_a_supernode_without_an_authorised_key_is_refused(tmp_path):
    with LocalFederation(tmp_path) as fed:
        fed.start_superlink("--enable-supernode-auth")
        good_key, good_pub = fed.node_key("good")
        bad_key, _ = fed.node_key("bad")  # a key pair nobody registered
        reg = fed.register_key(good_pub)
        assert reg.returncode == 0 and "registered successfully" in reg.stdout, reg.stdout + reg.stderr
        fed.start_supernode("good", "partition-id=0 num-partitions=1", "--auth-supernode-private-key", str(good_key))
        bad, bad_log = fed.start_supernode("bad", "partition-id=0 num-partitions=1",
                                           "--auth-supernode-private-key", str(bad_key))
        nokey, nokey_log = fed.start_supernode("nokey", "partition-id=0 num-partitions=1")
        # the refused SuperNodes exit (Flower's exit code 305: no connection to the SuperLink)
        wait_for(lambda: bad.poll() is not None and nokey.poll() is not None, 120, "the refusals", [])
        fed.wait_registered(1, watched=fed.procs[:2])
        assert bad.returncode != 0 and "Failed to activate SuperNode" in bad_log.read_text()
        assert nokey.returncode != 0 and "SuperNode authentication is enabled" in nokey_log.read_text()
        assert fed.registered() == 1  # only the registered key's node was ever activated
        assert fed.procs[1][0].poll() is None  # the authorised SuperNode runs on
