#!/usr/bin/env bash
# One command on a fresh machine: install what is needed, build everything (with warnings as
# errors and the sanitizer variants of the unit tests), and run the whole suite under ctest.
# Extra arguments go to ctest (e.g. -L unit, -R integration).
#
# The suite measures itself: at the end it prints, and writes to BUILD/suite-times.txt, the
# seconds of each phase (set-up, build, tests), the count of tests, the ten slowest tests, the
# fifteen slowest Python test cases and the Python test modules' CPU seconds (from ctest's JUnit
# report, BUILD/suite-junit.xml). That file is the figure to quote.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${VF_BUILD_DIR:-$root/build}"
t0=$(date +%s)
"$root/scripts/setup.sh"
t1=$(date +%s)
# The Kubernetes tools' Go build (tests/e2e/build-k8s-tools.sh, the end-to-end tests' fixture
# e2e.build_tools) is the longest step of a run with nothing cached and needs nothing the C++
# build makes: the whole suite starts it beside that build, so that the control-plane tests and
# the training tests, which wait for it, start with the rest. e2e.build_tools then waits for it
# (the script's lock) and finds the tools cached, or builds them and fails as it would have.
# With the tools cached it returns at once.
mkdir -p "$build"
k8s_log="$build/k8s-tools-build.log"
k8s_pid=""
if [ "$#" -eq 0 ]; then
  # A session of its own, so that the whole build is stopped if this script stops first.
  setsid bash -c 's=$(date +%s); rc=0; "$1" || rc=$?
    echo "Kubernetes tools: exit status $rc after $(($(date +%s) - s)) s, beside the build"' \
    - "$root/tests/e2e/build-k8s-tools.sh" >"$k8s_log" 2>&1 &
  k8s_pid=$!
fi
stop_k8s_build() { if [ -n "$k8s_pid" ]; then kill -- "-$k8s_pid" 2>/dev/null || true; fi; }
trap stop_k8s_build EXIT
"$root/scripts/build.sh"
t2=$(date +%s)
cd "$build"
rc=0
# Three tests at once on 2 cores (VF_TEST_JOBS): the training tests take turns among themselves
# (RESOURCE_LOCK training_processes), so do the control-plane tests in two lanes (those whose pods
# train, e2e_controlplane; the others, e2e_light_controlplane), and the unit tests, lints and
# fuzzers run beside them. A failed test's output is cut in the middle, not at its end, where its
# assertion is; a passed one's is kept up to 64 KiB, its case times too.
ctest --output-on-failure -j "${VF_TEST_JOBS:-3}" --output-junit "$build/suite-junit.xml" \
  --test-output-size-failed 1000000 --test-output-size-passed 65536 \
  --test-output-truncation middle "$@" || rc=$?
t3=$(date +%s)
{
  echo "suite: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(nproc) cores, ctest exit status $rc"
  echo "  set-up $((t1 - t0)) s, build $((t2 - t1)) s, tests $((t3 - t2)) s, total $((t3 - t0)) s"
  if [ -n "$k8s_pid" ]; then echo "  $(tail -n 1 "$k8s_log")"; fi
  if [ -f "$build/suite-junit.xml" ]; then
    # Each testcase element's status and time (ctest's JUnit attributes). awk reads its whole
    # input (no `head`): under pipefail a writer cut off by SIGPIPE would fail the script.
    grep -o '<testcase [^>]*>' "$build/suite-junit.xml" |
      awk '{ n++ } /status="fail"/ { f++ } /status="(notrun|disabled)"/ { s++ }
           END { printf "  %d tests: %d failed, %d not run\n", n, f, s }'
    echo "  slowest tests (s):"
    grep -o '<testcase [^>]*>' "$build/suite-junit.xml" |
      sed -E 's/.*name="([^"]*)".*time="([^"]*)".*/\2 \1/' | sort -rn |
      awk 'NR <= 10 { printf "    %8.1f  %s\n", $1, $2 }'
    # The Python modules' cases (tests/run_unittest.py writes `case-time SECONDS s ID`).
    echo "  slowest Python test cases (s):"
    { grep -o 'case-time [0-9.]* s [^ <]*' "$build/suite-junit.xml" || true; } | sort -k2 -rn |
      awk 'NR <= 15 { printf "    %8.1f  %s\n", $2, $4 }'
    # On 2 cores the suite waits for the CPU more than for any one test: the Python test
    # modules' CPU seconds (theirs and their ended processes'; `module-cpu SECONDS s MODULES`).
    echo "  Python test modules by CPU seconds (all of them, then the ten busiest):"
    { grep -o 'module-cpu [0-9.]* s [^ <]*' "$build/suite-junit.xml" || true; } | sort -k2 -rn |
      awk '{ t += $2; l[NR] = sprintf("    %8.1f  %s", $2, $4) }
           END { printf "    %8.1f  (%d modules)\n", t, NR
                 for (i = 1; i <= NR && i <= 10; i++) print l[i] }'
    # Why each failed test failed, in a few lines (its whole output is above, and in the report).
    python3 "$root/scripts/suite_failures.py" "$build/suite-junit.xml" || true
  fi
} | tee "$build/suite-times.txt"
exit "$rc"
