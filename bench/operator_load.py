#!/usr/bin/env python3
"""Load benchmark of the operator: JOBS VirtualFlowJobs on NODES fake GPU nodes in the real
control plane that the end-to-end suite starts (etcd, kube-apiserver, kube-controller-manager,
kube-scheduler; tests/e2e/controlplane.py). It reports the time from the first job's creation
until every job has all its worker pods bound to nodes by the real scheduler, the operator's peak
resident memory, and its API request rate (from its own request counter, sampled each second)
against its --kube-api-qps/--kube-api-burst budget.

No pod runs: the fake nodes have no pod runner, so the pods stay bound and Pending, which is all
the operator's part of a resize needs. Each job asks for exactly WORKERS workers of one GPU
(replicas min = max), so "has its workers" has one meaning whatever the policy decides.

    bench/operator_load.py                        # 1000 jobs, 500 nodes of 8 GPUs, 2 workers each
    bench/operator_load.py --jobs 20 --nodes 10   # a quick check
    bench/operator_load.py --kube-api-qps 100 --kube-api-burst 200 --reconcile-workers 32

Prints one line per phase and a summary; --json FILE writes the summary as JSON."""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import sys
import threading
import time
import urllib.request
from typing import Any

SOURCE_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(SOURCE_DIR, "tests", "e2e"))

from controlplane import Component, ControlPlane, free_port  # noqa: E402

BIN_DIR = os.environ.get("VF_BIN_DIR", os.path.join(SOURCE_DIR, "build", "bin"))
CRD_FILE = os.path.join(SOURCE_DIR, "crds", "virtualflowjob.yaml")
NS = "load"
JOB_LABEL = "virtualflow.io/job"
REQUESTS = re.compile(
    r'^vf_operator_api_request_duration_seconds_count\{verb="([^"]*)"\} (\S+)$', re.M
)


def job_manifest(name: str, workers: int) -> dict[str, Any]:
    return {
        "apiVersion": "virtualflow.io/v1alpha1",
        "kind": "VirtualFlowJob",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "virtualNodes": 8,
            "globalBatchSize": 256,
            "replicas": {"min": workers, "max": workers},
            "gpusPerWorker": 1,
            "model": {"name": "mlp", "hiddenSizes": [128]},
            "dataset": {"name": "synthetic"},
            "steps": 1000,
            "template": {
                "spec": {"containers": [{"name": "worker", "image": "virtualflow/agent:load"}]}
            },
        },
    }


def parallel(count: int, fn: Any, threads: int = 16) -> None:
    """Runs fn(i) for i in range(count) on a thread pool; the first error is raised."""
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        for future in [pool.submit(fn, i) for i in range(count)]:
            future.result()


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time PID has used so far."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def memory_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of PID in KiB: now and the peak since it started."""
    fields = {}
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = int(value.split()[0])
    return fields["VmRSS"], fields["VmHWM"]


def requests_by_verb(metrics_url: str) -> dict[str, float]:
    """The API requests the operator's main client made so far, by verb (its own counter)."""
    with urllib.request.urlopen(metrics_url, timeout=10) as reply:
        text = reply.read().decode()
    out: dict[str, float] = {}
    for verb, value in REQUESTS.findall(text):
        out[verb] = out.get(verb, 0) + float(value)
    return out


def requests_sent(metrics_url: str) -> float:
    """Every API request the operator's main client made (its own counter)."""
    return sum(requests_by_verb(metrics_url).values())


class Bindings:
    """Job name -> its worker pods that the scheduler has bound to a node, kept current by a
    watch on the namespace's pods on a thread of its own: polling with a list of every pod each
    second would load the API server (on 2 cores) as much as the operator does. Thread-safe."""

    def __init__(self, cp: ControlPlane) -> None:
        self._cp = cp
        self._lock = threading.Lock()
        self._nodes: dict[str, tuple[str, str]] = {}  # pod -> (job, node)
        self._stop = threading.Event()
        self._error: BaseException | None = None
        listed = cp.get("/api/v1/namespaces/%s/pods?labelSelector=%s" % (NS, JOB_LABEL))
        self._version = listed["metadata"]["resourceVersion"]
        for pod in listed["items"]:
            self._apply("ADDED", pod)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _apply(self, kind: str, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        job = pod["metadata"].get("labels", {}).get(JOB_LABEL, "")
        with self._lock:
            if kind == "DELETED":
                self._nodes.pop(name, None)
            else:
                self._nodes[name] = (job, pod["spec"].get("nodeName") or "")

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                path = (
                    "/api/v1/namespaces/%s/pods?watch=1&labelSelector=%s&resourceVersion=%s"
                    "&timeoutSeconds=60" % (NS, JOB_LABEL, self._version)
                )
                with self._cp.stream(path, timeout=90) as events:
                    for line in events:
                        event = json.loads(line)
                        if event["type"] == "ERROR":
                            raise RuntimeError("pod watch: %s" % event["object"])
                        self._version = event["object"]["metadata"]["resourceVersion"]
                        self._apply(event["type"], event["object"])
                        if self._stop.is_set():
                            return
        except BaseException as e:  # raised to the measuring thread by counts()
            self._error = e

    def pods(self) -> int:
        """Worker pods that exist, bound or not."""
        with self._lock:
            return len(self._nodes)

    def counts(self) -> dict[str, int]:
        if self._error is not None:
            raise RuntimeError("watching pods failed: %s" % self._error)
        out: dict[str, int] = {}
        with self._lock:
            for job, node in self._nodes.values():
                if node:
                    out[job] = out.get(job, 0) + 1
        return out

    def stop(self) -> None:
        self._stop.set()


def start_operator(cp: ControlPlane, args: argparse.Namespace) -> tuple[Component, str]:
    http_port = free_port()
    argv = [
        os.path.join(BIN_DIR, "virtualflow-operator"),
        "--kubeconfig",
        cp.kubeconfig,
        "--coordinator-listen",
        "127.0.0.1:%d" % free_port(),
        "--http-listen",
        "127.0.0.1:%d" % http_port,
        "--agent-metrics-port",
        "-1",
        "--leader-election-namespace",
        "default",
        "--namespace",
        NS,
        "--kube-api-qps",
        str(args.kube_api_qps),
        "--kube-api-burst",
        str(args.kube_api_burst),
    ]
    if args.reconcile_workers:
        argv += ["--workers", str(args.reconcile_workers)]
    operator = Component("operator", argv, os.path.join(cp.logs, "operator.log"))
    base = "http://127.0.0.1:%d" % http_port

    def ready() -> bool:
        # A standby is ready too: lead first (the metric), then ready (caches synced), read in
        # that order so that a replica still campaigning is not taken for a synced leader.
        operator.check_alive()
        try:
            with urllib.request.urlopen(base + "/metrics", timeout=2) as reply:
                if "\nvf_operator_is_leader 1" not in reply.read().decode():
                    return False
            with urllib.request.urlopen(base + "/readyz", timeout=2) as reply:
                return reply.status == 200
        except OSError:
            return False

    cp.wait_for("the operator to lead and sync", ready, timeout=60)
    return operator, base + "/metrics"


def run(args: argparse.Namespace) -> dict[str, Any]:
    with ControlPlane() as cp:
        cp.create_namespace(NS)
        cp.kubectl("apply", "-f", CRD_FILE, check=True)
        cp.wait_for(
            "virtualflowjobs to be served", lambda: cp.kubectl("get", "vfj", "-A").returncode == 0
        )
        start = time.monotonic()
        parallel(
            args.nodes,
            lambda i: cp.add_gpu_node("gpu-%04d" % i, args.gpus_per_node, pod_runner=False),
        )
        print(
            "%d nodes of %d GPUs in %.1f s"
            % (args.nodes, args.gpus_per_node, time.monotonic() - start),
            flush=True,
        )
        operator, metrics_url = start_operator(cp, args)
        try:
            return measure(cp, operator, metrics_url, args)
        finally:
            operator.stop()


def measure(
    cp: ControlPlane, operator: Component, metrics_url: str, args: argparse.Namespace
) -> dict[str, Any]:
    bindings = Bindings(cp)
    try:
        return measure_with(cp, operator, metrics_url, bindings, args)
    finally:
        bindings.stop()


def measure_with(
    cp: ControlPlane,
    operator: Component,
    metrics_url: str,
    bindings: Bindings,
    args: argparse.Namespace,
) -> dict[str, Any]:
    pid = operator.proc.pid
    verbs_before = requests_by_verb(metrics_url)
    requests_before = sum(verbs_before.values())
    cpu_before = cpu_seconds(pid)
    path = "/apis/virtualflow.io/v1alpha1/namespaces/%s/virtualflowjobs" % NS
    start = time.monotonic()
    parallel(
        args.jobs, lambda i: cp.request("POST", path, job_manifest("job-%04d" % i, args.workers))
    )
    created = time.monotonic() - start
    print("%d jobs created in %.1f s" % (args.jobs, created), flush=True)
    samples = []  # (seconds since start, requests so far)
    peak_rate = 0.0
    done_at = None
    loads = [os.getloadavg()[0]]  # the 1-minute load average, once a second
    while time.monotonic() - start < args.timeout and done_at is None:
        operator.check_alive()
        now = time.monotonic() - start
        sent = requests_sent(metrics_url) - requests_before
        if samples and now > samples[-1][0]:
            peak_rate = max(peak_rate, (sent - samples[-1][1]) / (now - samples[-1][0]))
        samples.append((now, sent))
        loads.append(os.getloadavg()[0])
        complete = 0
        # The bindings are counted locally (a watch), so the end is seen within 0.1 s; the
        # operator's counter is read once a second.
        for _ in range(10):
            complete = sum(1 for n in bindings.counts().values() if n >= args.workers)
            if complete == args.jobs:
                done_at = time.monotonic() - start
                break
            time.sleep(0.1)
        print(
            "%6.1f s: %d of %d jobs have their %d workers (%d pods, %d bound), %d API requests, "
            "load %.1f"
            % (
                now,
                complete,
                args.jobs,
                args.workers,
                bindings.pods(),
                sum(bindings.counts().values()),
                sent,
                loads[-1],
            ),
            flush=True,
        )
    rss, hwm = memory_kib(pid)
    cpu = cpu_seconds(pid) - cpu_before
    verbs = requests_by_verb(metrics_url)
    sent = sum(verbs.values()) - requests_before
    by_verb = {verb: int(n - verbs_before.get(verb, 0)) for verb, n in sorted(verbs.items())}
    elapsed = done_at if done_at is not None else time.monotonic() - start
    return {
        "jobs": args.jobs,
        "nodes": args.nodes,
        "gpus_per_node": args.gpus_per_node,
        "workers_per_job": args.workers,
        "reconcile_workers": args.reconcile_workers or "default",
        "kube_api_qps": args.kube_api_qps,
        "kube_api_burst": args.kube_api_burst,
        "create_seconds": round(created, 1),
        "all_workers_seconds": round(done_at, 1) if done_at is not None else None,
        "operator_cpu_seconds": round(cpu, 1),
        "operator_peak_rss_mib": round(hwm / 1024, 1),
        "operator_rss_mib": round(rss / 1024, 1),
        "api_requests": int(sent),
        "api_requests_by_verb": by_verb,
        "api_requests_per_second": round(sent / elapsed, 1),
        "api_requests_per_second_peak_1s": round(peak_rate, 1),
        "load_average_1m": {
            "min": min(loads),
            "max": max(loads),
            "mean": round(sum(loads) / len(loads), 2),
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=1000, help="VirtualFlowJobs to create")
    parser.add_argument("--nodes", type=int, default=500, help="fake GPU nodes")
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2, help="workers (GPUs) of each job")
    parser.add_argument(
        "--kube-api-qps",
        type=float,
        default=150,
        help="the operator's --kube-api-qps (its default: 150)",
    )
    parser.add_argument(
        "--kube-api-burst",
        type=int,
        default=300,
        help="the operator's --kube-api-burst (its default: 300)",
    )
    parser.add_argument(
        "--reconcile-workers",
        type=int,
        default=0,
        help="the operator's --workers, jobs reconciled at once (0: its default)",
    )
    parser.add_argument(
        "--timeout", type=float, default=900, help="give up after this many seconds"
    )
    parser.add_argument("--json", help="write the summary here as JSON")
    args = parser.parse_args()
    for name in ("jobs", "nodes", "gpus_per_node", "workers"):
        if getattr(args, name) < 1:
            parser.error("--%s must be at least 1" % name.replace("_", "-"))
    if args.jobs * args.workers > args.nodes * args.gpus_per_node:
        parser.error(
            "%d jobs of %d workers need more GPUs than %d nodes of %d have"
            % (args.jobs, args.workers, args.nodes, args.gpus_per_node)
        )
    summary = run(args)
    print(json.dumps(summary, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)
    return 0 if summary["all_workers_seconds"] is not None else 1


if __name__ == "__main__":
    sys.exit(main())
