// Pins Kueue for the end-to-end tests (built by ../../build-k8s-tools.sh, which reads the version
// from this file). A module of its own so that Kueue keeps the dependency versions it was released
// with (its Kubernetes libraries are older than the control plane's, as in a real cluster).
module virtualflow/tests/e2e/k8s/kueue

go 1.26.0

require sigs.k8s.io/kueue v0.17.0
