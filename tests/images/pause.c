/* The pod sandbox's process for the container tests (tests/images, tests/cri): it holds the
 * pod's namespaces, reaps what is reparented to it, and exits 0 on SIGTERM or SIGINT, like
 * the pause image a kubelet uses. Linked statically, it is the only file of its image
 * (FROM scratch), so no registry is needed for it. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static void quit(int sig) {
    (void)sig;
    _exit(0);
}

static void reap(int sig) {
    (void)sig;
    while (waitpid(-1, 0, WNOHANG) > 0) {
    }
}

int main(void) {
    struct sigaction q = {0}, r = {0};
    q.sa_handler = quit;
    r.sa_handler = reap;
    r.sa_flags = SA_NOCLDSTOP | SA_RESTART;
    sigaction(SIGINT, &q, 0);
    sigaction(SIGTERM, &q, 0);
    sigaction(SIGCHLD, &r, 0);
    for (;;)
        pause();
}
