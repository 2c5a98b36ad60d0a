// Pins Helm for the end-to-end tests (built by ../../build-k8s-tools.sh). A module of its own so
// that Helm keeps the dependency versions it was released with.
module virtualflow/tests/e2e/k8s/helm

go 1.26.0

require helm.sh/helm/v3 v3.22.0
