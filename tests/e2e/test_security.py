"""The operator's servers against hostile clients while a job trains on a real control plane:
its coordinator (HTTPS, as in a cluster) and its health and metrics port get the attacks of
tests/integration/http_attacks.py, the coordinator also 100 TLS clients that never finish their
handshake. A watcher in its own process asks each for /healthz every 0.2 s, and every answer
must come within a probe's second; the job ends with the weights of a local static run."""

import os
import sys
import threading

from controlplane import free_port
from test_operator import NS, OperatorTestCase, job_manifest, local_sha_meanwhile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from http_attacks import (  # noqa: E402 - found through the path above
    PROBE_TIMEOUT,
    HealthWatch,
    Target,
    hundred_megabyte_body,
    megabyte_of_headers,
    negative_chunk_size,
    slow_clients,
    stalled_tls_handshakes,
)

# Past the servers' deadlines for a handshake and a request head (10 s each).
SLOW_SECONDS = 16


class OperatorSecurityTest(OperatorTestCase):
    http_port = free_port()
    http_listen = "127.0.0.1:%d" % http_port

    def test_operator_servers_survive_hostile_clients_while_a_job_trains(self):
        name = "besieged"
        manifest = job_manifest(name, steps=900, delay_ms=8, replicas=(2, 2))
        self.reset_nodes(("gpu-1", 2))
        static = local_sha_meanwhile(manifest, 2)
        self.apply(manifest)
        self.wait_workers(name, 2)
        self.wait_step(name, 20)
        # No credential: the coordinator refuses every attack from its head alone.
        coordinator = Target(
            "coordinator",
            self.coordinator_port,
            tls=True,
            attack_path="/v1/jobs/%s/%s/store/x" % (NS, name),
        )
        probes = Target("operator probes", self.http_port, attack_path="/metrics")
        watch = HealthWatch([coordinator, probes])
        outcomes = {}
        threads = [
            threading.Thread(
                target=lambda: outcomes.update(
                    stalled=stalled_tls_handshakes(coordinator, 100, SLOW_SECONDS)
                )
            ),
            threading.Thread(
                target=lambda: outcomes.update(slow=slow_clients(probes, 100, SLOW_SECONDS))
            ),
        ]
        for thread in threads:
            thread.start()
        try:
            self.assertEqual(negative_chunk_size(coordinator), 401)
            self.assertEqual(megabyte_of_headers(coordinator), 431)
            self.assertEqual(hundred_megabyte_body(coordinator, chunked=False)[0], 413)
            status, sent = hundred_megabyte_body(coordinator, chunked=True)
            self.assertEqual(status, 401)
            self.assertLess(sent, 20 * 1000 * 1000)
            self.assertEqual(negative_chunk_size(probes), 413)
            self.assertEqual(megabyte_of_headers(probes), 431)
            for chunked in (False, True):
                status, sent = hundred_megabyte_body(probes, chunked)
                self.assertEqual(status, 413)
                self.assertLess(sent, 20 * 1000 * 1000)
        finally:
            for thread in threads:
                thread.join()
            health = watch.stop()

        for what, (closed, connected) in outcomes.items():
            self.assertEqual(connected, 100, what)
            self.assertEqual(closed, connected, "%s: kept past the deadline" % what)
        for server, entry in health.items():
            self.assertGreater(entry["probes"], 20, server)
            self.assertEqual(entry["failures"], [], server)
            self.assertLess(entry["slowest"], PROBE_TIMEOUT, server)
        status = self.wait_succeeded(name)
        self.assertEqual(status["weightsSha256"], static.result(timeout=900))
        self.delete_job(name)
