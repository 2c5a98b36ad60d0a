// The pod sandbox's process on the suite's real nodes: it holds the pod's namespaces and reaps
// the zombies re-parented to it, as Kubernetes' own pause does. Built static by nodes.py (there
// is no registry to pull registry.k8s.io/pause from) and packed into an image with umoci.
#include <signal.h>
#include <stddef.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) { _exit(sig == SIGTERM || sig == SIGINT ? 0 : 1); }

static void reap(int sig) {
  (void)sig;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(void) {
  if (getpid() != 1) return 1;  // only as a container's first process
  struct sigaction term = {.sa_handler = stop};
  struct sigaction child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
  if (sigaction(SIGINT, &term, NULL) < 0 || sigaction(SIGTERM, &term, NULL) < 0 ||
      sigaction(SIGCHLD, &child, NULL) < 0)
    return 2;
  for (;;) pause();
}
