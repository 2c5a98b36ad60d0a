"""A real Prometheus (Debian's `prometheus` package) scrapes the operator and every worker of an
elastic VirtualFlowJob on the real control plane while the job grows from 2 to 4 workers and
shrinks back to 2; the test then asks Prometheus, through its HTTP API, what happened.

- Every exposition passes `promtool check metrics` (the operator's mid-run and at the end, each
  worker's once it has trained).
- Prometheus saw the resizes (vf_operator_resizes_total by reason, the workers gauge going
  2 -> 4 -> 2, the pause histogram), the step rate in every membership, the job's last step,
  and the virtual nodes summing to the job's 8 under 2 and under 4 workers.
- Every query of the Grafana dashboard parses in Prometheus (Grafana's variables substituted),
  names only metrics Prometheus has scraped (metadata included, so a labelled family without
  series counts) or DCGM exporter's, and every one on VirtualFlow's metrics returns data.
- The metrics reference (docs/metrics.md) lists exactly the families Prometheus scraped, with
  their types.
- Both endpoints report vf_build_info with the version `vf --version` prints, and the operator
  the job's total steps.
- Once the finished job's spec.runPolicy.ttlSecondsAfterFinished has passed, the operator
  deletes it and its series leave the operator's /metrics.

Scraping uses Prometheus' default settings (no honor_labels): the metrics' job_namespace and
job_name labels must reach Prometheus as they are, beside its own `job` and `instance`
target labels, with nothing renamed to exported_*. Workers are found through a
file_sd target file the test writes from the pods' logs ("metrics on port N"), since the pod
runner gives every pod the host's loopback address and the agents ephemeral ports; the operator
is a static target.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import unittest
import urllib.error
import urllib.parse
import urllib.request

from controlplane import Component, ControlPlaneTestCase, free_port
from promql import dashboard_queries, metric_names
from test_operator import BIN_DIR, CRD_FILE, NS, SOURCE_DIR, job_manifest

DASHBOARD = os.path.join(SOURCE_DIR, "charts", "virtualflow", "dashboards", "virtualflow.json")
METRICS_DOC = os.path.join(SOURCE_DIR, "docs", "metrics.md")
JOB = "prom"
VIRTUAL_NODES = 8
STEPS = 1000
SCRAPE_SECONDS = 1


def http_get(url, timeout=5):
    """(status, body) of a GET; (0, reason) when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError as e:
        return 0, str(e)


def promtool_check(text):
    """(exit status, output) of `promtool check metrics` on an exposition."""
    proc = subprocess.run(
        ["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    return proc.returncode, (proc.stdout + proc.stderr).strip()


def documented_metrics():
    """{name: type} of the metrics table in docs/metrics.md."""
    with open(METRICS_DOC) as f:
        return {
            m.group(1): m.group(2)
            for m in re.finditer(
                r"^\| `(vf_[a-z0-9_]+)` \| (counter|gauge|histogram) \|", f.read(), re.M
            )
        }


def changes(values):
    """VALUES without consecutive repeats."""
    out = []
    for v in values:
        if not out or out[-1] != v:
            out.append(v)
    return out


def is_subsequence(wanted, values):
    it = iter(values)
    return all(any(v == w for v in it) for w in wanted)


class Prometheus:
    """One Prometheus server with its own configuration and storage, and its HTTP API."""

    def __init__(self, directory, log_path, scrape_configs):
        self.dir = directory
        self.port = free_port()
        self.url = "http://127.0.0.1:%d" % self.port
        config = {
            "global": {
                "scrape_interval": "%ds" % SCRAPE_SECONDS,
                "scrape_timeout": "%ds" % SCRAPE_SECONDS,
                "evaluation_interval": "%ds" % SCRAPE_SECONDS,
            },
            "scrape_configs": scrape_configs,
        }
        path = os.path.join(directory, "prometheus.yml")
        with open(path, "w") as f:
            json.dump(config, f, indent=1)  # JSON is YAML
        rc, out = self._promtool("check", "config", path)
        if rc != 0:
            raise AssertionError("promtool check config:\n" + out)
        self.component = Component(
            "prometheus",
            [
                "prometheus",
                "--config.file=" + path,
                "--storage.tsdb.path=" + os.path.join(directory, "data"),
                "--web.listen-address=127.0.0.1:%d" % self.port,
                "--storage.tsdb.retention.time=1d",
            ],
            log_path,
        )

    @staticmethod
    def _promtool(*args):
        proc = subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=60)
        return proc.returncode, proc.stdout + proc.stderr

    def ready(self):
        self.component.check_alive()
        return http_get(self.url + "/-/ready", timeout=2)[0] == 200

    def api(self, path, **params):
        """The `data` of a successful API answer; raises with Prometheus' error otherwise."""
        url = "%s/api/v1/%s?%s" % (self.url, path, urllib.parse.urlencode(params))
        status, body = http_get(url, timeout=30)
        try:
            answer = json.loads(body)
        except ValueError as e:
            raise AssertionError("%s: HTTP %s: %s" % (url, status, body[:300])) from e
        if answer.get("status") != "success":
            raise AssertionError(
                "%s: %s: %s"
                % (params.get("query", path), answer.get("errorType"), answer.get("error"))
            )
        return answer["data"]

    def query(self, expr, at=None):
        params = {"query": expr}
        if at is not None:
            params["time"] = "%.3f" % at
        return self.api("query", **params)["result"]

    def query_range(self, expr, start, end, step=SCRAPE_SECONDS):
        return self.api(
            "query_range", query=expr, start="%.3f" % start, end="%.3f" % end, step=str(step)
        )["result"]

    def tail(self, lines=40):
        return self.component.tail(lines)

    def stop(self):
        self.component.stop()


class WorkerTargets(threading.Thread):
    """Keeps a file_sd target file with the running worker pods of JOB (their metrics port read
    from their logs), and runs promtool on each worker's exposition once it has trained."""

    def __init__(self, cp, path):
        super().__init__(daemon=True)
        self.cp = cp
        self.path = path
        self.ports = {}  # pod -> metrics port
        self.checked = {}  # pod -> (promtool status, output, exposition)
        self.error = None
        self._stop_event = threading.Event()
        self._written = None
        self._write([])

    def _write(self, targets):
        if targets == self._written:
            return
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(targets, f)
        os.replace(tmp, self.path)  # Prometheus must never read half a file
        self._written = targets

    def run(self):
        while not self._stop_event.wait(0.3):
            try:
                self._poll()
            except Exception as e:  # the test reports it; the control plane may be stopping
                self.error = "%s: %s" % (type(e).__name__, e)

    def _poll(self):
        pods = self.cp.request(
            "GET",
            "/api/v1/namespaces/%s/pods?labelSelector=%s" % (NS, "virtualflow.io/job%3D" + JOB),
        )["items"]
        targets = []
        for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
            name = pod["metadata"]["name"]
            if pod["status"].get("phase") != "Running":
                continue
            found = re.findall(r"metrics on port (\d+)", self.cp.pod_log(NS, name, "worker"))
            if not found:
                continue
            port = self.ports[name] = int(found[-1])
            # Each pod has its own network namespace: its agent is reached at the pod's address.
            address = "%s:%d" % (pod["status"].get("podIP", "127.0.0.1"), port)
            targets.append({"targets": [address], "labels": {"pod": name}})
            if name not in self.checked:
                status, text = http_get("http://%s/metrics" % address)
                steps = re.search(r"^vf_agent_steps_total\{[^}]*\} (\S+)$", text, re.M)
                if status == 200 and steps and float(steps.group(1)) > 0:
                    self.checked[name] = promtool_check(text) + (text,)
        self._write(targets)

    def stop(self):
        self._stop_event.set()
        self.join(10)


@unittest.skipUnless(
    os.access(os.path.join(BIN_DIR, "virtualflow-operator"), os.X_OK),
    "virtualflow-operator is not built in %s" % BIN_DIR,
)
class PrometheusTest(ControlPlaneTestCase):
    @classmethod
    def setUpClass(cls):
        for tool in ("prometheus", "promtool"):
            if shutil.which(tool) is None:
                raise RuntimeError(
                    "%s not found: scripts/setup.sh installs Debian's prometheus package" % tool
                )
        super().setUpClass()
        try:
            cls.start_and_run()
        except BaseException:
            # tearDownClass does not run when setUpClass fails.
            sys.stderr.write("setting up failed; logs:\n")
            cls.cp.dump_logs()
            for part in ("operator", "prometheus"):
                if getattr(cls, part, None) is not None:
                    sys.stderr.write("----- %s -----\n%s\n" % (part, getattr(cls, part).tail(40)))
            cls.tearDownClass()
            raise

    @classmethod
    def start_and_run(cls):
        cp = cls.cp
        cp.create_namespace(NS)
        cp.kubectl("apply", "-f", CRD_FILE, check=True)
        cp.wait_for(
            "virtualflowjobs to be served", lambda: cp.kubectl("get", "vfj", "-A").returncode == 0
        )
        cp.start_pod_runner(BIN_DIR, path=BIN_DIR, log_dir=os.path.join(cp.dir, "pods"))
        cls.operator_port = free_port()
        coordinator_port = free_port()
        # Not one of the control plane's components (those must never die), but stopped with it.
        cls.operator = Component(
            "operator",
            [
                os.path.join(BIN_DIR, "virtualflow-operator"),
                "--kubeconfig",
                cp.kubeconfig,
                # Pods reach the coordinator at the pod network's gateway, the host's address there.
                "--coordinator-listen",
                "0.0.0.0:%d" % coordinator_port,
                "--coordinator-url",
                "https://%s:%d" % (cp.pod_gateway, coordinator_port),
                "--http-listen",
                "127.0.0.1:%d" % cls.operator_port,
                "--agent-metrics-port",
                "0",
                "--join-batch-seconds",
                "3",
                "--leader-election-namespace",
                "default",
                "--identity",
                "operator-1",
            ],
            os.path.join(cp.logs, "operator.log"),
        )
        cls.targets_file = os.path.join(cp.dir, "workers.json")
        cls.targets = WorkerTargets(cp, cls.targets_file)
        cls.prometheus = Prometheus(
            cp.dir,
            os.path.join(cp.logs, "prometheus.log"),
            [
                {
                    "job_name": "virtualflow-operator",
                    "static_configs": [
                        {
                            "targets": ["127.0.0.1:%d" % cls.operator_port],
                            "labels": {"pod": "operator-1"},
                        }
                    ],
                },
                {
                    "job_name": "virtualflow-workers",
                    "file_sd_configs": [{"files": [cls.targets_file], "refresh_interval": "1s"}],
                },
            ],
        )
        cls.targets.start()
        cp.wait_for("Prometheus to be ready", cls.prometheus.ready, timeout=60)
        cls.run_elastic_job()

    @classmethod
    def tearDownClass(cls):
        for part in ("targets", "prometheus", "operator"):
            if getattr(cls, part, None) is not None:
                getattr(cls, part).stop()
        super().tearDownClass()

    # ------------------------------------------------------------------ the run

    @classmethod
    def status(cls):
        job = (
            cls.cp.get("/apis/virtualflow.io/v1alpha1/namespaces/%s/virtualflowjobs/%s" % (NS, JOB))
            or {}
        )
        return job.get("status") or {}

    @classmethod
    def wait_status(cls, what, predicate, timeout=240):
        def check():
            cls.operator.check_alive()
            status = cls.status()
            if status.get("phase") == "Failed":
                raise AssertionError("job failed: %s" % status.get("message"))
            return status if predicate(status) else None

        return cls.cp.wait_for("job %s: %s" % (JOB, what), check, timeout=timeout)

    @classmethod
    def wait_workers(cls, n):
        cls.wait_status(
            "%d workers running" % n,
            lambda s: s.get("workers") == n and s.get("phase") == "Running",
        )

    @classmethod
    def wait_steps(cls, n):
        start = cls.status().get("step", 0)
        cls.wait_status("%d more steps" % n, lambda s: s.get("step", 0) >= start + n)

    @classmethod
    def operator_exposition(cls):
        status, text = http_get("http://127.0.0.1:%d/metrics" % cls.operator_port)
        if status != 200:
            raise AssertionError("operator /metrics: HTTP %s: %s" % (status, text[:300]))
        return text

    @classmethod
    def run_elastic_job(cls):
        """2 workers, grow to 4 when a node joins, shrink to 2 when it is drained, to the end.
        Records the times each membership began (seconds since the epoch)."""
        cp = cls.cp
        for name, gpus in (("gpu-1", 2),):
            cp.add_gpu_node(name, gpus=gpus)
        cls.started = time.time()
        cp.kubectl(
            "apply",
            "-f",
            "-",
            check=True,
            input=json.dumps(job_manifest(JOB, steps=STEPS, delay_ms=8)),
        )
        cls.wait_workers(2)
        cls.phases = [(2, time.time())]
        prometheus = cls.prometheus
        # A step rate needs two scrapes of a worker: the first membership lasts until both
        # workers have been scraped twice, however fast the machine runs the steps.
        cp.wait_for(
            "Prometheus to scrape 2 workers twice",
            lambda: prometheus.query(
                'count(count_over_time(vf_agent_steps_total{job_namespace="%s",job_name="%s"}[5s])'
                " >= 2) == 2" % (NS, JOB)
            ),
            timeout=60,
        )
        cls.wait_steps(100)
        cp.add_gpu_node("gpu-2", gpus=2)
        cls.wait_workers(4)
        cls.phases.append((4, time.time()))
        cp.wait_for(
            "Prometheus to scrape 4 workers",
            lambda: prometheus.query('count(up{job="virtualflow-workers"} == 1) == 4'),
            timeout=60,
        )
        cls.wait_steps(150)
        cls.operator_mid_run = cls.operator_exposition()
        # Prometheus keeps metadata (HELP, TYPE) only for the targets it scrapes now.
        cls.metadata = prometheus.api("metadata")
        cp.drain("gpu-2", grace_period_seconds=30, timeout=120)
        cls.wait_workers(2)
        cls.phases.append((2, time.time()))
        cls.final_status = cls.wait_status(
            "Succeeded", lambda s: s.get("phase") == "Succeeded", timeout=600
        )
        cls.ended = time.time()
        # Two more scrapes of the operator, which keeps the job's series until it is deleted.
        time.sleep(3 * SCRAPE_SECONDS)
        cls.operator_at_end = cls.operator_exposition()
        cls.metadata.update(prometheus.api("metadata"))
        cls.targets.stop()
        cls.expire_job()

    @classmethod
    def expire_job(cls):
        """Gives the finished job a TTL that has run out; records the operator's exposition once
        the operator has deleted the job (or the last one seen when it did not)."""
        path = "/apis/virtualflow.io/v1alpha1/namespaces/%s/virtualflowjobs/%s" % (NS, JOB)
        cls.cp.patch(path, {"spec": {"runPolicy": {"ttlSecondsAfterFinished": 0}}})
        cls.job_deleted = False
        cls.operator_after_ttl = ""

        def gone():
            cls.operator.check_alive()
            cls.job_deleted = cls.cp.get(path) is None
            cls.operator_after_ttl = cls.operator_exposition()
            return cls.job_deleted and 'job_name="%s"' % JOB not in cls.operator_after_ttl

        try:
            cls.cp.wait_for(
                "the operator to delete job %s and drop its series" % JOB, gone, timeout=60
            )
        except TimeoutError as e:  # the test on it says what was left
            cls.ttl_error = str(e)
        else:
            cls.ttl_error = None

    def range(self, expr):
        """{frozenset of labels: [(time, float value)]} of EXPR over the whole run."""
        out = {}
        for series in self.prometheus.query_range(expr, self.started - 5, self.ended + 5):
            out[frozenset(series["metric"].items())] = [
                (float(t), float(v)) for t, v in series["values"]
            ]
        return out

    def single_range(self, expr):
        series = self.range(expr)
        self.assertEqual(len(series), 1, "%s: %s" % (expr, sorted(series)))
        return next(iter(series.values()))

    # ------------------------------------------------------------------ tests

    def test_every_exposition_passes_promtool(self):
        self.assertIsNone(self.targets.error)
        for where, text in (
            ("mid-run", self.operator_mid_run),
            ("at the end", self.operator_at_end),
        ):
            with self.subTest("operator " + where):
                self.assertIn("vf_operator_resizes_total{", text)
                rc, out = promtool_check(text)
                self.assertEqual(rc, 0, out)
        # Two first workers, two joiners (the drained ones) at least.
        self.assertGreaterEqual(len(self.targets.checked), 4, sorted(self.targets.ports))
        for pod, (rc, out, text) in sorted(self.targets.checked.items()):
            with self.subTest(pod):
                # In whichever order the exporter writes the two labels.
                self.assertRegex(
                    text,
                    r"(?m)^vf_agent_virtual_nodes\{(%s|%s)\} "
                    % (
                        re.escape('job_namespace="%s",job_name="%s"' % (NS, JOB)),
                        re.escape('job_name="%s",job_namespace="%s"' % (JOB, NS)),
                    ),
                )
                self.assertEqual(rc, 0, out)

    def test_prometheus_scraped_every_worker_and_the_operator(self):
        up = self.range('up{job="virtualflow-workers"}')
        pods = {
            dict(labels)["pod"] for labels, values in up.items() if any(v == 1 for _, v in values)
        }
        self.assertEqual(pods, set(self.targets.checked), "pods scraped vs pods seen training")
        operator = self.single_range('up{job="virtualflow-operator"}')
        self.assertTrue(all(v == 1 for _, v in operator), "the operator was down for a scrape")
        # Default scraping: the job's namespace and name as the metrics say, and Prometheus'
        # own `job` (the scrape job) beside them.
        labels = self.prometheus.query(
            "count by (job, job_namespace, job_name) (vf_agent_steps_total)", at=self.ended - 5
        )
        self.assertIn(
            {"job": "virtualflow-workers", "job_namespace": NS, "job_name": JOB},
            [s["metric"] for s in labels],
        )
        labels = self.prometheus.query(
            "count by (job, job_namespace, job_name) (vf_operator_job_step)", at=self.ended - 5
        )
        self.assertIn(
            {"job": "virtualflow-operator", "job_namespace": NS, "job_name": JOB},
            [s["metric"] for s in labels],
        )
        # No label of ours collided with a target label: nothing was renamed exported_*.
        renamed = self.prometheus.query(
            'count by (__name__) ({__name__=~"vf_.+", exported_job!=""} or '
            '{__name__=~"vf_.+", exported_namespace!=""} or {__name__=~"vf_.+", '
            'exported_instance!=""} or {__name__=~"vf_.+", exported_pod!=""})',
            at=self.ended - 5,
        )
        self.assertEqual(renamed, [])

    def test_resizes_are_visible(self):
        sel = 'job_namespace="%s",job_name="%s"' % (NS, JOB)
        by_reason = {
            s["metric"]["reason"]: float(s["value"][1])
            for s in self.prometheus.query(
                "sum by (reason) (vf_operator_resizes_total{%s})" % sel, at=self.ended
            )
        }
        self.assertGreaterEqual(by_reason.get("grow", 0), 1, by_reason)
        # The drain's workers leave gracefully (SIGTERM): "leave", or "shrink" when the operator
        # took them back first.
        self.assertGreaterEqual(
            by_reason.get("leave", 0) + by_reason.get("shrink", 0), 1, by_reason
        )
        pauses = self.prometheus.query(
            "vf_operator_resize_pause_seconds_count{%s}" % sel, at=self.ended
        )
        self.assertEqual(len(pauses), 1)
        self.assertGreaterEqual(float(pauses[0]["value"][1]), 2)
        workers = [
            v for _, v in self.single_range('vf_operator_job_workers{%s,kind="current"}' % sel)
        ]
        self.assertTrue(is_subsequence([2, 4, 2], changes(workers)), changes(workers))
        ready = [v for _, v in self.single_range('vf_operator_job_workers{%s,kind="ready"}' % sel)]
        self.assertTrue(is_subsequence([2, 4, 2], changes(ready)), changes(ready))
        # The last step the job reported, as the status says.
        last = self.single_range("vf_operator_job_step{%s}" % sel)[-1][1]
        self.assertEqual(last, STEPS)
        self.assertEqual(self.final_status["step"], STEPS)
        # Its length, for a progress percentage: spec.steps.
        total = self.single_range("vf_operator_job_total_steps{%s}" % sel)
        self.assertEqual({v for _, v in total}, {STEPS})
        self.assertEqual(self.final_status["totalSteps"], STEPS)

    def test_step_rate_in_every_membership(self):
        sel = 'job_namespace="%s",job_name="%s"' % (NS, JOB)
        rate = self.single_range(
            "max by (job_namespace, job_name) (rate(vf_agent_steps_total{%s}[5s]))" % sel
        )
        bounds = [t for _, t in self.phases] + [self.ended]
        for (workers, start), end in zip(self.phases, bounds[1:], strict=True):
            with self.subTest(workers=workers, seconds=round(end - start, 1)):
                inside = [v for t, v in rate if start <= t <= end]
                self.assertTrue(inside, "no sample")
                self.assertGreater(max(inside), 0)
        # Every worker counts the steps it took part in: over the whole run, the first workers'
        # counters reach (nearly, their last scrape may precede the last steps) the job's steps.
        most = max(v for s in self.range("vf_agent_steps_total{%s}" % sel).values() for _, v in s)
        self.assertLessEqual(most, STEPS)
        self.assertGreater(most, STEPS - 5 * 100)

    def test_virtual_nodes_stay_constant_across_resizes(self):
        sel = 'job_namespace="%s",job_name="%s"' % (NS, JOB)
        total = dict(self.single_range("sum(vf_agent_virtual_nodes{%s})" % sel))
        count = dict(self.single_range("count(vf_agent_virtual_nodes{%s})" % sel))
        # An agent sets its plan's epoch and its virtual nodes together. Around a switch the
        # workers are scraped at different moments, some before and some after it; those
        # instants mix two plans and say nothing about either, so they are left out.
        low = dict(self.single_range("min(vf_agent_membership_epoch{%s})" % sel))
        high = dict(self.single_range("max(vf_agent_membership_epoch{%s})" % sel))
        seen = {}
        mixed = 0
        for t, v in total.items():
            if t not in low or low[t] != high.get(t):
                mixed += 1
                continue
            seen.setdefault(int(count.get(t, 0)), []).append(v)
        for workers in (2, 4):
            with self.subTest(workers=workers):
                values = seen.get(workers, [])
                self.assertTrue(
                    values,
                    "never %d workers scraped at once on one plan: %s "
                    "(%d instants mixed plans)" % (workers, seen, mixed),
                )
                # A joiner not yet scraped at all can still leave an instant short; the rest
                # must hold the job's 8 virtual nodes.
                self.assertGreaterEqual(values.count(VIRTUAL_NODES), len(values) * 0.8, values)

    def test_dashboard_queries_parse_and_name_only_scraped_metrics(self):
        with open(DASHBOARD) as f:
            queries = dashboard_queries(json.load(f))
        metadata = self.metadata
        names = set(self.prometheus.api("label/__name__/values"))
        run = "%ds" % int(self.ended - self.started + 10)
        substitutions = {
            "$namespace": NS,
            "$job": JOB,
            "$__rate_interval": "5s",
            "$__interval": "5s",
            "$__range": run,
        }
        with_data = 0
        for where, expr in queries:
            with self.subTest(where, expr=expr):
                query = expr
                for var, value in substitutions.items():
                    query = query.replace(var, value)
                self.assertNotIn("$", query, "a Grafana variable the test does not know")
                # Parses (Prometheus answers bad_data otherwise) and runs.
                result = self.prometheus.query_range(query, self.started, self.ended + 5, 2)
                used = metric_names(expr)
                self.assertTrue(used)
                ours = {n for n in used if not n.startswith("DCGM_")}
                for name in ours:
                    family = re.sub(r"_(bucket|sum|count)$", "", name)
                    known = name in metadata or (
                        family in metadata and metadata[family][0]["type"] == "histogram"
                    )
                    self.assertTrue(known, "%s: not a metric Prometheus scraped" % name)
                # DCGM's metrics come from NVIDIA's DCGM exporter, which does not run here.
                if ours == used and ours <= names:
                    self.assertTrue(result, "no data for %s" % query)
                    with_data += 1
        self.assertGreaterEqual(with_data, 20)

    def test_metrics_reference_matches_what_prometheus_scraped(self):
        metadata = self.metadata
        scraped = {
            name: entries[0]["type"] for name, entries in metadata.items() if name.startswith("vf_")
        }
        self.assertEqual(scraped, documented_metrics())
        for name, entries in metadata.items():
            if name.startswith("vf_"):
                self.assertTrue(entries[0]["help"], "%s has no HELP" % name)

    def test_both_endpoints_report_the_builds_version(self):
        run = subprocess.run(
            [os.path.join(BIN_DIR, "vf"), "--version"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        version = run.stdout.split()[-1]  # "vf 0.1.0"
        series = self.prometheus.query("vf_build_info", at=self.ended - 5)
        self.assertTrue(series)
        by_job = {}
        for s in series:
            by_job.setdefault(s["metric"]["job"], set()).add(
                (s["metric"].get("version"), float(s["value"][1]))
            )
        self.assertEqual(
            by_job,
            {"virtualflow-operator": {(version, 1.0)}, "virtualflow-workers": {(version, 1.0)}},
        )

    def test_a_finished_jobs_series_leave_the_operator_after_its_ttl(self):
        self.assertIn('vf_operator_job_step{job_name="%s"' % JOB, self.operator_at_end)
        self.assertIsNone(self.ttl_error, self.operator_after_ttl)
        self.assertTrue(self.job_deleted)
        self.assertNotIn('job_name="%s"' % JOB, self.operator_after_ttl)
        # The rest of the exposition stays: the job is counted in no phase any more.
        self.assertIn('vf_operator_jobs{phase="Succeeded"} 0', self.operator_after_ttl)
        self.assertIn("vf_build_info{", self.operator_after_ttl)


if __name__ == "__main__":
    unittest.main()
