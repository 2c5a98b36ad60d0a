#!/usr/bin/env python3
"""Checks the simulator's step-time model against measured local runs of the example job.

1. Calibrates the model's two CPU numbers from single-worker runs only: `vf run` with V=4, B=128
   and V=8, B=256 (both micro-batch 32) gives seconds per virtual node and per-step work,
   measured as in 3.
2. Calibrates the all-reduce cost for N = 2..4, fitted to the ring model (latency + bytes /
   bandwidth, stretched by N / cores on 2 cores): by default from `vf run` with N workers and
   one virtual node each (V=N, B=32N: the step minus one virtual node's compute), which the
   prediction below never sees (it has 2 to 4 virtual nodes per worker); with --allreduce bench
   from `vf-bench reduction --workers N` (the exact reducer's header + int64 all-reduce of the
   MLP's 535,818 values, isolated; both are printed).
3. Measures `vf run examples/fashion-mnist.yaml --workers N` (V=8, B=256) for N = 1..4. Step
   time comes from rank 0's progress lines, timed as they arrive: each window's seconds over its
   steps. The machine's two cores are shared with whatever else runs, so the estimate is the
   10th percentile of the windows (the least disturbed ones), best of --rounds rounds that each
   run every configuration once; that run's median is printed too.
4. Predicts the same with `vf simulate --predict` on a 2-core cluster whose workers time-share
   the cores, and prints the error per worker count.

Usage: validate_step_time.py --bin-dir build/bin [--rounds 3] [--steps 1500] [--interval 0.5]
"""

import argparse
import json
import os
import pty
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
EXAMPLE = os.path.join(ROOT, "examples", "fashion-mnist.yaml")
PARAMETERS = 535818
CORES = 2


def load():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def job_file(tmp, virtual_nodes, batch):
    with open(EXAMPLE) as f:
        text = f.read()
    text = re.sub(r"virtualNodes: \d+", "virtualNodes: %d" % virtual_nodes, text)
    text = re.sub(r"globalBatchSize: \d+", "globalBatchSize: %d" % batch, text)
    text = re.sub(r"max: \d+", "max: %d" % min(4, virtual_nodes), text)  # replicas.max <= V
    path = os.path.join(tmp, "job-v%d-b%d.yaml" % (virtual_nodes, batch))
    with open(path, "w") as f:
        f.write(text)
    return path


def step_windows(vf, job, workers, steps, interval):
    """Seconds per step in each progress window of one `vf run`: rank 0 prints its step count
    every `interval` seconds; a pseudo-terminal delivers each line as it is printed, and the
    time between lines over the steps between them is that window's step time."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([vf, "run", job, "--workers", str(workers), "--steps", str(steps),
                             "--progress-interval", str(interval)],
                            stdout=slave, stderr=slave, close_fds=True)
    os.close(slave)
    rows, buf = [], b""
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:
            break
        if not data:
            break
        now = time.monotonic()
        buf += data
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            m = re.search(rb"step\s+(\d+)/", line)
            if m:
                rows.append((now, int(m.group(1))))
    os.close(master)
    if proc.wait() != 0:
        raise RuntimeError("vf run failed for %s with %d workers" % (job, workers))
    # The first window includes the first steps' set-up; the last may be short.
    pairs = list(zip(rows, rows[1:]))[1:-1]
    return [(tb - ta) / (sb - sa) for (ta, sa), (tb, sb) in pairs if sb > sa]


def percentile(values, q):
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))]


def step_seconds(vf, job, workers, steps, interval):
    """(fast, median) step time: the 10th percentile of the windows estimates the machine
    without the other load it shares its two cores with; the median is what the load allowed."""
    w = step_windows(vf, job, workers, steps, interval)
    if len(w) < 5:
        raise RuntimeError("too few progress windows (%d); run more --steps" % len(w))
    return percentile(w, 0.10), percentile(w, 0.5)


def allreduce_seconds(bench, workers, repeats):
    """Minimum over `repeats` runs of vf-bench's median exact all-reduce time."""
    best = None
    for _ in range(repeats):
        out = subprocess.run([bench, "reduction", "--workers", str(workers), "--repeats", "9",
                              "--steps", "3"], check=True, capture_output=True, text=True).stdout
        for line in out.splitlines():
            if line.startswith("all-reduce of %d values" % PARAMETERS):
                t = float(line.split()[-2]) / 1e3  # the exact column, ms
                best = t if best is None else min(best, t)
                break
        else:
            raise RuntimeError("no all-reduce line in vf-bench output:\n" + out)
    return best


def fit_ring(points, nbytes, cores):
    """Least squares of a(N) = max(1, N / cores) * (2(N-1) * lat + 2(N-1)/N * bytes / bw) over
    (N, a) points: the ring model, stretched when N workers share fewer cores (as the
    simulator's shared-core model does)."""
    xs = [(2.0 * (n - 1) * max(1.0, n / cores), 2.0 * (n - 1) / n * nbytes * max(1.0, n / cores))
          for n, _ in points]
    ys = [a for _, a in points]
    s11 = sum(x[0] * x[0] for x in xs)
    s12 = sum(x[0] * x[1] for x in xs)
    s22 = sum(x[1] * x[1] for x in xs)
    b1 = sum(x[0] * y for x, y in zip(xs, ys))
    b2 = sum(x[1] * y for x, y in zip(xs, ys))
    det = s11 * s22 - s12 * s12
    lat = (b1 * s22 - b2 * s12) / det
    inv_bw = (s11 * b2 - s12 * b1) / det
    # Keep the model physical: if one term comes out negative, fit the other alone.
    if lat < 0:
        lat, inv_bw = 0.0, b2 / s22
    elif inv_bw <= 0:
        lat, inv_bw = b1 / s11, 1e-12
    return lat, 1.0 / inv_bw


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "bin"))
    p.add_argument("--steps", type=int, default=1500, help="steps per measured run")
    p.add_argument("--interval", type=float, default=0.5, help="seconds per progress window")
    p.add_argument("--repeats", type=int, default=5, help="vf-bench runs per worker count")
    p.add_argument("--rounds", type=int, default=3, help="runs of every configuration")
    p.add_argument("--allreduce", choices=["runs", "bench"], default="runs",
                   help="calibrate the all-reduce from N-worker runs with one virtual node each "
                        "(default) or from vf-bench reduction")
    p.add_argument("--sim-bin", help="vf-sim or vf with `simulate` (default: from --bin-dir)")
    p.add_argument("--json", help="also write the results to this file")
    a = p.parse_args()
    vf = os.path.join(a.bin_dir, "vf")
    bench = os.path.join(a.bin_dir, "vf-bench")
    sim = [a.sim_bin or os.path.join(a.bin_dir, "vf-sim"), "simulate"]
    if not a.sim_bin and subprocess.run([vf, "simulate", "--help"],
                                        capture_output=True).returncode == 0:
        sim = [vf, "simulate"]
    load_before = load()
    with tempfile.TemporaryDirectory() as tmp:
        # Every run, in rounds: each round runs every configuration once, so slow phases of
        # the machine's other load hit all of them alike; each keeps its best round.
        configs = {
            ("calibrate", 4): (job_file(tmp, 4, 128), 1),
            ("example", 1): (EXAMPLE, 1),  # V=8, B=256: also the second calibration point
            ("one-node", 2): (job_file(tmp, 2, 64), 2),
            ("one-node", 3): (job_file(tmp, 3, 96), 3),
            ("one-node", 4): (job_file(tmp, 4, 128), 4),
            ("example", 2): (EXAMPLE, 2),
            ("example", 3): (EXAMPLE, 3),
            ("example", 4): (EXAMPLE, 4),
        }
        best = {}
        for r in range(a.rounds):
            for key, (job, workers) in configs.items():
                fast, median = step_seconds(vf, job, workers, a.steps, a.interval)
                if key not in best or fast < best[key][0]:
                    best[key] = (fast, median)
            print("round %d: %s" % (r + 1, ", ".join("%s/%d %.2f ms" % (k[0], k[1], 1e3 * v[0])
                                                     for k, v in best.items())), flush=True)
        # 1. Compute calibration from one worker.
        t4 = best[("calibrate", 4)][0]
        t8 = best[("example", 1)][0]
        per_node = (t8 - t4) / 4.0
        per_step = max(0.0, t4 - 4.0 * per_node)
        if per_node <= 0.0:
            raise RuntimeError("V=8 was not slower than V=4: the machine is too noisy")
        # 2. All-reduce calibration: vf-bench's isolated collective, and the cost inside real
        #    steps (N workers with one virtual node each: the step minus its compute).
        bench_points = [(n, allreduce_seconds(bench, n, a.repeats)) for n in (2, 3, 4)]
        run_points = []
        for n in (2, 3, 4):
            busy = per_node + per_step
            compute = max(busy, n * busy / CORES)
            run_points.append((n, max(0.0, best[("one-node", n)][0] - compute)))
        reduce_points = run_points if a.allreduce == "runs" else bench_points
        nbytes = PARAMETERS * 8.0
        latency, bandwidth = fit_ring(reduce_points, nbytes, CORES)
        # 3. Measured step times of the example job.
        measured = {n: best[("example", n)][0] for n in (1, 2, 3, 4)}
        loaded = {n: best[("example", n)][1] for n in (1, 2, 3, 4)}
        # 4. Predictions from a profile and cluster holding exactly these numbers.
        profiles = os.path.join(tmp, "profiles.yaml")
        with open(profiles, "w") as f:
            f.write("workloads:\n  fashion-mnist-mlp:\n    parameters: %d\n"
                    "    gradient_bytes_per_parameter: 8\n    devices:\n      cpu:\n"
                    "        seconds_per_micro_batch: {32: %.6g}\n"
                    "        per_step_seconds: %.6g\n        source: measured\n"
                    % (PARAMETERS, per_node, per_step))
        cluster = os.path.join(tmp, "cluster.yaml")
        with open(cluster, "w") as f:
            f.write("name: local-2-core\ngpus: {cpu: 4}\nshared_cores: {cpu: %d}\n"
                    "network: {latency_seconds: %.6g, bandwidth_bytes_per_second: %.6g}\n"
                    % (CORES, latency, bandwidth))
        out = subprocess.run(sim + ["--predict", "fashion-mnist-mlp", "--cluster", cluster,
                                    "--profiles", profiles, "--workers", "1,2,3,4",
                                    "--virtual-nodes", "8", "--global-batch", "256", "--json"],
                             capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError("prediction failed: " + out.stderr)
        out = out.stdout
        predicted = {r["workers"]: r for r in json.loads(out)}
    load_after = load()

    print("load average before/after: %s / %s" % (load_before, load_after))
    print("one worker, micro-batch 32: V=4 %.3f ms, V=8 %.3f ms per step" % (1e3 * t4, 1e3 * t8))
    print("calibration: %.3f ms per virtual node, %.3f ms per step"
          % (1e3 * per_node, 1e3 * per_step))
    print("all-reduce, vf-bench (isolated, exact, %d values): %s" % (PARAMETERS, ", ".join(
        "N=%d %.2f ms" % (n, 1e3 * s) for n, s in bench_points)))
    print("all-reduce inside steps (V=N, B=32N runs minus compute): %s" % ", ".join(
        "N=%d %.2f ms" % (n, 1e3 * s) for n, s in run_points))
    print("the prediction uses: %s" % a.allreduce)
    print("ring fit: latency %.3g s per step, bandwidth %.3g bytes/s" % (latency, bandwidth))
    print("measured: 10th percentile of %.1f s progress windows, best of %d rounds "
          "(that run's median in [])" % (a.interval, a.rounds))
    print("%-8s %12s %10s %13s %15s %10s" % ("workers", "measured ms", "[median]",
                                               "predicted ms", "of which a-r ms", "error"))
    errors = {}
    for n in (1, 2, 3, 4):
        m = measured[n]
        pr = predicted[n]["step_seconds"]
        errors[n] = (pr - m) / m
        print("%-8d %12.2f %10s %13.2f %15.2f %+9.1f%%" % (
            n, 1e3 * m, "[%.2f]" % (1e3 * loaded[n]), 1e3 * pr,
            1e3 * predicted[n]["allreduce_seconds"], 100.0 * errors[n]))
    worst = max(abs(e) for e in errors.values())
    print("largest error: %.1f%%" % (100.0 * worst))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"load_before": load_before, "load_after": load_after,
                       "seconds_per_virtual_node": per_node, "per_step_seconds": per_step,
                       "allreduce_bench": bench_points, "allreduce_in_steps": run_points,
                       "allreduce_source": a.allreduce, "latency_seconds": latency,
                       "bandwidth_bytes_per_second": bandwidth,
                       "measured_step_seconds": measured,
                       "median_step_seconds_under_load": loaded,
                       "predicted_step_seconds": {n: predicted[n]["step_seconds"]
                                                  for n in predicted},
                       "errors": errors}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
