/* The pod sandbox's process for the real node's containerd (tests/bench/real_node.py):
 * it holds the pod's namespaces, reaps the orphans it inherits as PID 1, and exits on
 * SIGINT or SIGTERM. Built statically and shipped alone in a FROM scratch image, since no
 * registry is reachable to pull registry.k8s.io/pause. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int signum) { _exit(0); }

static void reap(int signum) {
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(void) {
    struct sigaction on_stop = {.sa_handler = stop};
    struct sigaction on_child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
    if (sigaction(SIGINT, &on_stop, NULL) < 0 || sigaction(SIGTERM, &on_stop, NULL) < 0 ||
        sigaction(SIGCHLD, &on_child, NULL) < 0) {
        return 1;
    }
    for (;;) {
        pause();
    }
}
