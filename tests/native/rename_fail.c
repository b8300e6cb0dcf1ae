// An LD_PRELOAD shim for the rotation tests: rename() fails with EIO when its new name ends with
// $RENAME_FAIL_SUFFIX, in one of two modes. With $RENAME_FAIL_FROM = N, every such rename from the
// N-th on fails (the renames before it succeed). Otherwise one fails each time the file
// $RENAME_FAIL_ARM is created (it is removed when it fires). With $RENAME_FAIL_LOG set, each
// rename failed is added to that file as a line "FROM -> TO". Every other rename is the C
// library's.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int fails(const char * to) {
    static long  seen   = 0;  // renames to the suffix so far
    const char * suffix = getenv("RENAME_FAIL_SUFFIX");
    if (!suffix || !to) {
        return 0;
    }
    const size_t n = strlen(to), m = strlen(suffix);
    if (n < m || strcmp(to + n - m, suffix) != 0) {
        return 0;
    }
    const char * from = getenv("RENAME_FAIL_FROM");
    if (from) {
        return ++seen >= atol(from);
    }
    const char * arm = getenv("RENAME_FAIL_ARM");
    return arm && unlink(arm) == 0;
}

static void note(const char * from, const char * to) {
    const char * log = getenv("RENAME_FAIL_LOG");
    if (!log) {
        return;
    }
    char      line[8192];
    const int n  = snprintf(line, sizeof(line), "%s -> %s\n", from, to);
    const int fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (fd >= 0) {
        if (n > 0 && write(fd, line, (size_t) n) != n) {
            // the test counts the lines: a short one shows up there
        }
        close(fd);
    }
}

int rename(const char * from, const char * to) {
    static int (*real)(const char *, const char *) = NULL;
    if (!real) {
        real = (int (*)(const char *, const char *)) dlsym(RTLD_NEXT, "rename");
    }
    if (fails(to)) {
        note(from, to);
        errno = EIO;
        return -1;
    }
    return real(from, to);
}
