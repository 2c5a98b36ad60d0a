"""vf-pod-runner against a real control plane: the real scheduler binds pods (created without a
nodeName) to fake GPU nodes, and the runner plays their kubelet: runs each pod's command as a local
process with the pod's environment, in a network namespace with an address of its own and with its
volumes mounted, reports Running / Succeeded / Failed through pods/status, carries out graceful and
forced deletion, and leaves alone the nodes it does not manage.

The runner comes from $VF_BIN_DIR (the build's bin directory); ctest sets it.
"""

import base64
import ipaddress
import json
import os
import signal
import socket
import stat
import subprocess
import threading
import time
import unittest

from controlplane import GPU_RESOURCE, ControlPlaneTestCase

NS = "runner"
POOL = "e2e.virtualflow.io/pool"


def runner_bin_dir():
    path = os.environ.get("VF_BIN_DIR")
    if not path or not os.access(os.path.join(path, "vf-pod-runner"), os.X_OK):
        raise RuntimeError(
            "vf-pod-runner not found in VF_BIN_DIR=%r: build the vf-pod-runner "
            "target and set VF_BIN_DIR to the build's bin directory" % path
        )
    return path


def pod(
    name,
    command,
    pool="run",
    env=None,
    gpus=None,
    grace=None,
    restart="Never",
    volumes=None,
    mounts=None,
    node=None,
):
    """A pod in NS whose one container runs COMMAND. Commands and args go through Kubernetes'
    $(VAR) expansion, in which $$ stands for $: a shell's $$ is written $$$$. NODE binds it
    directly, past the scheduler."""
    container = {"name": "main", "image": "busybox:e2e", "command": command}
    if env:
        container["env"] = env
    if gpus:
        container["resources"] = {"limits": {GPU_RESOURCE: str(gpus)}}
    if mounts:
        container["volumeMounts"] = mounts
    spec = {"containers": [container], "nodeSelector": {POOL: pool}}
    if volumes:
        spec["volumes"] = volumes
    if node:
        spec["nodeName"] = node
    if restart:
        spec["restartPolicy"] = restart
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": spec,
    }


def container_state(p):
    statuses = (p.get("status") or {}).get("containerStatuses") or []
    return statuses[0]["state"] if statuses else {}


def condition(p, kind):
    for c in (p.get("status") or {}).get("conditions") or []:
        if c["type"] == kind:
            return c
    return None


def net_name(uid):
    """The network namespace and veth name vf-pod-runner gives the pod of UID."""
    return "vf" + "".join(c for c in uid if c in "0123456789abcdef")[:12]


def netns_names():
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    return {line.split()[0] for line in out.stdout.splitlines() if line.strip()}


def link_exists(name):
    return subprocess.run(["ip", "link", "show", name], capture_output=True).returncode == 0


def alive(pid):
    """The process runs (a zombie waiting to be reaped does not count)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


class PodRunnerTest(ControlPlaneTestCase):
    @classmethod
    def setUpClass(cls):
        cls.bin_dir = runner_bin_dir()  # before the control plane: no runner, no point starting
        super().setUpClass()
        cp = cls.cp
        cls.work = os.path.join(cp.dir, "work")
        cls.tools = os.path.join(cp.dir, "tools")
        os.makedirs(cls.work)
        os.makedirs(cls.tools)
        # A command found only through --path.
        hello = os.path.join(cls.tools, "vf-e2e-hello")
        with open(hello, "w") as f:
            f.write('#!/bin/sh\necho "hello from $0 with PATH=$PATH"\n')
        os.chmod(hello, stat.S_IRWXU)
        cp.create_namespace(NS)
        # Pools selected by nodeSelector, so that tests do not take each other's GPUs, and no pod
        # lands on the unmanaged node by chance.
        for name in ("run-1", "run-2"):
            cp.add_gpu_node(name, gpus=8, labels={POOL: "run"})
        for name in ("gpu-1", "gpu-2"):
            cp.add_gpu_node(name, gpus=1, labels={POOL: "gpu"})
        cp.add_gpu_node("plain-1", gpus=8, labels={POOL: "plain"}, pod_runner=False)
        cls.start_runner()

    @classmethod
    def start_runner(cls):
        cls.cp.start_pod_runner(cls.bin_dir, path=[cls.tools, cls.bin_dir])

    # ---------------------------------------------------------------- helpers

    def create(self, obj):
        kind = obj.get("kind", "Pod").lower() + "s"
        return self.cp.request("POST", "/api/v1/namespaces/%s/%s" % (NS, kind), obj)

    def get(self, name):
        return self.cp.get("/api/v1/namespaces/%s/pods/%s" % (NS, name))

    def path(self, name):
        return os.path.join(self.work, name)

    def wait_phase(self, name, phase, timeout=60):
        def reached():
            p = self.get(name)
            return p if p and (p.get("status") or {}).get("phase") == phase else None

        try:
            return self.cp.wait_for("pod %s to be %s" % (name, phase), reached, timeout)
        except TimeoutError:
            raise AssertionError(
                "pod %s is not %s: %s"
                % (name, phase, json.dumps((self.get(name) or {}).get("status"), indent=1))
            ) from None

    def wait_file(self, path, timeout=30):
        def written():
            try:
                with open(path) as f:
                    text = f.read()
                return text if text.endswith("\n") else None
            except OSError:
                return None

        return self.cp.wait_for("%s to be written" % path, written, timeout).strip()

    def wait_gone(self, name, timeout=60):
        self.cp.wait_for("pod %s to be deleted" % name, lambda: self.get(name) is None, timeout)

    def terminated(self, p):
        state = container_state(p)
        self.assertIn("terminated", state, json.dumps(p.get("status"), indent=1))
        return state["terminated"]

    def runner_log(self):
        with open(os.path.join(self.cp.logs, "pod-runner.log"), errors="replace") as f:
            return f.read()

    def kubectl_delete(self, *args):
        start = time.monotonic()
        proc = self.cp.kubectl("-n", NS, "delete", "pod", *args, "--timeout=90s", timeout=120)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        return time.monotonic() - start

    def run_to_end(self, name, command, phase, **kwargs):
        self.create(pod(name, command, **kwargs))
        return self.wait_phase(name, phase)

    # ---------------------------------------------------------------- exits

    def test_exit_zero_succeeds_as_completed(self):
        p = self.run_to_end(
            "exit-zero", ["sh", "-c", "echo hello from $HOSTNAME; exit 0"], "Succeeded"
        )
        t = self.terminated(p)
        self.assertEqual(t["exitCode"], 0)
        self.assertEqual(t["reason"], "Completed")
        self.assertNotIn("message", t)
        self.assertTrue(t["startedAt"] and t["finishedAt"])
        self.assertIn(p["spec"]["nodeName"], ("run-1", "run-2"))
        self.assertIn(
            ipaddress.ip_address(p["status"]["podIP"]), ipaddress.ip_network(self.cp.pod_cidr)
        )
        self.assertEqual(condition(p, "Ready")["status"], "False")
        self.assertEqual(condition(p, "PodScheduled")["status"], "True")
        self.assertIn("hello from exit-zero", self.cp.pod_log(NS, "exit-zero", "main"))
        out = self.cp.kubectl("-n", NS, "get", "pod", "exit-zero", check=True).stdout
        self.assertIn("Completed", out)

    def test_exit_three_fails_with_the_log_tail(self):
        p = self.run_to_end(
            "exit-three",
            ["sh", "-c", "echo starting; echo something went wrong >&2; exit 3"],
            "Failed",
        )
        t = self.terminated(p)
        self.assertEqual(t["exitCode"], 3)
        self.assertEqual(t["reason"], "Error")
        self.assertIn("something went wrong", t["message"])
        self.assertIn("starting", t["message"])

    def test_missing_command_cannot_run(self):
        p = self.run_to_end("no-such-command", ["vf-no-such-command", "--flag"], "Failed")
        t = self.terminated(p)
        self.assertEqual(t["reason"], "ContainerCannotRun")
        self.assertIn('"vf-no-such-command"', t["message"])
        self.assertIn("not found", t["message"])

    def test_path_comes_first_and_other_restart_policies_act_as_never(self):
        # No restartPolicy: the API server's default, Always.
        p = self.run_to_end("on-path", ["vf-e2e-hello"], "Succeeded", restart=None)
        self.assertEqual(p["spec"]["restartPolicy"], "Always")
        log = self.cp.pod_log(NS, "on-path", "main")
        self.assertIn("hello from %s/vf-e2e-hello with PATH=%s:" % (self.tools, self.tools), log)
        self.assertIn(
            "pod %s/on-path has restartPolicy Always, treated as Never" % NS, self.runner_log()
        )

    # ---------------------------------------------------------------- environment

    def test_env_from_literals_secrets_config_maps_and_field_refs(self):
        self.create(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "creds"},
                "data": {"password": base64.b64encode(b"secretvalue").decode()},
            }
        )
        self.create(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "settings"},
                "data": {"mode": "fast"},
            }
        )

        def field(path):
            return {"fieldRef": {"fieldPath": path}}

        env = [
            {"name": "A", "value": "x"},
            {"name": "S", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "password"}}},
            {"name": "C", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "mode"}}},
            {
                "name": "O",
                "valueFrom": {"secretKeyRef": {"name": "absent", "key": "k", "optional": True}},
            },
            {"name": "N", "valueFrom": field("metadata.name")},
            {"name": "NS", "valueFrom": field("metadata.namespace")},
            {"name": "UID", "valueFrom": field("metadata.uid")},
            {"name": "NODE", "valueFrom": field("spec.nodeName")},
            {"name": "IP", "valueFrom": field("status.podIP")},
            {"name": "REF", "value": "$(A)-$(N)"},
        ]
        checks = (
            'test "$A" = x && test "$S" = secretvalue && test "$C" = fast && '
            'test "$N" = "$POD" && test "$NS" = %s && test -n "$IP" && '
            'test "$REF" = "x-$POD" && test "$HOSTNAME" = "$POD" && test -z "${O+set}" && '
            'test -z "${HOME+set}"' % NS
        )
        script = 'env | sort; echo "node=$NODE uid=$UID ip=$IP."; %s'
        good = env + [{"name": "POD", "value": "env-good"}]
        p = self.run_to_end("env-good", ["sh", "-c", script % checks], "Succeeded", env=good)
        self.assertIn(
            "node=%s uid=%s ip=%s."
            % (p["spec"]["nodeName"], p["metadata"]["uid"], p["status"]["podIP"]),
            self.cp.pod_log(NS, "env-good", "main"),
        )
        # The same checks fail when one value is not what it should be.
        wrong = env + [{"name": "POD", "value": "some-other-pod"}]
        p = self.run_to_end("env-wrong", ["sh", "-c", script % checks], "Failed", env=wrong)
        self.assertEqual(self.terminated(p)["exitCode"], 1)

    def test_missing_secret_waits_until_it_exists(self):
        env = [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "later", "key": "token"}}}]
        self.create(pod("needs-secret", ["sh", "-c", 'test "$T" = tok'], env=env))

        def waiting():
            p = self.get("needs-secret")
            return container_state(p).get("waiting") if p else None

        state = self.cp.wait_for("needs-secret to wait for its secret", waiting)
        self.assertEqual(state["reason"], "CreateContainerConfigError")
        self.assertIn('secret "later" not found', state["message"])
        self.assertEqual(self.get("needs-secret")["status"]["phase"], "Pending")
        self.create(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "later"},
                "stringData": {"token": "tok"},
            }
        )
        self.wait_phase("needs-secret", "Succeeded")

    # ---------------------------------------------------------------- deletion

    def test_delete_of_a_pod_that_never_started_removes_it(self):
        env = [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "never", "key": "k"}}}]
        self.create(pod("never-started", ["true"], env=env))

        def waiting():
            p = self.get("never-started")
            return container_state(p).get("waiting") if p else None

        self.cp.wait_for("never-started to wait for its secret", waiting)
        elapsed = self.kubectl_delete("never-started")  # the default grace period: 30 s
        self.assertIsNone(self.get("never-started"))
        self.assertLess(elapsed, 20, "nothing runs: the runner deletes it at once")
        self.assertIn(
            "pod %s/never-started is being deleted and never started" % NS, self.runner_log()
        )

    def test_delete_runs_the_term_trap_and_removes_the_pod(self):
        marker, ready = self.path("trap-ran"), self.path("trap-ready")
        script = (
            'trap "echo term > %s; exit 0" TERM; echo ready > %s; '
            "while true; do sleep 0.2; done" % (marker, ready)
        )
        self.create(pod("trap", ["sh", "-c", script]))
        self.wait_phase("trap", "Running")
        self.wait_file(ready)
        elapsed = self.kubectl_delete("trap")  # waits until the object is gone
        self.assertIsNone(self.get("trap"))
        self.assertEqual(self.wait_file(marker, timeout=1), "term")
        self.assertLess(elapsed, 20, "the pod should go when its process exits, not after 30 s")
        self.assertIn("pod %s/trap is being deleted: SIGTERM" % NS, self.runner_log())

    def test_term_ignored_is_killed_after_the_grace_period(self):
        pid_file = self.path("stubborn.pid")
        script = 'trap "" TERM; echo $$$$ > %s; while true; do sleep 0.2; done' % pid_file
        self.create(pod("stubborn", ["sh", "-c", script], grace=2))
        self.wait_phase("stubborn", "Running")
        pid = int(self.wait_file(pid_file))
        self.assertTrue(alive(pid))
        elapsed = self.kubectl_delete("stubborn")
        self.assertIsNone(self.get("stubborn"))
        self.assertGreaterEqual(elapsed, 2, "TERM is ignored: only SIGKILL, 2 s later, ends it")
        self.assertFalse(alive(pid))
        self.assertIn(
            "pod %s/stubborn: grace period of 2s is over: SIGKILL" % NS, self.runner_log()
        )

    def test_force_delete_kills_the_process_at_once(self):
        pid_file = self.path("forced.pid")
        self.create(pod("forced", ["sh", "-c", "echo $$$$ > %s; exec sleep 600" % pid_file]))
        self.wait_phase("forced", "Running")
        pid = int(self.wait_file(pid_file))
        self.assertTrue(alive(pid))
        self.kubectl_delete("forced", "--grace-period=0", "--force")
        self.cp.wait_for(
            "the process of the force-deleted pod to die", lambda: not alive(pid), timeout=10
        )
        self.assertIsNone(self.get("forced"))
        # Whether the runner saw the deletion as an update with grace period 0 or only as the
        # object's removal, its process got SIGKILL at once.
        self.assertRegex(
            self.runner_log(),
            r"pod %s/forced (is being deleted with grace period 0|was deleted "
            r"outright): SIGKILL to pid %d" % (NS, pid),
        )

    # ---------------------------------------------------------------- scheduling

    def test_two_one_gpu_nodes_run_two_of_three_gpu_pods(self):
        names = ["gpu-pod-%d" % i for i in range(3)]
        for name in names:
            self.create(pod(name, ["sleep", "600"], pool="gpu", gpus=1))

        def settled():
            pods = [self.get(n) for n in names]
            running = [p for p in pods if p["status"].get("phase") == "Running"]
            pending = [
                p
                for p in pods
                if (condition(p, "PodScheduled") or {}).get("reason") == "Unschedulable"
            ]
            return (running, pending) if len(running) == 2 and len(pending) == 1 else None

        running, pending = self.cp.wait_for("two GPU pods running, one unschedulable", settled)
        self.assertEqual(sorted(p["spec"]["nodeName"] for p in running), ["gpu-1", "gpu-2"])
        self.assertIn(
            "Insufficient %s" % GPU_RESOURCE, condition(pending[0], "PodScheduled")["message"]
        )
        self.assertEqual(pending[0]["status"]["phase"], "Pending")
        self.assertFalse(pending[0]["spec"].get("nodeName"))
        self.assertFalse(pending[0]["status"].get("containerStatuses"))

        # What a kubelet reports for a running pod.
        s = running[0]["status"]
        self.assertNotEqual(s["podIP"], running[1]["status"]["podIP"])
        self.assertIn(ipaddress.ip_address(s["podIP"]), ipaddress.ip_network(self.cp.pod_cidr))
        self.assertEqual(s["podIPs"], [{"ip": s["podIP"]}])
        self.assertEqual(s["hostIP"], self.cp.pod_gateway)
        self.assertTrue(s["startTime"])
        for kind in ("PodScheduled", "Initialized", "ContainersReady", "Ready"):
            self.assertEqual(condition(running[0], kind)["status"], "True", kind)
        c = s["containerStatuses"][0]
        self.assertEqual(
            (c["name"], c["image"], c["ready"], c["started"], c["restartCount"]),
            ("main", "busybox:e2e", True, True, 0),
        )
        self.assertTrue(c["imageID"])
        self.assertTrue(c["state"]["running"]["startedAt"])

        # Deleting a running pod frees its GPU for the pending one, which then runs there.
        freed = running[0]["spec"]["nodeName"]
        self.kubectl_delete(running[0]["metadata"]["name"])
        late = self.wait_phase(pending[0]["metadata"]["name"], "Running")
        self.assertEqual(late["spec"]["nodeName"], freed)
        self.kubectl_delete(*names, "--ignore-not-found")

    def test_pods_on_nodes_without_the_label_are_left_alone(self):
        marker = self.path("unmanaged-ran")
        self.create(pod("unmanaged", ["sh", "-c", "echo ran > %s" % marker], pool="plain"))
        self.cp.wait_for(
            "unmanaged to be bound",
            lambda: self.get("unmanaged")["spec"].get("nodeName") == "plain-1",
        )
        # The runner handles pods in the order it sees them: once a later pod on a managed node
        # has run, it has seen (and ignored) the earlier one.
        self.run_to_end("managed-after", ["true"], "Succeeded")
        p = self.get("unmanaged")
        self.assertEqual(p["status"]["phase"], "Pending")
        self.assertFalse(p["status"].get("containerStatuses"))
        self.assertFalse(os.path.exists(marker))
        self.assertNotIn("pod %s/unmanaged" % NS, self.runner_log())
        self.kubectl_delete("unmanaged", "--grace-period=0", "--force")

    # ---------------------------------------------------------------- network

    def test_pods_have_addresses_of_their_own_and_reach_each_other(self):
        # The server listens on its pod IP; 127.0.0.1 in the client is the client's own.
        server = (
            "import socket, os; s = socket.create_server((os.environ['IP'], 7070)); "
            "c, _ = s.accept(); c.sendall(b'hello from ' + os.environ['IP'].encode())"
        )
        client = (
            "import socket, sys, os\n"
            "try:\n"
            "    socket.create_connection(('127.0.0.1', 7070), timeout=2)\n"
            "    sys.exit('reached the server on 127.0.0.1: not isolated')\n"
            "except OSError:\n"
            "    pass\n"
            "got = socket.create_connection((os.environ['SERVER'], 7070), timeout=10)"
            ".recv(100)\n"
            "print(got.decode())\n"
            "sys.exit(0 if got == b'hello from ' + os.environ['SERVER'].encode() else 1)\n"
        )
        ip = [{"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
        self.create(pod("net-server", ["python3", "-c", server], env=ip))
        s = self.wait_phase("net-server", "Running")["status"]
        self.assertNotEqual(s["podIP"], "127.0.0.1")
        self.assertIn(ipaddress.ip_address(s["podIP"]), ipaddress.ip_network(self.cp.pod_cidr))
        self.assertIn(net_name(self.get("net-server")["metadata"]["uid"]), netns_names())
        env = [{"name": "SERVER", "value": s["podIP"]}]
        c = self.run_to_end("net-client", ["python3", "-c", client], "Succeeded", env=env)
        self.assertNotEqual(c["status"]["podIP"], s["podIP"])
        server_pod = self.wait_phase("net-server", "Succeeded")
        self.assertIn("hello from " + s["podIP"], self.cp.pod_log(NS, "net-client", "main"))
        # The namespaces and veths go with the processes.
        for p in (server_pod, c):
            name = net_name(p["metadata"]["uid"])
            self.assertNotIn(name, netns_names())
            self.assertFalse(link_exists(name), name)

    def test_pod_reaches_the_host_at_the_gateway(self):
        listener = socket.create_server(("0.0.0.0", 0))
        self.addCleanup(listener.close)
        port = listener.getsockname()[1]
        got = []

        def serve():
            listener.settimeout(60)
            try:
                conn, addr = listener.accept()
                got.append((conn.recv(100), addr[0]))
                conn.close()
            except OSError:
                pass

        t = threading.Thread(target=serve, daemon=True)
        t.start()
        host_ip = [{"name": "HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}}]
        script = (
            "import socket, os; socket.create_connection((os.environ['HOST'], %d), "
            "timeout=10).sendall(b'from the pod')" % port
        )
        p = self.run_to_end("to-host", ["python3", "-c", script], "Succeeded", env=host_ip)
        t.join(10)
        self.assertEqual(p["status"]["hostIP"], self.cp.pod_gateway)
        self.assertEqual(got, [(b"from the pod", p["status"]["podIP"])])

    # ---------------------------------------------------------------- volumes

    def test_empty_dir_host_path_and_secret_volumes(self):
        self.create(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "vol-secret"},
                "data": {"token": base64.b64encode(b"s3cret").decode()},
            }
        )
        host_dir = self.path("host-dir")
        os.makedirs(host_dir)
        mnt = os.path.join(self.cp.dir, "mnt")  # missing on the host: made for the pod
        volumes = [
            {"name": "scratch", "emptyDir": {}},
            {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}},
            {"name": "host", "hostPath": {"path": host_dir}},
            {"name": "creds", "secret": {"secretName": "vol-secret", "defaultMode": 0o400}},
        ]
        mounts = [
            {"name": "scratch", "mountPath": mnt + "/scratch"},
            {"name": "shm", "mountPath": mnt + "/shm"},
            {"name": "host", "mountPath": mnt + "/host", "subPath": "sub"},
            {"name": "creds", "mountPath": mnt + "/creds"},
        ]
        script = (
            f'set -e; echo kept > {mnt}/scratch/a; test "$(cat {mnt}/scratch/a)" = kept; '
            f"df {mnt}/shm | grep -q tmpfs; echo via-pod > {mnt}/host/out; "
            f'test "$(cat {mnt}/creds/token)" = s3cret; '
            f'test "$(stat -L -c %a {mnt}/creds/token)" = 400; '
            f"if touch {mnt}/creds/new 2>/dev/null; then echo secret not read-only; exit 1; fi; "
            "echo all good"
        )
        p = self.run_to_end(
            "volumes", ["sh", "-c", script], "Succeeded", volumes=volumes, mounts=mounts
        )
        self.assertIn("all good", self.cp.pod_log(NS, "volumes", "main"))
        with open(os.path.join(host_dir, "sub", "out")) as f:
            self.assertEqual(f.read(), "via-pod\n")
        # The mount points made for the pod went with it; nothing was mounted on the host.
        self.assertFalse(os.path.exists(mnt), os.listdir(mnt) if os.path.isdir(mnt) else mnt)
        with open("/proc/self/mountinfo") as f:
            self.assertNotIn(mnt, f.read())
        self.assertEqual(p["status"]["phase"], "Succeeded")

    def test_missing_claim_waits_then_a_bound_claim_mounts_its_volume(self):
        # Bound straight to a node: the scheduler would keep a pod with a missing claim unbound.
        data = self.path("pv-data")
        os.makedirs(data)
        volumes = [{"name": "data", "persistentVolumeClaim": {"claimName": "ckpt"}}]
        mounts = [{"name": "data", "mountPath": "/vf-e2e-ckpt"}]
        self.create(
            pod(
                "with-claim",
                ["sh", "-c", "echo saved > /vf-e2e-ckpt/model.pt"],
                volumes=volumes,
                mounts=mounts,
                node="run-1",
            )
        )

        def waiting():
            p = self.get("with-claim")
            return container_state(p).get("waiting") if p else None

        state = self.cp.wait_for("with-claim to wait for its claim", waiting)
        self.assertEqual(state["reason"], "ContainerCreating")
        self.assertIn('persistentvolumeclaim "ckpt" not found', state["message"])
        self.assertEqual(self.get("with-claim")["status"]["phase"], "Pending")

        self.cp.request(
            "POST",
            "/api/v1/persistentvolumes",
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": "e2e-ckpt"},
                "spec": {
                    "capacity": {"storage": "1Gi"},
                    "accessModes": ["ReadWriteOnce"],
                    "storageClassName": "manual",
                    "hostPath": {"path": data},
                },
            },
        )
        self.create(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": "ckpt"},
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "storageClassName": "manual",
                    "resources": {"requests": {"storage": "1Gi"}},
                },
            }
        )
        self.wait_phase("with-claim", "Succeeded", timeout=60)
        with open(os.path.join(data, "model.pt")) as f:
            self.assertEqual(f.read(), "saved\n")
        self.assertFalse(os.path.exists("/vf-e2e-ckpt"))

    def test_unsupported_volume_fails_the_pod(self):
        volumes = [{"name": "remote", "nfs": {"server": "nfs.example", "path": "/x"}}]
        mounts = [{"name": "remote", "mountPath": "/vf-e2e-nfs"}]
        p = self.run_to_end("nfs", ["true"], "Failed", volumes=volumes, mounts=mounts)
        t = self.terminated(p)
        self.assertEqual(t["reason"], "ContainerCannotRun")
        self.assertIn("does not support nfs volumes", t["message"])

    # ---------------------------------------------------------------- the runner itself

    def test_runner_stops_cleanly_and_a_new_one_marks_lost_pods_failed(self):
        pid_file = self.path("outlived.pid")
        self.create(pod("outlived", ["sh", "-c", "echo $$$$ > %s; exec sleep 600" % pid_file]))
        self.wait_phase("outlived", "Running")
        pid = int(self.wait_file(pid_file))
        name = net_name(self.get("outlived")["metadata"]["uid"])
        self.assertIn(name, netns_names())
        try:
            self.assertEqual(self.cp.stop_pod_runner(), 0)
            self.assertFalse(alive(pid), "the runner's processes must not outlive it")
            self.assertEqual(self.get("outlived")["status"]["phase"], "Running")
            self.assertNotIn(name, netns_names())
            self.assertFalse(link_exists(name))
            self.assertFalse(link_exists(self.cp.pod_bridge), "the bridge goes with the runner")
        finally:
            self.start_runner()
        p = self.wait_phase("outlived", "Failed")
        self.assertEqual(self.terminated(p)["reason"], "ContainerStatusUnknown")

    def test_a_killed_runners_namespaces_are_removed_by_the_next(self):
        pid_file = self.path("orphaned.pid")
        self.create(pod("orphaned", ["sh", "-c", "echo $$$$ > %s; exec sleep 600" % pid_file]))
        self.wait_phase("orphaned", "Running")
        pid = int(self.wait_file(pid_file))
        name = net_name(self.get("orphaned")["metadata"]["uid"])
        try:
            os.kill(self.cp.pod_runner.proc.pid, signal.SIGKILL)
            self.cp.stop_pod_runner()
            self.cp.wait_for(
                "the killed runner's process to die", lambda: not alive(pid), timeout=10
            )
            self.assertIn(name, netns_names(), "a SIGKILLed runner cannot clean up")
        finally:
            self.start_runner()
        self.assertNotIn(name, netns_names())
        self.assertFalse(link_exists(name))
        self.assertIn(
            "removing network namespace %s left by an earlier runner" % name, self.runner_log()
        )
        self.wait_phase("orphaned", "Failed")


if __name__ == "__main__":
    unittest.main()
