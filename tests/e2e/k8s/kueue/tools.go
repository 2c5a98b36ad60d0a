//go:build tools

// The command ../../build-k8s-tools.sh builds from this module (see ../tools.go); the CRDs the
// tests install come from the same module (config/components/crd/bases).
package tools

import _ "sigs.k8s.io/kueue/cmd/kueue"
