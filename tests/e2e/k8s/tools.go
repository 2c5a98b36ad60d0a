//go:build tools

// The commands ../build-k8s-tools.sh builds from this module. The build tag keeps this file out of
// every build; it only records the imports so that `go mod tidy` keeps their modules.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
