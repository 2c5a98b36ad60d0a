//go:build tools

// The command ../../build-k8s-tools.sh builds from this module (see ../tools.go).
package tools

import _ "helm.sh/helm/v3/cmd/helm"
