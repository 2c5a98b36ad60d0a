#!/usr/bin/env python3
"""Checks the simulator's step-time model against measured local runs of the example job.

1. Calibrates the model's CPU numbers from single-worker runs only: `vf run` with V=4, B=128
   and V=8, B=256 (both micro-batch 32) gives seconds per virtual node and per-step work; the
   V=8 run again while a second single-worker run keeps the other core busy gives the core
   contention (how much slower a worker computes when workers run side by side).
2. Calibrates the all-reduce cost for N = 2..4, fitted to the ring model (latency + bytes /
   bandwidth, stretched by N / cores on 2 cores): by default from `vf run` with N workers and
   one virtual node each (V=N, B=32N: the step minus one virtual node's compute), which the
   prediction below never sees (it has 2 to 4 virtual nodes per worker); with --allreduce bench
   from `vf-bench reduction --workers N` (the exact reducer's collectives of the MLP's 535,818
   values, isolated; both are printed).
3. Measures `vf run examples/fashion-mnist.yaml --workers N` (V=8, B=256) for N = 1..4. Step
   time comes from rank 0's progress lines, timed as they arrive. The step time of a run is, by
   default, the mean over its progress windows after the first (--statistic mean): the rate
   the run kept up; the 10th percentile and the median of the windows are reported too. Each
   configuration keeps its best of --rounds rounds, each round running every configuration
   once, so slow phases of the machine hit all of them alike.
4. Predicts the same with `vf simulate --predict` on a 2-core cluster whose workers time-share
   the cores, and prints the error per worker count, for the chosen statistic and (one line)
   for the others, each calibrated and measured by that statistic. Twice: with the ring model
   fitted in step 2, and with the cluster's `network.measured_allreduce` table holding the
   in-step collective times of step 2 themselves.

Usage: validate_step_time.py --bin-dir build/bin [--rounds 3] [--steps 1500] [--interval 0.5]
"""

import argparse
import itertools
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
# Bytes per parameter in the ring cost model: exact mode reduce-scatters int64 (8) and
# all-gathers float32 (4), an all-reduce's two halves, so 6 on average.
BYTES_PER_PARAMETER = 6
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
    """Progress of one `vf run` as (time, step) rows: rank 0 prints its step count every
    `interval` seconds, and a pseudo-terminal delivers each line as it is printed."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [
            vf,
            "run",
            job,
            "--workers",
            str(workers),
            "--steps",
            str(steps),
            "--progress-interval",
            str(interval),
        ],
        stdout=slave,
        stderr=slave,
        close_fds=True,
    )
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
    return rows


def step_seconds_beside(vf, job, steps, interval):
    """step_seconds of a single-worker run while a second single-worker run of the same job
    keeps the other core busy (started first, stopped after)."""
    other = subprocess.Popen(
        [vf, "run", job, "--workers", "1", "--steps", str(steps * 2), "--quiet"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(1.0)  # past its start-up
        return step_seconds(vf, job, 1, steps, interval)
    finally:
        other.terminate()
        other.wait()


def percentile(values, q):
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))]


STATISTICS = ("mean", "p10", "median")


def step_seconds(vf, job, workers, steps, interval):
    """Step time of one run by each statistic, from the progress windows after the first (which
    includes set-up; the last, possibly short, window is left out too):
      mean    all those steps over all that time: the rate the run kept up;
      p10     the 10th percentile of the windows: the machine without most of the other load
              it shares its two cores with;
      median  the median window."""
    rows = step_windows(vf, job, workers, steps, interval)[1:-1]
    w = [(tb - ta) / (sb - sa) for (ta, sa), (tb, sb) in itertools.pairwise(rows) if sb > sa]
    if len(w) < 5:
        raise RuntimeError("too few progress windows (%d); run more --steps" % len(w))
    mean = (rows[-1][0] - rows[0][0]) / (rows[-1][1] - rows[0][1])
    return {"mean": mean, "p10": percentile(w, 0.10), "median": percentile(w, 0.5)}


def allreduce_seconds(bench, workers, repeats):
    """Minimum over `repeats` runs of vf-bench's median exact all-reduce time."""
    best = None
    for _ in range(repeats):
        out = subprocess.run(
            [bench, "reduction", "--workers", str(workers), "--repeats", "9", "--steps", "3"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
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
    xs = [
        (2.0 * (n - 1) * max(1.0, n / cores), 2.0 * (n - 1) / n * nbytes * max(1.0, n / cores))
        for n, _ in points
    ]
    ys = [a for _, a in points]
    s11 = sum(x[0] * x[0] for x in xs)
    s12 = sum(x[0] * x[1] for x in xs)
    s22 = sum(x[1] * x[1] for x in xs)
    b1 = sum(x[0] * y for x, y in zip(xs, ys, strict=True))
    b2 = sum(x[1] * y for x, y in zip(xs, ys, strict=True))
    det = s11 * s22 - s12 * s12
    lat = (b1 * s22 - b2 * s12) / det
    inv_bw = (s11 * b2 - s12 * b1) / det
    # Keep the model physical: if one term comes out negative, fit the other alone.
    if lat < 0:
        lat, inv_bw = 0.0, b2 / s22
    elif inv_bw <= 0:
        lat, inv_bw = b1 / s11, 1e-12
    return lat, 1.0 / inv_bw


def predict(sim, tmp, per_node, per_step, latency, bandwidth, contention, measured=None):
    """`vf simulate --predict` of the example job on 1..4 workers, from a profile and a cluster
    holding exactly these numbers (and, given `measured` [(N, seconds)], the collectives'
    measured times instead of the ring); {workers: row}."""
    profiles = os.path.join(tmp, "profiles.yaml")
    with open(profiles, "w") as f:
        f.write(
            "workloads:\n  fashion-mnist-mlp:\n    parameters: %d\n"
            "    gradient_bytes_per_parameter: %d\n    devices:\n      cpu:\n"
            "        seconds_per_micro_batch: {32: %.6g}\n"
            "        per_step_seconds: %.6g\n        source: measured\n"
            % (PARAMETERS, BYTES_PER_PARAMETER, per_node, per_step)
        )
    cluster = os.path.join(tmp, "cluster.yaml")
    with open(cluster, "w") as f:
        f.write(
            "name: local-2-core\ngpus: {cpu: 4}\nshared_cores: {cpu: %d}\n"
            "core_contention: {cpu: %.6g}\n"
            "network:\n  latency_seconds: %.6g\n  bandwidth_bytes_per_second: %.6g\n"
            % (CORES, contention, latency, bandwidth)
        )
        if measured:
            f.write(
                "  measured_allreduce:\n    bytes: %d\n    seconds: {%s}\n"
                % (
                    PARAMETERS * BYTES_PER_PARAMETER,
                    ", ".join("%d: %.6g" % (n, s) for n, s in measured),
                )
            )
    out = subprocess.run(
        sim
        + [
            "--predict",
            "fashion-mnist-mlp",
            "--cluster",
            cluster,
            "--profiles",
            profiles,
            "--workers",
            "1,2,3,4",
            "--virtual-nodes",
            "8",
            "--global-batch",
            "256",
            "--json",
        ],
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise RuntimeError("prediction failed: " + out.stderr)
    return {r["workers"]: r for r in json.loads(out.stdout)}


def evaluate(runs, stat, bench_points, allreduce_source, sim, tmp):
    """Calibrates and predicts from the `stat` step times (each configuration's best round by
    that statistic) and compares; returns everything the report prints."""
    best = {key: min(v[stat] for v in values) for key, values in runs.items()}
    # 1. Compute calibration from one worker, and how much two workers side by side slow each
    #    other (cores sharing caches, memory bandwidth or a physical core).
    t4 = best[("calibrate", 4)]
    t8 = best[("example", 1)]
    per_node = (t8 - t4) / 4.0
    per_step = max(0.0, t4 - 4.0 * per_node)
    if per_node <= 0.0:
        raise RuntimeError("V=8 was not slower than V=4: the machine is too noisy")
    contention = max(0.0, best[("beside", 1)] / t8 - 1.0)
    # 2. All-reduce inside real steps: N workers with one virtual node each, minus the compute.
    run_points = []
    for n in (2, 3, 4):
        busy = per_node + per_step
        compute = max(busy, n * busy / CORES) * (1.0 + contention)
        run_points.append((n, max(0.0, best[("one-node", n)] - compute)))
    points = run_points if allreduce_source == "runs" else bench_points
    latency, bandwidth = fit_ring(points, PARAMETERS * float(BYTES_PER_PARAMETER), CORES)
    # 3. and 4.
    measured = {n: best[("example", n)] for n in (1, 2, 3, 4)}
    predicted = predict(sim, tmp, per_node, per_step, latency, bandwidth, contention)
    errors = {n: (predicted[n]["step_seconds"] - measured[n]) / measured[n] for n in measured}
    # The same with the collectives' measured times as the cluster's table instead of the ring
    # (the 1-node-per-worker runs: other configurations than the ones predicted).
    with_table = predict(sim, tmp, per_node, per_step, latency, bandwidth, contention, points)
    table_errors = {
        n: (with_table[n]["step_seconds"] - measured[n]) / measured[n] for n in measured
    }
    return {
        "statistic": stat,
        "t4": t4,
        "t8": t8,
        "seconds_per_virtual_node": per_node,
        "beside": best[("beside", 1)],
        "core_contention": contention,
        "per_step_seconds": per_step,
        "allreduce_in_steps": run_points,
        "latency_seconds": latency,
        "bandwidth_bytes_per_second": bandwidth,
        "measured_step_seconds": measured,
        "predicted_step_seconds": {n: predicted[n]["step_seconds"] for n in predicted},
        "predicted_allreduce_seconds": {n: predicted[n]["allreduce_seconds"] for n in predicted},
        "errors": errors,
        "largest_error": max(abs(e) for e in errors.values()),
        "measured_allreduce": {
            "predicted_step_seconds": {n: with_table[n]["step_seconds"] for n in with_table},
            "predicted_allreduce_seconds": {
                n: with_table[n]["allreduce_seconds"] for n in with_table
            },
            "errors": table_errors,
            "largest_error": max(abs(e) for e in table_errors.values()),
        },
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "bin"))
    p.add_argument("--steps", type=int, default=1500, help="steps per measured run")
    p.add_argument("--interval", type=float, default=0.5, help="seconds per progress window")
    p.add_argument("--repeats", type=int, default=5, help="vf-bench runs per worker count")
    p.add_argument("--rounds", type=int, default=3, help="runs of every configuration")
    p.add_argument(
        "--statistic",
        choices=STATISTICS,
        default="mean",
        help="step time of a run: mean (default), p10 or median of its progress "
        "windows; the others are reported too",
    )
    p.add_argument(
        "--allreduce",
        choices=["runs", "bench"],
        default="runs",
        help="calibrate the all-reduce from N-worker runs with one virtual node each "
        "(default) or from vf-bench reduction",
    )
    p.add_argument("--sim-bin", help="vf-sim or vf with `simulate` (default: from --bin-dir)")
    p.add_argument("--json", help="also write the results to this file")
    a = p.parse_args()
    vf = os.path.join(a.bin_dir, "vf")
    bench = os.path.join(a.bin_dir, "vf-bench")
    sim = [a.sim_bin or os.path.join(a.bin_dir, "vf-sim"), "simulate"]
    if (
        not a.sim_bin
        and subprocess.run([vf, "simulate", "--help"], capture_output=True).returncode == 0
    ):
        sim = [vf, "simulate"]
    load_before = load()
    with tempfile.TemporaryDirectory() as tmp:
        # Every run, in rounds: each round runs every configuration once, so slow phases of
        # the machine's other load hit all of them alike; each keeps its best round.
        configs = {
            ("calibrate", 4): (job_file(tmp, 4, 128), 1),
            ("example", 1): (EXAMPLE, 1),  # V=8, B=256: also the second calibration point
            ("beside", 1): (EXAMPLE, 1),  # the same beside a second one: core contention
            ("one-node", 2): (job_file(tmp, 2, 64), 2),
            ("one-node", 3): (job_file(tmp, 3, 96), 3),
            ("one-node", 4): (job_file(tmp, 4, 128), 4),
            ("example", 2): (EXAMPLE, 2),
            ("example", 3): (EXAMPLE, 3),
            ("example", 4): (EXAMPLE, 4),
        }
        runs = {key: [] for key in configs}
        for r in range(a.rounds):
            for key, (job, workers) in configs.items():
                if key[0] == "beside":
                    runs[key].append(step_seconds_beside(vf, job, a.steps, a.interval))
                else:
                    runs[key].append(step_seconds(vf, job, workers, a.steps, a.interval))
            print(
                "round %d (%s ms): %s"
                % (
                    r + 1,
                    a.statistic,
                    ", ".join(
                        "%s/%d %.2f" % (k[0], k[1], 1e3 * v[-1][a.statistic])
                        for k, v in runs.items()
                    ),
                ),
                flush=True,
            )
        bench_points = [(n, allreduce_seconds(bench, n, a.repeats)) for n in (2, 3, 4)]
        results = {
            stat: evaluate(runs, stat, bench_points, a.allreduce, sim, tmp) for stat in STATISTICS
        }
    load_after = load()

    r = results[a.statistic]
    print("load average before/after: %s / %s" % (load_before, load_after))
    print(
        "step time of a run: %s of its progress windows (%.1f s each), best of %d rounds"
        % (a.statistic, a.interval, a.rounds)
    )
    print(
        "one worker, micro-batch 32: V=4 %.3f ms, V=8 %.3f ms per step"
        % (1e3 * r["t4"], 1e3 * r["t8"])
    )
    print(
        "calibration: %.3f ms per virtual node, %.3f ms per step"
        % (1e3 * r["seconds_per_virtual_node"], 1e3 * r["per_step_seconds"])
    )
    print(
        "core contention: V=8 beside a second single-worker run %.3f ms per step: %+.1f%%"
        % (1e3 * r["beside"], 100.0 * r["core_contention"])
    )
    print(
        "all-reduce, vf-bench (isolated, exact, %d values): %s"
        % (PARAMETERS, ", ".join("N=%d %.2f ms" % (n, 1e3 * s) for n, s in bench_points))
    )
    print(
        "all-reduce inside steps (V=N, B=32N runs minus compute): %s"
        % ", ".join("N=%d %.2f ms" % (n, 1e3 * s) for n, s in r["allreduce_in_steps"])
    )
    print("the prediction uses: %s" % a.allreduce)
    print(
        "ring fit: latency %.3g s per step, bandwidth %.3g bytes/s"
        % (r["latency_seconds"], r["bandwidth_bytes_per_second"])
    )
    print(
        "%-8s %12s %13s %15s %10s"
        % ("workers", "measured ms", "predicted ms", "of which a-r ms", "error")
    )
    for n in (1, 2, 3, 4):
        print(
            "%-8d %12.2f %13.2f %15.2f %+9.1f%%"
            % (
                n,
                1e3 * r["measured_step_seconds"][n],
                1e3 * r["predicted_step_seconds"][n],
                1e3 * r["predicted_allreduce_seconds"][n],
                100.0 * r["errors"][n],
            )
        )
    print("largest error: %.1f%%" % (100.0 * r["largest_error"]))
    t = r["measured_allreduce"]
    print("with the collectives' measured times (network.measured_allreduce) instead of the ring:")
    for n in (1, 2, 3, 4):
        print(
            "%-8d %12.2f %13.2f %15.2f %+9.1f%%"
            % (
                n,
                1e3 * r["measured_step_seconds"][n],
                1e3 * t["predicted_step_seconds"][n],
                1e3 * t["predicted_allreduce_seconds"][n],
                100.0 * t["errors"][n],
            )
        )
    print("largest error: %.1f%%" % (100.0 * t["largest_error"]))
    for label, pick in (
        ("ring", lambda x: x),
        ("measured collectives", lambda x: x["measured_allreduce"]),
    ):
        print(
            "the same (%s), calibrated and measured by each statistic: " % label
            + "; ".join(
                "%s: %s (largest %.1f%%)"
                % (
                    stat,
                    ", ".join(
                        "%+.1f%%" % (100.0 * pick(results[stat])["errors"][n]) for n in (1, 2, 3, 4)
                    ),
                    100.0 * pick(results[stat])["largest_error"],
                )
                for stat in STATISTICS
            )
        )
    if a.json:
        with open(a.json, "w") as f:
            json.dump(
                {
                    "load_before": load_before,
                    "load_after": load_after,
                    "statistic": a.statistic,
                    "allreduce_source": a.allreduce,
                    "allreduce_bench": bench_points,
                    "runs": {"%s/%d" % k: v for k, v in runs.items()},
                    "results": results,
                },
                f,
                indent=2,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
