/* A slow disk for make bench: every fsync and fdatasync waits SLOWSYNC_US
 * microseconds (2000 unless set) before the real call, and is counted.
 *
 *   cc -O2 -shared -fPIC -o build/slowsync.so benchmarks/slowsync.c -ldl
 *   LD_PRELOAD=$PWD/build/slowsync.so python ...
 *
 * slowsync_calls() returns the calls so far (ctypes: CDLL(None).slowsync_calls),
 * so a process can count its own flushes; SLOWSYNC_US=0 only counts. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <time.h>

static long calls;

long slowsync_calls(void) { return __atomic_load_n(&calls, __ATOMIC_RELAXED); }

static void slow_down(void) {
    static long delay_us = -1;
    if (delay_us < 0) {
        const char *given = getenv("SLOWSYNC_US");
        delay_us = given ? atol(given) : 2000;
    }
    __atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED);
    struct timespec wait = {delay_us / 1000000, (delay_us % 1000000) * 1000};
    while (delay_us > 0 && nanosleep(&wait, &wait) != 0) {}
}

int fsync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    slow_down();
    return real(fd);
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    slow_down();
    return real(fd);
}
