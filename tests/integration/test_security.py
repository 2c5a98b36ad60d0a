"""The project's HTTP servers against hostile clients on the network, while a job trains through
them: `vf run`'s coordinator (the server the operator runs) and a worker's metrics and probe
endpoint (the server the operator's probes use too). Each server is sent a negative and an
oversized chunk size, 1 MiB of header fields, 100 MB of body (declared and chunked) and 200
clients sending one byte a second; a watcher in its own process asks each for /healthz every
0.2 s throughout, and every answer must come within a second. The job ends with the weights of
an undisturbed static run."""

import os
import subprocess
import sys
import textwrap
import threading
import time
import unittest

from harness import SOURCE_DIR, VF, VfTestCase, vf, write
from http_attacks import (
    PROBE_PERIOD,
    PROBE_TIMEOUT,
    HealthWatch,
    Target,
    hundred_megabyte_body,
    megabyte_of_headers,
    negative_chunk_size,
    oversized_chunk_size,
    probe,
    slow_clients,
)
from test_elastic import SLOW, Background, credential, credential_file, elastic_job

# The control plane's free_port (ports no outgoing connection takes meanwhile).
sys.path.insert(0, os.path.join(SOURCE_DIR, "tests", "e2e"))
from controlplane import free_port  # noqa: E402

SLOW_CLIENTS = 200
PYTHON = os.environ.get("VF_PYTHON", "")

# A user's PyTorch loop whose nodes pause NODE_PAUSE_S (a sleep: no weight changes), so that
# the job is still training when the attacks end.
PACED = textwrap.dedent("""\
    import os, time, torch, torch.nn.functional as F
    import virtualflow.torch as vf

    job = vf.init()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(64, 4)
    y = torch.randint(0, 2, (64,))
    pause = float(os.environ.get("NODE_PAUSE_S", "0"))
    for step in job.steps(vf.State(model=model, optimizer=opt), dataset_size=64):
        for node in step.virtual_nodes():
            idx = node.indices
            node.backward(F.cross_entropy(model(x[idx]), y[idx]))
            time.sleep(pause)
        opt.step()
        opt.zero_grad()
    job.finish()
    """)
# Past the servers' deadline for a request head (10 s): every slow client must be cut off.
SLOW_SECONDS = 16


class HttpAttackTest(VfTestCase):
    def start_watched_worker(self, info, job, port):
        """a worker of the job whose agent serves metrics and probes on PORT."""
        agent = os.path.join(os.path.dirname(VF), "virtualflow-agent")
        proc = subprocess.Popen(
            [
                agent,
                "--job",
                job,
                "--coordinator",
                info["coordinator"],
                "--job-id",
                info["job"],
                "--worker",
                "watched",
                "--token-file",
                credential_file(self.tmp, info, "watched"),
                "--metrics-port",
                str(port),
                "--timeout",
                "600",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

        def stop():
            # It may still wait for a plan once the job is over: a joiner ends on SIGTERM.
            if proc.poll() is None:
                proc.terminate()
            proc.wait(timeout=60)

        self.addCleanup(stop)
        deadline = time.monotonic() + 60
        while True:
            try:
                probe(Target("agent", port))
                return proc
            except Exception:  # noqa: BLE001 - not serving yet
                self.assertLess(time.monotonic(), deadline, "the agent never served /healthz")
                self.assertIsNone(proc.poll(), "the watched agent exited")
                time.sleep(0.2)

    def attack(self, target, expect_chunk):
        """every attack but the slow clients against TARGET, with the answers it must give;
        EXPECT_CHUNK: the status for a malformed chunk size (400 where a body is read, 413 where
        none is taken)."""
        self.assertEqual(negative_chunk_size(target), expect_chunk, target.name)
        self.assertIn(oversized_chunk_size(target), (400, 413), target.name)
        self.assertEqual(megabyte_of_headers(target), 431, target.name)
        for chunked in (False, True):
            status, sent = hundred_megabyte_body(target, chunked)
            self.assertEqual(status, 413, "%s, chunked %s" % (target.name, chunked))
            # Refused long before the end: the server did not read 100 MB to say no.
            self.assertLess(sent, 20 * 1000 * 1000, target.name)

    def test_every_server_survives_hostile_clients_while_a_job_trains(self):
        job = elastic_job(self.tmp, replicas="{min: 1, max: 3}", steps="900")
        static = vf("run", job, "--workers", "3", "--progress-interval", "0")
        self.assertSucceeded(static)
        bg = Background(self.tmp, job, "--workers", "2", "--slowdown", SLOW)
        info = bg.info()
        coordinator_port = int(info["coordinator"].rsplit(":", 1)[1])
        # An authenticated worker's head, so that the coordinator reads the attacks' bodies.
        auth = (
            b"Authorization: Bearer %s\r\nX-VirtualFlow-Worker: attacker\r\n"
            % credential(info, "attacker").encode()
        )
        coordinator = Target(
            "coordinator",
            coordinator_port,
            attack_path="/v1/jobs/%s/store/attack" % info["job"],
            attack_headers=auth,
        )
        agent_port = free_port()
        self.start_watched_worker(info, job, agent_port)
        agent = Target("agent metrics", agent_port, attack_path="/metrics")

        watch = HealthWatch([coordinator, agent])
        slow = {}
        threads = [
            threading.Thread(
                target=lambda t=t: slow.update(
                    {t.name: slow_clients(t, SLOW_CLIENTS // 2, SLOW_SECONDS)}
                )
            )
            for t in (coordinator, agent)
        ]
        for thread in threads:
            thread.start()
        try:
            self.attack(coordinator, expect_chunk=400)
            self.attack(agent, expect_chunk=413)
        finally:
            for thread in threads:
                thread.join()
            health = watch.stop()

        for name, (closed, connected) in slow.items():
            self.assertEqual(connected, SLOW_CLIENTS // 2, name)
            self.assertEqual(closed, connected, "%s kept slow clients past its deadline" % name)
        for name, entry in health.items():
            self.assertLess(entry["longest_gap"], PROBE_PERIOD, (name, entry))
            self.assertEqual(entry["failures"], [], name)
            self.assertLess(entry["slowest"], PROBE_TIMEOUT, name)
        self.assertIsNone(bg.proc.poll(), "the job ended before the attacks did: lengthen it")
        # The job trained through all of it, to the static run's weights.
        code, out, err, summary = bg.wait()
        self.assertEqual(code, 0, out + err)
        self.assertEqual(summary["weights_sha256"], static.summary["weights_sha256"])


@unittest.skipUnless(PYTHON, "no Python environment with PyTorch (scripts/setup-python.sh)")
class PythonWorkerAttackTest(VfTestCase):
    def test_a_python_workers_metrics_endpoint_survives_hostile_clients(self):
        """A virtualflow.torch worker serves metrics and probes on VF_METRICS_PORT, from the
        agent library inside the user's process: the same attacks, while it trains."""
        script = write(os.path.join(self.tmp, "paced.py"), PACED)
        job = write(
            os.path.join(self.tmp, "job.yaml"),
            "apiVersion: virtualflow.io/v1alpha1\nkind: VirtualFlowJob\n"
            "metadata: {name: paced}\nspec:\n  virtualNodes: 4\n  globalBatchSize: 16\n"
            "  replicas: {min: 1, max: 1}\n  steps: 200\n  seed: 3\n"
            "  template:\n    spec:\n      containers: [{name: worker, command: [python3, %s]}]\n"
            % script,
        )
        path = os.path.dirname(PYTHON) + os.pathsep + os.environ["PATH"]
        saved = os.environ["PATH"]
        os.environ["PATH"] = path
        try:
            static = vf("run", job, "--workers", "1", "--progress-interval", "0")
        finally:
            os.environ["PATH"] = saved
        self.assertSucceeded(static)
        port = free_port()
        bg = Background(
            self.tmp,
            job,
            "--workers",
            "1",
            env={"PATH": path, "VF_METRICS_PORT": str(port), "NODE_PAUSE_S": "0.04"},
        )
        worker = Target("python worker", port, attack_path="/metrics")
        deadline = time.monotonic() + 120
        while True:
            try:
                probe(worker)
                break
            except Exception:  # noqa: BLE001 - not serving yet
                self.assertLess(time.monotonic(), deadline, "the worker never served /healthz")
                self.assertIsNone(bg.proc.poll(), "".join(bg.out))
                time.sleep(0.2)
        watch = HealthWatch([worker])
        slow = {}
        thread = threading.Thread(
            target=lambda: slow.update(result=slow_clients(worker, 100, SLOW_SECONDS))
        )
        thread.start()
        try:
            self.assertEqual(negative_chunk_size(worker), 413)
            self.assertIn(oversized_chunk_size(worker), (400, 413))
            self.assertEqual(megabyte_of_headers(worker), 431)
            for chunked in (False, True):
                status, sent = hundred_megabyte_body(worker, chunked)
                self.assertEqual(status, 413)
                self.assertLess(sent, 20 * 1000 * 1000)
        finally:
            thread.join()
            health = watch.stop()
        self.assertEqual(slow["result"], (100, 100))
        entry = health["python worker"]
        self.assertLess(entry["longest_gap"], PROBE_PERIOD, entry)
        self.assertEqual(entry["failures"], [])
        self.assertLess(entry["slowest"], PROBE_TIMEOUT)
        self.assertIsNone(bg.proc.poll(), "the job ended before the attacks did: lengthen it")
        code, out, err, summary = bg.wait()
        self.assertEqual(code, 0, out + err)
        self.assertEqual(summary["weights_sha256"], static.summary["weights_sha256"])


if __name__ == "__main__":
    unittest.main()
