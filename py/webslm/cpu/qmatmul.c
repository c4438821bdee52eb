/* Quantized matrix products for the CPU path: y[i, j] = x[i, :] . W[j, :] with W kept as the
 * artifact stores it (docs/slm-format.md): q8 codes (int8) or q4 codes (two a byte, low nibble
 * first), one f32 scale a block (and one f32 min a block for q4 "min"). W is never decoded
 * to f32 in memory: each code becomes a float in a register, next to its x.
 *
 * One source, two builds (tools/build_kernels.py):
 *   WebAssembly (clang --target=wasm32 -msimd128): the Pyodide worker instantiates it on
 *     Pyodide's own memory, so every pointer below is an address in Pyodide's heap (numpy
 *     arrays' data). It must never touch memory it was not given: no static data and no
 *     stack (the build script refuses a module that uses the stack pointer or has data).
 *   native (clang -O3, ctypes in CPython).
 * Both are built with -ffp-contract=off and without -ffast-math, so the f32 operations below
 * happen in the order written: the two builds give bit-identical results, and an output
 * element never depends on how many rows of x or W a call covers. The arithmetic is defined
 * on 4 lanes; pair() runs two rows of W side by side in 8-lane vectors (one AVX2 instruction
 * natively, two simd128 ones in Wasm), each half exactly as tile() runs one row.
 *
 * Codes are read 16 bytes at a time as four 32-bit lanes; the code in bits 4k.. of every lane
 * (q4: nibble k, k = 0..7; q8: byte k, k = 0..3) forms "group" k, a 4-lane vector of exact
 * small integers (q8: code; q4 "offset": code - 8; q4 "min": code), converted to f32. So
 * group k of a 32-code chunk holds the elements {k, 8+k, 16+k, 24+k} (q4) or, per 16 bytes,
 * {k, 4+k, 8+k, 12+k} (q8), and x is passed permuted to meet them (prepare() in
 * qmatrix.py): x'[4k + l] pairs with the code in lane l of group k.
 *
 * One output, B = block size (a multiple of 32), chunks of 32 codes:
 *   g_k = x'_k * c_k                               8 products of 4 lanes per chunk
 *   p   = ((g0 + g1) + (g2 + g3)) + ((g4 + g5) + (g6 + g7))
 *   d   = p_0 + p_1 + ... over the block's chunks, in order
 *   a   = a + scale_b * d over the blocks, in order, from 0
 *   y   = (a0 + a2) + (a1 + a3)  [+ t for q4 "min", t = t + min_b * xsum_b over the blocks]
 * xsum_b (webslm_block_sums) is the same tree over the block's x' without codes.
 * x rows are zero-padded to whole blocks, so the padding's codes contribute nothing.
 */
#include <stdint.h>

typedef float v4f __attribute__((vector_size(16)));
typedef int32_t v4i __attribute__((vector_size(16)));
typedef uint32_t v4u __attribute__((vector_size(16)));

#define EXPORT __attribute__((visibility("default")))
#define INLINE static inline __attribute__((always_inline))
#define M_TILE 4   /* rows of x that share one unpacking of a weight chunk (tile) */

/* Natively, ask for the codes PREFETCH_BYTES ahead of the chunk being read. The hardware
 * prefetcher alone left a mat-vec over weights that are not in cache (the 49k-row head, every
 * layer's weights in decode) at a third of its in-cache speed (bench/cpu.py; docs/RESULTS.md).
 * A prefetch only moves bytes into cache and never faults, so reading past a row's end is
 * harmless and the arithmetic is untouched. Only when a row of W is read once (one or two
 * rows of x, pair's and tile's first pass): with more, the same rows are read again from
 * cache, and the prefetches cost a prompt's chunks ~10%. Wasm has no prefetch: the .wasm is
 * unchanged. */
#define PREFETCH_BYTES 2048
#ifdef __wasm__
#define PREFETCH(p) ((void)0)
#else
#define PREFETCH(p) do { if (prefetch) __builtin_prefetch((const char *)(p) + PREFETCH_BYTES); } while (0)
#endif

INLINE v4f load4(const float *p) { v4f v; __builtin_memcpy(&v, p, 16); return v; }
INLINE v4i load_codes(const void *p) { v4i v; __builtin_memcpy(&v, p, 16); return v; }
INLINE v4f splat(float s) { return (v4f){s, s, s, s}; }
INLINE float hsum(v4f a) { return (a[0] + a[2]) + (a[1] + a[3]); }

/* The 8 groups of one 32-code chunk (or, for pairs below, of two rows' chunks side by side). */
typedef struct { v4f c[8]; } chunk;

/* The groups as integer vectors, for any lane count (V: v4i, v8i):
 * q8: byte k of each lane of a (groups 0-3) and b (4-7), sign-extended: to the top and back.
 * q4 "offset": code - 8 is the 4-bit two's complement of code ^ 8: flip every nibble's top bit
 *   once, then sign-extend nibble k as q8 does bytes.
 * q4 "min": nibble k as it is (0..15). */
#define Q8_GROUPS(a, b, F) {F((a << 24) >> 24), F((a << 16) >> 24), F((a << 8) >> 24), F(a >> 24), \
                            F((b << 24) >> 24), F((b << 16) >> 24), F((b << 8) >> 24), F(b >> 24)}
#define Q4_OFFSET_GROUPS(q, F) {F((q << 28) >> 28), F((q << 24) >> 28), F((q << 20) >> 28), F((q << 16) >> 28), \
                                F((q << 12) >> 28), F((q << 8) >> 28), F((q << 4) >> 28), F(q >> 28)}
#define Q4_MIN_GROUPS(u, F) {F(u & 15), F((u >> 4) & 15), F((u >> 8) & 15), F((u >> 12) & 15), \
                             F((u >> 16) & 15), F((u >> 20) & 15), F((u >> 24) & 15), F(u >> 28)}
#define TO_F4(v) __builtin_convertvector((v4i)(v), v4f)

INLINE chunk unpack_q8(const int8_t *p) {
    v4i a = load_codes(p), b = load_codes(p + 16);
    return (chunk){Q8_GROUPS(a, b, TO_F4)};
}

INLINE chunk unpack_q4_offset(const uint8_t *p) {
    v4i q = load_codes(p) ^ (int32_t)0x88888888;
    return (chunk){Q4_OFFSET_GROUPS(q, TO_F4)};
}

INLINE chunk unpack_q4_min(const uint8_t *p) {
    v4u u = (v4u)load_codes(p);
    return (chunk){Q4_MIN_GROUPS(u, TO_F4)};
}

/* p for the 32 values of x' at xp and one chunk of codes. */
INLINE v4f chunk_dot(const float *xp, chunk c) {
    v4f g0 = load4(xp) * c.c[0], g1 = load4(xp + 4) * c.c[1], g2 = load4(xp + 8) * c.c[2];
    v4f g3 = load4(xp + 12) * c.c[3], g4 = load4(xp + 16) * c.c[4], g5 = load4(xp + 20) * c.c[5];
    v4f g6 = load4(xp + 24) * c.c[6], g7 = load4(xp + 28) * c.c[7];
    return ((g0 + g1) + (g2 + g3)) + ((g4 + g5) + (g6 + g7));
}

enum kind { Q8, Q4_OFFSET, Q4_MIN };

/* y[i, j] for `rows` (1..M_TILE) rows of x' (x, leading dimension ldx) and one weight row j
 * (its codes and scales), written to out[0], out[ldy], ... */
INLINE void tile(const float *x, int ldx, int rows, const uint8_t *codes, const float *scales,
                 int nblocks, int block, enum kind kind, float *out, int ldy, int prefetch) {
    (void)prefetch;
    v4f a0 = splat(0), a1 = splat(0), a2 = splat(0), a3 = splat(0);
    const int chunks = block / 32, chunk_bytes = kind == Q8 ? 32 : 16;
    for (int b = 0; b < nblocks; b++) {
        v4f d0 = splat(0), d1 = splat(0), d2 = splat(0), d3 = splat(0);
        for (int k = 0; k < chunks; k++) {
            const uint8_t *p = codes + (b * chunks + k) * chunk_bytes;
            PREFETCH(p);
            chunk c = kind == Q8 ? unpack_q8((const int8_t *)p) : kind == Q4_OFFSET ? unpack_q4_offset(p) : unpack_q4_min(p);
            const float *xp = x + (b * chunks + k) * 32;
            /* the first chunk starts d: 0 + p would turn a -0 into +0, nothing else */
            v4f p0 = chunk_dot(xp, c);
            d0 = k ? d0 + p0 : p0;
            if (rows > 1) { v4f p1 = chunk_dot(xp + ldx, c); d1 = k ? d1 + p1 : p1; }
            if (rows > 2) { v4f p2 = chunk_dot(xp + 2 * ldx, c); d2 = k ? d2 + p2 : p2; }
            if (rows > 3) { v4f p3 = chunk_dot(xp + 3 * ldx, c); d3 = k ? d3 + p3 : p3; }
        }
        const v4f s = splat(scales[b]);
        a0 = a0 + s * d0;
        if (rows > 1) a1 = a1 + s * d1;
        if (rows > 2) a2 = a2 + s * d2;
        if (rows > 3) a3 = a3 + s * d3;
    }
    out[0] = hsum(a0);
    if (rows > 1) out[ldy] = hsum(a1);
    if (rows > 2) out[2 * ldy] = hsum(a2);
    if (rows > 3) out[3 * ldy] = hsum(a3);
}

/* Two rows of W at once, one in each half of 8-lane vectors: each half does exactly what
 * tile() does for its row (same operations, same order), so the results are the same bits;
 * the x' values are shared (native AVX2 does both rows in one instruction). One row of x. */
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef uint32_t v8u __attribute__((vector_size(32)));
typedef struct { v8f c[8]; } chunk2;
#define TO_F8(v) __builtin_convertvector((v8i)(v), v8f)

INLINE v8i load_codes2(const uint8_t *p0, const uint8_t *p1) {
    v4i a = load_codes(p0), b = load_codes(p1);
    return __builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7);
}

INLINE v8f twice(v4f x) { return __builtin_shufflevector(x, x, 0, 1, 2, 3, 0, 1, 2, 3); }

INLINE v8f chunk_dot2(const float *xp, chunk2 c) {
    v8f g0 = twice(load4(xp)) * c.c[0], g1 = twice(load4(xp + 4)) * c.c[1], g2 = twice(load4(xp + 8)) * c.c[2];
    v8f g3 = twice(load4(xp + 12)) * c.c[3], g4 = twice(load4(xp + 16)) * c.c[4], g5 = twice(load4(xp + 20)) * c.c[5];
    v8f g6 = twice(load4(xp + 24)) * c.c[6], g7 = twice(load4(xp + 28)) * c.c[7];
    return ((g0 + g1) + (g2 + g3)) + ((g4 + g5) + (g6 + g7));
}

/* rows (1 or 2) rows of x' against two rows of W; out[0], out[1] for x row 0, out[ldy],
 * out[ldy + 1] for x row 1. */
INLINE void pair(const float *x, int ldx, int rows, const uint8_t *row0, const uint8_t *row1,
                 const float *s0, const float *s1, int nblocks, int block, enum kind kind, float *out, int ldy,
                 int prefetch) {
    (void)prefetch;
    v8f a0 = {0, 0, 0, 0, 0, 0, 0, 0}, a1 = a0;
    const int chunks = block / 32, chunk_bytes = kind == Q8 ? 32 : 16;
    for (int b = 0; b < nblocks; b++) {
        v8f d0 = {0, 0, 0, 0, 0, 0, 0, 0}, d1 = d0;
        for (int k = 0; k < chunks; k++) {
            const int at = (b * chunks + k) * chunk_bytes;
            PREFETCH(row0 + at);
            PREFETCH(row1 + at);
            chunk2 c;
            if (kind == Q8) {
                v8i lo = load_codes2(row0 + at, row1 + at), hi = load_codes2(row0 + at + 16, row1 + at + 16);
                c = (chunk2){Q8_GROUPS(lo, hi, TO_F8)};
            } else if (kind == Q4_OFFSET) {
                v8i q = load_codes2(row0 + at, row1 + at) ^ (int32_t)0x88888888;
                c = (chunk2){Q4_OFFSET_GROUPS(q, TO_F8)};
            } else {
                v8u u = (v8u)load_codes2(row0 + at, row1 + at);
                c = (chunk2){Q4_MIN_GROUPS(u, TO_F8)};
            }
            const float *xp = x + (b * chunks + k) * 32;
            v8f p0 = chunk_dot2(xp, c);
            d0 = k ? d0 + p0 : p0;
            if (rows > 1) { v8f p1 = chunk_dot2(xp + ldx, c); d1 = k ? d1 + p1 : p1; }
        }
        const v8f s = {s0[b], s0[b], s0[b], s0[b], s1[b], s1[b], s1[b], s1[b]};
        a0 = a0 + s * d0;
        if (rows > 1) a1 = a1 + s * d1;
    }
    out[0] = (a0[0] + a0[2]) + (a0[1] + a0[3]);
    out[1] = (a0[4] + a0[6]) + (a0[5] + a0[7]);
    if (rows > 1) {
        out[ldy] = (a1[0] + a1[2]) + (a1[1] + a1[3]);
        out[ldy + 1] = (a1[4] + a1[6]) + (a1[5] + a1[7]);
    }
}

/* Rows of W in pairs against rows of x in twos (pair), then an odd last row of W against rows
 * of x in fours (tile): every output by the same arithmetic. */
INLINE void matmul_rows(const float *x, int m, const uint8_t *codes, int row_bytes, const float *scales,
                        int n, int nblocks, int block, enum kind kind, float *y, int ldy, int prefetch) {
    const int ldx = nblocks * block;
    int j = 0;
    for (; j + 2 <= n; j += 2) {
        const uint8_t *r0 = codes + (long)j * row_bytes, *r1 = r0 + row_bytes;
        const float *s0 = scales + (long)j * nblocks, *s1 = s0 + nblocks;
        int i = 0;
        for (; i + 2 <= m; i += 2)
            pair(x + (long)i * ldx, ldx, 2, r0, r1, s0, s1, nblocks, block, kind, y + (long)i * ldy + j, ldy, prefetch && i == 0);
        if (i < m)
            pair(x + (long)i * ldx, ldx, 1, r0, r1, s0, s1, nblocks, block, kind, y + (long)i * ldy + j, ldy, prefetch && i == 0);
    }
    for (; j < n; j++) {
        const uint8_t *row = codes + (long)j * row_bytes;
        const float *s = scales + (long)j * nblocks;
        int i = 0;
        for (; i + M_TILE <= m; i += M_TILE)
            tile(x + (long)i * ldx, ldx, M_TILE, row, s, nblocks, block, kind, y + (long)i * ldy + j, ldy, prefetch && i == 0);
        for (; i < m; i++)
            tile(x + (long)i * ldx, ldx, 1, row, s, nblocks, block, kind, y + (long)i * ldy + j, ldy, prefetch && i == 0);
    }
}

INLINE void matmul(const float *x, int m, const uint8_t *codes, int row_bytes, const float *scales,
                   int n, int nblocks, int block, enum kind kind, float *y, int ldy) {
#ifdef __wasm__
    matmul_rows(x, m, codes, row_bytes, scales, n, nblocks, block, kind, y, ldy, 0);
#else
    if (m <= 2)              /* each row of W read once, from memory: prefetch it */
        matmul_rows(x, m, codes, row_bytes, scales, n, nblocks, block, kind, y, ldy, 1);
    else
        matmul_rows(x, m, codes, row_bytes, scales, n, nblocks, block, kind, y, ldy, 0);
#endif
}

/* y [m, ldy] (columns 0..n-1 written) = x' [m, nblocks * block] . W^T, W q8:
 * codes [n, nblocks * block] int8, scales [n, nblocks] f32. block: 32, 64, 128 or 256. */
EXPORT void webslm_q8_matmul(const float *x, int m, const int8_t *codes, const float *scales,
                             int n, int nblocks, int block, float *y, int ldy) {
    matmul(x, m, (const uint8_t *)codes, nblocks * block, scales, n, nblocks, block, Q8, y, ldy);
}

/* The same for q4: codes [n, nblocks * block / 2]; mins [n, nblocks] f32 for "min", or null
 * for "offset"; xsums [m, nblocks] (webslm_block_sums of x') when mins is given. */
EXPORT void webslm_q4_matmul(const float *x, int m, const uint8_t *codes, const float *scales,
                             const float *mins, const float *xsums, int n, int nblocks, int block,
                             float *y, int ldy) {
    if (!mins) {
        matmul(x, m, codes, nblocks * block / 2, scales, n, nblocks, block, Q4_OFFSET, y, ldy);
        return;
    }
    matmul(x, m, codes, nblocks * block / 2, scales, n, nblocks, block, Q4_MIN, y, ldy);
    for (int i = 0; i < m; i++) {
        const float *xs = xsums + (long)i * nblocks;
        for (int j = 0; j < n; j++) {
            const float *mn = mins + (long)j * nblocks;
            float t = 0;
            for (int b = 0; b < nblocks; b++) t = t + mn[b] * xs[b];
            y[(long)i * ldy + j] = y[(long)i * ldy + j] + t;
        }
    }
}

/* out [m, nblocks] = the sum of each block of x' [m, nblocks * block], by chunk_dot's tree
 * (without codes), chunks in order, then hsum. */
EXPORT void webslm_block_sums(const float *x, int m, int nblocks, int block, float *out) {
    for (long i = 0; i < (long)m * nblocks; i++) {
        v4f d = splat(0);
        for (int k = 0; k < block / 32; k++) {
            const float *xp = x + i * block + k * 32;
            v4f p = ((load4(xp) + load4(xp + 4)) + (load4(xp + 8) + load4(xp + 12)))
                  + ((load4(xp + 16) + load4(xp + 20)) + (load4(xp + 24) + load4(xp + 28)));
            d = k ? d + p : p;
        }
        out[i] = hsum(d);
    }
}

/* x [m, k] (rows ldx apart) -> x' [m, nblocks * block]: zero-padded to whole blocks and
 * permuted inside every 32 values so that x'[4g + l] meets the code in lane l of group g:
 * q4: x[8l + g]; q8: x[16h + 4l + g'] for g = 4h + g'. With xsums (q4 "min"), also its
 * block sums [m, nblocks] (webslm_block_sums). Only moves values: no rounding. */
EXPORT void webslm_prepare(const float *x, int m, int k, int ldx, int nblocks, int block, int q4,
                           float *out, float *xsums) {
    const int padded = nblocks * block;
    for (int i = 0; i < m; i++) {
        const float *row = x + (long)i * ldx;
        float *o = out + (long)i * padded;
        for (int c = 0; c < padded; c += 32)
            for (int g = 0; g < 8; g++)
                for (int l = 0; l < 4; l++) {
                    const int e = c + (q4 ? 8 * l + g : 16 * (g / 4) + 4 * l + g % 4);
                    o[c + 4 * g + l] = e < k ? row[e] : 0.0f;
                }
    }
    if (xsums) webslm_block_sums(out, m, nblocks, block, xsums);
}
