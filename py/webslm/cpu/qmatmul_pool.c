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

/* One product: the arguments of webslm_q4_matmul (mins null for q8 and q4 "offset"). */
struct product {
    const float *x;
    int m;
    const uint8_t *codes;
    int row_bytes;
    const float *scales, *mins, *xsums;
    int n, nblocks, block;
    enum kind kind;
    float *y;
    int ldy;
};

/* Rows j0..j1 of W (columns j0..j1 of y), then q4 "min"'s correction for those columns. */
static void product_rows(const struct product *p, int j0, int j1) {
    if (j1 <= j0)
        return;
    matmul(p->x, p->m, p->codes + (long)j0 * p->row_bytes, p->row_bytes, p->scales + (long)j0 * p->nblocks,
           j1 - j0, p->nblocks, p->block, p->kind, p->y + j0, p->ldy);
    if (!p->mins)
        return;
    for (int i = 0; i < p->m; i++) {
        const float *xs = p->xsums + (long)i * p->nblocks;
        for (int j = j0; j < j1; j++) {
            const float *mn = p->mins + (long)j * p->nblocks;
            float t = 0;
            for (int b = 0; b < p->nblocks; b++) t = t + mn[b] * xs[b];
            p->y[(long)i * p->ldy + j] = p->y[(long)i * p->ldy + j] + t;
        }
    }
}

static void product_part(const struct product *p, int part, int parts) {
    product_rows(p, (int)((long)p->n * part / parts), (int)((long)p->n * (part + 1) / parts));
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
        product_rows(p, 0, p->n);
        return;
    }
    if (!ensure_helpers(parts)) {
        atomic_flag_clear_explicit(&pool.busy, memory_order_release);
        product_rows(p, 0, p->n);
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
    const struct product p = {x, m, (const uint8_t *)codes, nblocks * block, scales, 0, 0,
                              n, nblocks, block, Q8, y, ldy};
    run_shared(&p, parts);
}

/* webslm_q4_matmul with W's rows in `parts` consecutive ranges, one a thread. */
EXPORT void webslm_q4_matmul_shared(const float *x, int m, const uint8_t *codes, const float *scales,
                                    const float *mins, const float *xsums, int n, int nblocks, int block,
                                    float *y, int ldy, int parts) {
    const struct product p = {x, m, codes, nblocks * block / 2, scales, mins, xsums,
                              n, nblocks, block, mins ? Q4_MIN : Q4_OFFSET, y, ldy};
    run_shared(&p, parts);
}
