/* LD_PRELOAD fault injector for net_faults.rs: once the file named by GDPATH_SEND_RESET_AT
 * exists, send() and sendmsg() on connected stream sockets fail with ECONNRESET, as when the
 * kernel reports a peer's reset on a send before any receive sees it. Everything else passes
 * through to libc. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

static int reset_now(int fd) {
    const char *at = getenv("GDPATH_SEND_RESET_AT");
    if (at == NULL || access(at, F_OK) != 0) {
        return 0;
    }
    int type = 0;
    socklen_t len = sizeof type;
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_STREAM) {
        return 0;
    }
    struct sockaddr_storage peer;
    socklen_t plen = sizeof peer;
    return getpeername(fd, (struct sockaddr *)&peer, &plen) == 0;
}

ssize_t sendmsg(int fd, const struct msghdr *msg, int flags) {
    static ssize_t (*real)(int, const struct msghdr *, int);
    if (real == NULL) {
        real = (ssize_t (*)(int, const struct msghdr *, int))dlsym(RTLD_NEXT, "sendmsg");
    }
    if (reset_now(fd)) {
        errno = ECONNRESET;
        return -1;
    }
    return real(fd, msg, flags);
}

ssize_t send(int fd, const void *buf, size_t len, int flags) {
    static ssize_t (*real)(int, const void *, size_t, int);
    if (real == NULL) {
        real = (ssize_t (*)(int, const void *, size_t, int))dlsym(RTLD_NEXT, "send");
    }
    if (reset_now(fd)) {
        errno = ECONNRESET;
        return -1;
    }
    return real(fd, buf, len, flags);
}
