/* The native build of qmatmul.c, with one more pair of entry points: the same products with
 * W's rows shared among threads of a pool kept here (tools/build_kernels.py builds this file
 * for CPython; the Wasm build is qmatmul.c alone, one thread, no libc).
 *
 * Why in C: handing a product to a Python thread costs a lock, a GIL hand-over and a wake-up
 * of a sleeping thread, tens of microseconds on a 2-core VM, and a SmolLM2 decode step has
 * ~120 products of 0.05-0.3 ms each. Splitting them through Python decoded slower than one
 * thread (docs/RESULTS.md, "Decode step: profile and speed-ups"). Here a helper that has just
 * finished a part spins for a while (SPIN_NS) watching for the next one, so a step's products
 * reach it within a few hundred nanoseconds; after SPIN_NS without work it sleeps on a
 * condition variable, and the next product wakes it.
 *
 * Results do not depend on the split: an output element is computed by the same arithmetic
 * whichever thread computes it and whatever rows share its call (qmatmul.c's header), so the
 * products are bit for bit those of webslm_q8_matmul / webslm_q4_matmul.
 *
 * One job at a time: a caller that finds the pool busy (another Python thread's product)
 * computes its whole product itself. A forked child starts its own helpers. */
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

#include "qmatmul.c"

enum { MAX_PARTS = 8 };
#ifndef SPIN_NS
#define SPIN_NS 200000L            /* how long an idle helper watches for work before it sleeps */
#endif

/* One product: the arguments of webslm_q4_matmul (q8: codes as bytes, mins and xsums unused). */
struct product {
    int q8;
    const float *x;
    int m;
    const uint8_t *codes;
    const float *scales, *mins, *xsums;
    int n, nblocks, block;
    float *y;
    int ldy;
};

/* Part `part` of `parts` of the product: rows j0..j1 of W (columns j0..j1 of y), by the
 * one-thread entry points on those rows, as the Python helpers call them (cpu/kernels.py). */
static void product_part(const struct product *p, int part, int parts) {
    const int j0 = (int)((long)p->n * part / parts), j1 = (int)((long)p->n * (part + 1) / parts);
    if (j1 <= j0)
        return;
    const long row_bytes = p->q8 ? (long)p->nblocks * p->block : (long)p->nblocks * p->block / 2;
    const long skip = (long)j0 * p->nblocks;       /* scales and mins are [n, nblocks] */
    if (p->q8)
        webslm_q8_matmul(p->x, p->m, (const int8_t *)p->codes + j0 * row_bytes, p->scales + skip, j1 - j0,
                         p->nblocks, p->block, p->y + j0, p->ldy);
    else
        webslm_q4_matmul(p->x, p->m, p->codes + j0 * row_bytes, p->scales + skip, p->mins ? p->mins + skip : 0,
                         p->xsums, j1 - j0, p->nblocks, p->block, p->y + j0, p->ldy);
}

static struct {
    pthread_mutex_t lock;
    pthread_cond_t wake;
    atomic_uint generation;        /* moves when a job is posted */
    atomic_int pending;            /* helpers still on the posted job */
    atomic_flag busy;              /* held by the caller whose job the helpers have */
    int sleeping;                  /* helpers waiting on `wake` (under lock) */
    int helpers;                   /* started, in process `pid` */
    pid_t pid;
    unsigned created_at;           /* the generation while helpers are created (no job posted) */
    int parts;                     /* of the posted job: the caller takes part 0, helper i part i + 1 */
    struct product job;
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, ATOMIC_FLAG_INIT, 0, 0, 0, 0, 0, {0}};

static long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

static inline void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* The generation after `seen`: spun for, then slept for. */
static unsigned next_job(unsigned seen) {
    long until = now_ns() + SPIN_NS;
    for (int spins = 0;; spins++) {
        unsigned now = atomic_load_explicit(&pool.generation, memory_order_acquire);
        if (now != seen)
            return now;
        relax();
        if ((spins & 1023) == 1023 && now_ns() > until)
            break;
    }
    pthread_mutex_lock(&pool.lock);
    pool.sleeping++;
    unsigned now;
    while ((now = atomic_load_explicit(&pool.generation, memory_order_acquire)) == seen)
        pthread_cond_wait(&pool.wake, &pool.lock);
    pool.sleeping--;
    pthread_mutex_unlock(&pool.lock);
    return now;
}

static void *helper_main(void *arg) {
    const int part = (int)(long)arg;
    /* the generation when it was created, not now: the caller that created it posts a job
     * right after, maybe before this thread first runs */
    unsigned seen = pool.created_at;
    for (;;) {
        seen = next_job(seen);
        if (part < pool.parts)
            product_part(&pool.job, part, pool.parts);
        atomic_fetch_sub_explicit(&pool.pending, 1, memory_order_release);
    }
    return 0;
}

/* Helpers for parts 1..parts-1 in this process; false when none could be started. */
static int ensure_helpers(int parts) {
    if (pool.pid != getpid()) {          /* a forked child has none of its parent's threads, */
        pool.helpers = pool.sleeping = 0;
        pool.pid = getpid();
        pthread_mutex_init(&pool.lock, 0);   /* and a lock one of them held at the fork stays held */
        pthread_cond_init(&pool.wake, 0);
    }
    pool.created_at = atomic_load_explicit(&pool.generation, memory_order_relaxed);
    while (pool.helpers < parts - 1) {
        pthread_t thread;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int failed = pthread_create(&thread, &attr, helper_main, (void *)(long)(pool.helpers + 1));
        pthread_attr_destroy(&attr);
        if (failed)
            break;
        pool.helpers++;
    }
    return pool.helpers > 0;
}

static void run_shared(const struct product *p, int parts) {
    if (parts > MAX_PARTS)
        parts = MAX_PARTS;
    if (parts > p->n)
        parts = p->n;
    if (parts < 2 || atomic_flag_test_and_set_explicit(&pool.busy, memory_order_acquire)) {
        product_part(p, 0, 1);
        return;
    }
    if (!ensure_helpers(parts)) {
        atomic_flag_clear_explicit(&pool.busy, memory_order_release);
        product_part(p, 0, 1);
        return;
    }
    if (parts > pool.helpers + 1)
        parts = pool.helpers + 1;
    pool.job = *p;
    pool.parts = parts;
    atomic_store_explicit(&pool.pending, pool.helpers, memory_order_relaxed);
    pthread_mutex_lock(&pool.lock);      /* a helper about to sleep re-reads the generation under it */
    atomic_fetch_add_explicit(&pool.generation, 1, memory_order_release);
    if (pool.sleeping)
        pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.lock);
    product_part(p, 0, parts);
    while (atomic_load_explicit(&pool.pending, memory_order_acquire) > 0)
        relax();
    atomic_flag_clear_explicit(&pool.busy, memory_order_release);
}

/* webslm_q8_matmul with W's rows in `parts` consecutive ranges, one a thread. */
EXPORT void webslm_q8_matmul_shared(const float *x, int m, const int8_t *codes, const float *scales,
                                    int n, int nblocks, int block, float *y, int ldy, int parts) {
    const struct product p = {1, x, m, (const uint8_t *)codes, scales, 0, 0, n, nblocks, block, y, ldy};
    run_shared(&p, parts);
}

/* webslm_q4_matmul with W's rows in `parts` consecutive ranges, one a thread. */
EXPORT void webslm_q4_matmul_shared(const float *x, int m, const uint8_t *codes, const float *scales,
                                    const float *mins, const float *xsums, int n, int nblocks, int block,
                                    float *y, int ldy, int parts) {
    const struct product p = {0, x, m, codes, scales, mins, xsums, n, nblocks, block, y, ldy};
    run_shared(&p, parts);
}
