/* A process killed inside its checkpoint, for the checkpoint sweep
 * (queue_core.lab.sweeps.checkpoint).
 *
 * In WAL mode SQLite writes the main database file only when it checkpoints:
 * it copies pages from the -wal into the file (pwrite), flushes the file
 * (fsync or fdatasync) and may cut it to its new size (ftruncate). This shim
 * counts those calls on the file named by KILLCHECKPOINT_FILE (an absolute
 * path) and, before the KILLCHECKPOINT_AT-th of them, sends the process
 * SIGKILL: the kernel ends it there, as a kill -9 or an OOM kill would, with
 * the pages before that point copied and the rest not. KILLCHECKPOINT_AT=0
 * (or unset) only counts; the count is written at exit to the file named by
 * KILLCHECKPOINT_REPORT, if set.
 *
 *   cc -O2 -shared -fPIC -o build/killcheckpoint.so benchmarks/killcheckpoint.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

static long calls;

static int is_the_file(int fd) {
    const char *wanted = getenv("KILLCHECKPOINT_FILE");
    if (!wanted) return 0;
    char link[64], target[PATH_MAX];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, target, sizeof target - 1);
    if (n < 0) return 0;
    target[n] = '\0';
    return strcmp(target, wanted) == 0;
}

static void count(int fd) {
    if (!is_the_file(fd)) return;
    long at = getenv("KILLCHECKPOINT_AT") ? atol(getenv("KILLCHECKPOINT_AT")) : 0;
    if (++calls == at) raise(SIGKILL);
}

__attribute__((destructor)) static void report(void) {
    const char *path = getenv("KILLCHECKPOINT_REPORT");
    if (!path) return;
    FILE *out = fopen(path, "w");
    if (out) { fprintf(out, "%ld\n", calls); fclose(out); }
}

typedef ssize_t (*pwrite_f)(int, const void *, size_t, off_t);
typedef ssize_t (*write_f)(int, const void *, size_t);
typedef int (*sync_f)(int);
typedef int (*truncate_f)(int, off_t);
#define REAL(name, type) static type real; if (!real) real = (type)dlsym(RTLD_NEXT, name)

ssize_t pwrite(int fd, const void *buf, size_t n, off_t offset) {
    REAL("pwrite", pwrite_f);
    count(fd);
    return real(fd, buf, n, offset);
}

ssize_t pwrite64(int fd, const void *buf, size_t n, off_t offset) {
    REAL("pwrite64", pwrite_f);
    count(fd);
    return real(fd, buf, n, offset);
}

ssize_t write(int fd, const void *buf, size_t n) {
    REAL("write", write_f);
    count(fd);
    return real(fd, buf, n);
}

int fsync(int fd) {
    REAL("fsync", sync_f);
    count(fd);
    return real(fd);
}

int fdatasync(int fd) {
    REAL("fdatasync", sync_f);
    count(fd);
    return real(fd);
}

int ftruncate(int fd, off_t length) {
    REAL("ftruncate", truncate_f);
    count(fd);
    return real(fd, length);
}

int ftruncate64(int fd, off_t length) {
    REAL("ftruncate64", truncate_f);
    count(fd);
    return real(fd, length);
}
