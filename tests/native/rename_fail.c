// An LD_PRELOAD shim for the rotation tests: rename() fails once with EIO when its new name ends
// with $RENAME_FAIL_SUFFIX, armed by the file $RENAME_FAIL_ARM (removed when it fires, so that one
// rename fails per arming). Every other rename is the C library's.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int rename(const char * from, const char * to) {
    static int (*real)(const char *, const char *) = NULL;
    if (!real) {
        real = (int (*)(const char *, const char *)) dlsym(RTLD_NEXT, "rename");
    }
    const char * arm    = getenv("RENAME_FAIL_ARM");
    const char * suffix = getenv("RENAME_FAIL_SUFFIX");
    if (arm && suffix && to) {
        const size_t n = strlen(to), m = strlen(suffix);
        if (n >= m && strcmp(to + n - m, suffix) == 0 && unlink(arm) == 0) {
            errno = EIO;
            return -1;
        }
    }
    return real(from, to);
}
