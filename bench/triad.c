/* STREAM-style triad (a[i] = b[i] + s * c[i]) and add (a[i] = b[i] + c[i]) over three arrays of
 * float, the independent check of the bandwidth probe of `instr peaks` (bench/probe_vs_triad.py compiles and
 * runs it). Counted as STREAM counts: three arrays of bytes per pass (two read, one written).
 *
 *   cc -O3 -fopenmp bench/triad.c -o triad && OMP_NUM_THREADS=2 ./triad N REPS
 *
 * Prints one JSON line: {"n":N,"threads":T,"triad_best_ns":...,"add_best_ns":...,"bytes":...}. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long) ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int main(int argc, char ** argv) {
    const long n    = argc > 1 ? atol(argv[1]) : 64L << 20;
    const int  reps = argc > 2 ? atoi(argv[2]) : 5;
    float *    a    = malloc(n * sizeof(float));
    float *    b    = malloc(n * sizeof(float));
    float *    c    = malloc(n * sizeof(float));
    if (!a || !b || !c || n < 1 || reps < 1) {
        fprintf(stderr, "usage: triad N REPS (N elements per array)\n");
        return 2;
    }
    /* first touch by the threads that use each page, as STREAM does */
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++) {
        a[i] = 0.0f;
        b[i] = 1.0f;
        c[i] = 2.0f;
    }
    const float s = 3.0f;
    long long   best_triad = -1, best_add = -1;
    for (int r = 0; r <= reps; r++) { /* pass 0 warms up */
        long long t0 = now_ns();
#pragma omp parallel for schedule(static)
        for (long i = 0; i < n; i++) {
            a[i] = b[i] + s * c[i];
        }
        long long t1 = now_ns();
#pragma omp parallel for schedule(static)
        for (long i = 0; i < n; i++) {
            a[i] = b[i] + c[i];
        }
        long long t2 = now_ns();
        if (r > 0) {
            if (best_triad < 0 || t1 - t0 < best_triad) best_triad = t1 - t0;
            if (best_add < 0 || t2 - t1 < best_add) best_add = t2 - t1;
        }
    }
    double check = 0; /* the result is used: the loops cannot be dropped */
    for (long i = 0; i < n; i += 4096) check += a[i];
    printf("{\"n\":%ld,\"threads\":%d,\"triad_best_ns\":%lld,\"add_best_ns\":%lld,\"bytes\":%ld,"
           "\"check\":%g}\n",
           n, omp_get_max_threads(), best_triad, best_add, 3 * n * (long) sizeof(float), check);
    free(a);
    free(b);
    free(c);
    return 0;
}
