"""The operator's servers against hostile clients while a job trains on a real control plane:
its coordinator (HTTPS, as in a cluster) and its health and metrics port get the attacks of
tests/integration/http_attacks.py, the coordinator also 100 TLS clients that never finish their
handshake. A watcher in its own process asks each for /healthz every 0.2 s, and every answer
must come within the timeout of the liveness probe the chart gives the operator; the job ends
with the weights of a local static run."""

import base64
import concurrent.futures
import json
import os
import re
import ssl
import sys
import threading
import time
import urllib.error
import urllib.request

from controlplane import free_port
from test_operator import NS, OperatorTestCase, job_manifest, local_sha_meanwhile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from http_attacks import (  # noqa: E402 - found through the path above
    HealthWatch,
    Target,
    hundred_megabyte_body,
    megabyte_of_headers,
    negative_chunk_size,
    probe,
    slow_clients,
    stalled_tls_handshakes,
)

# Past the servers' deadlines for a handshake and a request head (10 s each).
SLOW_SECONDS = 16
# The chart's default memory limit for the operator, and the coordinator's budget the chart
# derives from it (half).
OPERATOR_LIMIT = 512 << 20
MEMORY_CGROUPS = "/sys/fs/cgroup/memory"
DEPLOYMENT = os.path.join(
    os.path.dirname(os.path.abspath(__file__)),
    "..",
    "..",
    "charts",
    "virtualflow",
    "templates",
    "deployment.yaml",
)


def chart_liveness(field):
    """FIELD of the operator's liveness probe in the chart. Its timeoutSeconds is the time within
    which a kubelet wants /healthz answered, so the bound the operator's servers are held to;
    its periodSeconds how often the kubelet asks."""
    with open(DEPLOYMENT) as f:
        text = f.read()
    block = text[text.index("livenessProbe:") : text.index("readinessProbe:")]
    return float(re.search(r"%s:\s*(\d+)" % field, block).group(1))


def chart_liveness_timeout():
    return chart_liveness("timeoutSeconds")


def read_int(path):
    with open(path) as f:
        return int(f.read().split()[0])


def oom_kills(cgroup):
    """how many processes the kernel killed in CGROUP for want of memory."""
    with open(os.path.join(cgroup, "memory.oom_control")) as f:
        for line in f:
            name, _, value = line.partition(" ")
            if name == "oom_kill":
                return int(value)
    return 0


class OperatorSecurityTest(OperatorTestCase):
    http_port = free_port()
    http_listen = "127.0.0.1:%d" % http_port

    def test_operator_servers_survive_hostile_clients_while_a_job_trains(self):
        name = "besieged"
        manifest = job_manifest(name, steps=900, delay_ms=8, replicas=(2, 2))
        self.reset_nodes(("gpu-1", 2))
        static = local_sha_meanwhile(manifest)
        self.apply(manifest)
        self.wait_workers(name, 2)
        self.wait_step(name, 20)
        # No credential: the coordinator refuses every attack from its head alone. A probe fails
        # as the chart's liveness probe would (its timeoutSeconds, not Kubernetes' default of
        # 1 s: on a machine this loaded, 4 training processes and a control plane on 2 cores, a
        # second is the scheduler's, not the operator's).
        timeout = chart_liveness_timeout()
        coordinator = Target(
            "coordinator",
            self.coordinator_port,
            tls=True,
            attack_path="/v1/jobs/%s/%s/store/x" % (NS, name),
            probe_timeout=timeout,
        )
        probes = Target(
            "operator probes", self.http_port, attack_path="/metrics", probe_timeout=timeout
        )
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
            # Checked at least as often as the kubelet would.
            self.assertLess(entry["longest_gap"], chart_liveness("periodSeconds"), (server, entry))
            self.assertEqual(entry["failures"], [], server)
            sys.stderr.write("%s: slowest probe %.2f s\n" % (server, entry["slowest"]))
        status = self.wait_succeeded(name)
        self.assertEqual(status["weightsSha256"], static.result(timeout=900))
        self.delete_job(name)

    def test_an_operator_under_512mi_survives_a_full_store_and_a_second_job_waits(self):
        """The operator in a memory cgroup of 512 MiB (the chart's limit), its coordinator's
        budget small enough for one job to fill; one of the job's workers writes keys from 32
        connections at once until the coordinator refuses even the smallest. The operator is
        never killed and keeps answering. A second job's worker, finding no room, waits instead
        of failing; once the first job is deleted it trains, and both end as a static run."""
        if not os.access(MEMORY_CGROUPS, os.W_OK):
            self.skipTest("no writable cgroup v1 memory controller at " + MEMORY_CGROUPS)
        cgroup = os.path.join(MEMORY_CGROUPS, "vf-e2e-operator-%d" % os.getpid())
        os.makedirs(cgroup, exist_ok=True)
        self.addCleanup(lambda: os.path.isdir(cgroup) and os.rmdir(cgroup))
        with open(os.path.join(cgroup, "memory.limit_in_bytes"), "w") as f:
            f.write(str(OPERATOR_LIMIT))
        self.operator.stop()
        self.start_operator(
            extra=("--coordinator-memory-budget", "48Mi"),
            prefix=("sh", "-c", 'echo $$ > %s/cgroup.procs && exec "$@"' % cgroup, "sh"),
        )
        self.addCleanup(self.operator.stop)

        first, second = "filled", "patient"
        manifest = job_manifest(first, steps=900, delay_ms=8, replicas=(2, 2))
        waiting = job_manifest(second, steps=60, replicas=(1, 1))
        self.reset_nodes(("gpu-1", 2), ("gpu-2", 1))
        static = local_sha_meanwhile(manifest)
        self.apply(manifest)
        self.wait_workers(first, 2)
        self.wait_step(first, 20)
        answers = self.fill_store(first)
        self.assertTrue(all(code == 409 for code, _ in answers), answers[:5])
        self.assertTrue(any("budget" in text for _, text in answers), answers[:5])

        # The second job's worker finds no room: it waits, and its job does not fail.
        self.apply(waiting)
        self.cp.wait_for(
            "the second job's worker to wait for room",
            lambda: "waiting for room at the coordinator" in self.pod_logs(second),
            timeout=120,
        )
        time.sleep(5)
        self.assertNotEqual(self.status(second).get("phase"), "Failed", self.status(second))
        self.assertTrue(self.operator.alive(), self.operator.tail(40))
        self.assertEqual(oom_kills(cgroup), 0)
        self.assertLess(
            probe(Target("coordinator", self.coordinator_port, tls=True)),
            chart_liveness_timeout(),
        )
        peak = read_int(os.path.join(cgroup, "memory.max_usage_in_bytes"))
        sys.stderr.write("operator's peak memory: %.1f MiB of 512\n" % (peak / 2**20))

        # The first job's weights are still a static run's; deleting it makes room.
        status = self.wait_succeeded(first)
        self.assertEqual(status["weightsSha256"], static.result(timeout=900))
        second_static = local_sha_meanwhile(waiting)
        self.delete_job(first)
        status = self.wait_succeeded(second)
        self.assertEqual(status["weightsSha256"], second_static.result(timeout=900))
        self.delete_job(second)
        self.assertEqual(oom_kills(cgroup), 0)

    def fill_store(self, name):
        """Writes keys to job NAME's store as one of its workers, 1 MiB at a time from 32
        connections at once, then ever smaller ones, until the coordinator refuses even 256
        bytes; returns the refusals (status, body)."""
        worker = self.status(name)["assignment"][0]["worker"]
        secret = json.loads(
            self.cp.kubectl(
                "get", "secret", "-n", NS, worker + "-vf-credential", "-o", "json", check=True
            ).stdout
        )
        token = base64.b64decode(secret["data"]["token"]).decode()
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE

        def put(key, size):
            request = urllib.request.Request(
                "https://127.0.0.1:%d/v1/jobs/%s/%s/store/%s"
                % (self.coordinator_port, NS, name, key),
                data=b"x" * size,
                method="PUT",
                headers={"Authorization": "Bearer " + token, "X-VirtualFlow-Worker": worker},
            )
            try:
                urllib.request.urlopen(request, timeout=60, context=context).read()
                return None
            except urllib.error.HTTPError as e:
                return (e.code, e.read().decode())

        refusals = []
        for size in (1 << 20, 64 << 10, 4 << 10, 256):
            full = threading.Event()

            def write(i, size=size, full=full):
                for n in range(1000):
                    if full.is_set():
                        return
                    refused = put("fill-%d-%d-%d" % (size, i, n), size)
                    if refused is not None:
                        refusals.append(refused)
                        if refused[0] == 409:
                            full.set()

            with concurrent.futures.ThreadPoolExecutor(32) as pool:
                list(pool.map(write, range(32)))
            self.assertTrue(full.is_set(), "the store took 32000 keys of %d bytes" % size)
        return refusals
