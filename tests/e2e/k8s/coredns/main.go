// Command coredns is CoreDNS (the module github.com/coredns/coredns, unmodified) with the few
// plugins the end-to-end suite's real nodes need to resolve Services as a cluster's DNS does:
// kubernetes (the <service>.<namespace>.svc.cluster.local records from the API server), bind,
// cache, errors, health and ready. CoreDNS's own main links all of its plugins, cloud providers' among
// them; this one is CoreDNS's documented way to choose them at build time.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/ready"
)

// The plugins in the order CoreDNS runs them (its plugin.cfg's order).
var directives = []string{"bind", "ready", "health", "errors", "cache", "kubernetes"}

func init() { dnsserver.Directives = directives }

func main() { coremain.Run() }
