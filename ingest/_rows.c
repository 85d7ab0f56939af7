/* attnstore.ingest._rows: one block of a causal layer's rows reduced from its logits in one pass per row, on the CPU.

   A Q/K run's ingest (ingest/streaming.py QKSink) rebuilds each layer's rows from the stored queries and keys to take
   their log-sum-exps and the row statistics (ingest/row_stats.py, the fields of store/row_stats.py). In torch each step
   of that is a pass over a whole block of rows (heads x rows x keys, several MiB): scale, mask, maximum, exponential,
   sum, logarithm, cumulative sum, top keys, column sums. Here each row is read from the block once and worked on while
   it is in the cache: its maximum, one exponential per key, the log-sum-exp, then every statistic from the weights.
   `python benchmarks/decoder_capture.py --length 2048 --long 0` measures the two ways against each other.

   The mask is the rule ingest checked the model's against (QKSink._check_mask): row i sees keys j <= i within its
   example's length and, in a sliding layer, i - j < window. Weights follow ingest/row_stats.py: log weights floored at
   LOWEST_LOG_WEIGHT, weights under SUBNORMAL counted as 0, entropy -sum w (logit - lse), top keys by weight with the
   earlier key first among equal weights. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define KERNEL_VERSION 1
#define LOWEST_LOG_WEIGHT (-87.0f)
#define SUBNORMAL 2e-38f

/* exp(x) for x in [LOWEST_LOG_WEIGHT, 0], within 2 ulp (Cephes' expf polynomial): branch-free, so that the compiler
   makes vector instructions of it (-fopenmp-simd: the reductions of these loops may be reordered, as torch's are); the floor keeps 2^n normal (n >= -126). */
static inline float exp_floored(float x) {
    x = x < LOWEST_LOG_WEIGHT ? LOWEST_LOG_WEIGHT : x;
    float n = x * 1.44269504088896341f + 12582912.0f; /* rounded to the nearest integer by the float's precision */
    n -= 12582912.0f;
    float r = x - n * 0.693359375f;
    r -= n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    union {
        int32_t i;
        float f;
    } two = {.i = ((int32_t)n + 127) << 23};
    return p * two.f;
}

/* On x86-64 Linux the per-key loops are compiled twice, for AVX2 with FMA and for any x86-64, and the loader picks the
   one the processor runs (an ifunc): twice the keys per instruction where AVX2 is there, with a wheel that runs
   everywhere. */
#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__)
#define PER_KEY __attribute__((noinline, target_clones("arch=x86-64-v3", "default")))
#else
#define PER_KEY __attribute__((noinline))
#endif

/* The loops over a row's keys, each its own function so that the compiler makes one vector loop of each (inlined into
   the row's code, gcc 12 kept a scalar copy of the exponential's loop and ran that). */
PER_KEY static float row_max(const float *restrict x, Py_ssize_t n) {
    float m = -INFINITY;
#pragma omp simd reduction(max : m)
    for (Py_ssize_t j = 0; j < n; j++) m = x[j] > m ? x[j] : m;
    return m;
}

/* e[j] = exp(x[j] - m); returns their sum */
PER_KEY static float exp_sum(const float *restrict x, float m, float *restrict e, Py_ssize_t n) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (Py_ssize_t j = 0; j < n; j++) {
        const float v = exp_floored(x[j] - m);
        e[j] = v;
        s += v;
    }
    return s;
}

/* e[j] *= c, then 0 where under SUBNORMAL */
PER_KEY static void scale_by(float *restrict e, float c, Py_ssize_t n) {
#pragma omp simd
    for (Py_ssize_t j = 0; j < n; j++) {
        const float v = e[j] * c;
        e[j] = v < SUBNORMAL ? 0.0f : v;
    }
}

/* -sum w (logit - lse) over the weights w, and (in *sum) their sum */
PER_KEY static float entropy_of(const float *restrict w, const float *restrict x, float lse, Py_ssize_t n,
                                                  float *sum) {
    float entropy = 0.0f, total = 0.0f;
#pragma omp simd reduction(+ : entropy, total)
    for (Py_ssize_t j = 0; j < n; j++) {
        entropy -= w[j] * (x[j] - lse);
        total += w[j];
    }
    *sum = total;
    return entropy;
}

PER_KEY static float sum_of(const float *restrict x, Py_ssize_t n) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (Py_ssize_t j = 0; j < n; j++) s += x[j];
    return s;
}

#define SPAN 64
/* out[s] = the largest of x[s SPAN .. (s + 1) SPAN - 1] (the last span may be short) */
PER_KEY static void span_maxima(const float *restrict x, Py_ssize_t n, float *restrict out) {
    for (Py_ssize_t j0 = 0, s = 0; j0 < n; j0 += SPAN, s++) {
        const Py_ssize_t m = n - j0 < SPAN ? n - j0 : SPAN;
        float peak = 0.0f; /* weights are >= 0 */
#pragma omp simd reduction(max : peak)
        for (Py_ssize_t j = 0; j < m; j++) peak = x[j0 + j] > peak ? x[j0 + j] : peak;
        out[s] = peak;
    }
}

PER_KEY static void add_to(double *restrict column, const float *restrict w, Py_ssize_t n) {
#pragma omp simd
    for (Py_ssize_t j = 0; j < n; j++) column[j] += w[j];
}

static int check(Py_buffer *b, Py_ssize_t items, Py_ssize_t itemsize, const char *name) {
    if (b->len != items * itemsize) {
        PyErr_Format(PyExc_ValueError, "block: %s holds %zd bytes, not %zd", name, b->len, items * itemsize);
        return 0;
    }
    return 1;
}

/* Offsets of the fields in a row's output (store/row_stats.py FIELDS), passed by the caller. */
enum { F_FIRST, F_POSITIONS, F_ENTROPY, F_SINK, F_DISTANCE, F_BINS, F_TOP, F_TOP_K, F_DUPLICATE, F_INDUCTION, F_COUNT, F_N };

/* One row: keys lo..hi of `logit` (the rest masked); `e` a scratch of hi + 1 floats. Writes the row's log-sum-exp
   (taken here unless `given`), and with `out` its fields, top keys and column mass. */
static void one_row(const float *logit, Py_ssize_t lo, Py_ssize_t hi, Py_ssize_t i, float *lse, int given, int has_sink,
                    float sink, float *e, float *out, int32_t *top, double *column, int64_t earlier, const int32_t *f) {
    float m = -INFINITY;
    if (!given) {
        m = row_max(logit + lo, hi - lo + 1);
        const float s = exp_sum(logit + lo, m, e + lo, hi - lo + 1);
        double total = m + log(s);
        if (has_sink) total = total > sink ? total + log1p(exp(sink - total)) : sink + log1p(exp(total - sink));
        *lse = (float)total;
    }
    if (!out) return;
    const float l = *lse;
    /* the weights: exp(logit - lse), floored, under SUBNORMAL 0; from e where the maximum was taken here */
    const Py_ssize_t n = hi - lo + 1;
    if (given) exp_sum(logit + lo, l, e + lo, n);
    scale_by(e + lo, given ? 1.0f : expf(m - l), n);
    float sum;
    const float entropy = entropy_of(e + lo, logit + lo, l, n, &sum);
    memset(out, 0, f[F_COUNT] * sizeof(float));
    for (Py_ssize_t p = 0; p < f[F_POSITIONS]; p++) out[f[F_FIRST] + p] = (p >= lo && p <= hi) ? e[p] : 0.0f;
    out[f[F_ENTROPY]] = (float)entropy;
    out[f[F_SINK]] = (float)(1.0 - sum);
    /* distance bins: d = 0, then 2^(b-1) <= d < 2^b, the last bin the rest */
    for (Py_ssize_t b = 0; b < f[F_BINS]; b++) {
        Py_ssize_t near = b == 0 ? 0 : ((Py_ssize_t)1 << (b - 1)), far = b == f[F_BINS] - 1 ? i + 1 : ((Py_ssize_t)1 << b);
        Py_ssize_t first = i - far + 1, last = i - near; /* keys at distance near .. far - 1 */
        first = first < lo ? lo : first;
        last = last > hi ? hi : last;
        out[f[F_DISTANCE] + b] = last >= first ? sum_of(e + first, last - first + 1) : 0.0f;
    }
    /* top keys: ascending keys, a later key enters only above a smaller weight: equal weights keep the earlier. Only
       spans whose maximum is at least the k-th largest span maximum T can hold a top key (k spans hold a weight >= T,
       so every top weight is >= T), and they are scanned in key order: the same keys as a scan of the whole row. */
    float value[64];
    int32_t key[64];
    const int k_top = f[F_TOP_K];
    for (int t = 0; t < k_top; t++) value[t] = 0.0f, key[t] = -1;
    const Py_ssize_t n_spans = (n + SPAN - 1) / SPAN;
    float *peak = e + hi + 1; /* the scratch past the row: the caller gives keys + keys / SPAN + 1 floats */
    span_maxima(e + lo, n, peak);
    float t_low = 0.0f; /* the k-th largest span maximum (0 with fewer than k spans) */
    if (n_spans >= k_top) {
        float best[64];
        for (int t = 0; t < k_top; t++) best[t] = -1.0f;
        for (Py_ssize_t sp = 0; sp < n_spans; sp++) {
            float v = peak[sp];
            if (v <= best[k_top - 1]) continue;
            int t = k_top - 1;
            while (t > 0 && best[t - 1] < v) best[t] = best[t - 1], t--;
            best[t] = v;
        }
        t_low = best[k_top - 1];
    }
    for (Py_ssize_t sp = 0; sp < n_spans; sp++) {
        if (peak[sp] < t_low || peak[sp] <= value[k_top - 1]) continue;
        const Py_ssize_t j0 = lo + sp * SPAN, j1 = j0 + SPAN - 1 < hi ? j0 + SPAN - 1 : hi;
        for (Py_ssize_t jj = j0; jj <= j1; jj++) {
            float w = e[jj];
            if (w <= value[k_top - 1] || w < t_low) continue; /* under T: never a top key */
            int t = k_top - 1;
            while (t > 0 && value[t - 1] < w) value[t] = value[t - 1], key[t] = key[t - 1], t--;
            value[t] = w, key[t] = (int32_t)jj;
        }
    }
    for (int t = 0; t < k_top; t++) out[f[F_TOP] + t] = value[t], top[t] = key[t];
    if (earlier >= 0) {
        out[f[F_DUPLICATE]] = (earlier >= lo && earlier <= hi) ? e[earlier] : 0.0f;
        out[f[F_INDUCTION]] = (earlier + 1 >= lo && earlier + 1 <= hi) ? e[earlier + 1] : 0.0f;
    }
    for (Py_ssize_t p = 0; p < f[F_COUNT]; p++) out[p] = out[p] < 0 ? 0.0f : out[p];
    if (column) add_to(column + lo, e + lo, n);
}

/* block(logits, lengths, r0, window, sinks, lse, given, [out, top, column, earlier, fields])

   logits (batch, head, rows, keys) float32: rows r0 .. r0 + rows - 1's q.k scale, keys 0 .. keys - 1 (keys >= the last
   row + 1); lengths (batch,) int64; window 0 for none; sinks (head,) float32 learned sink logits, or empty; lse
   (batch, head, rows) float32: written (given 0) or read (given 1). With `out` (batch, head, rows, n_fields) float32,
   `top` (batch, head, rows, top_k) int32, `column` (batch, head, keys) float64 (added to: real rows only), `earlier`
   (batch, n) int64 (each position's earlier occurrence, -1 none; n >= r0 + rows) and `fields` int32 offsets (F_N of
   them), the row statistics too. The GIL is released while it runs. */
static PyObject *block(PyObject *self, PyObject *args) {
    Py_buffer logits, lengths, sinks, lse, out = {0}, top = {0}, column = {0}, earlier = {0}, fields = {0};
    Py_ssize_t batch, heads, rows, keys, r0, window, n_earlier = 0;
    int given;
    if (!PyArg_ParseTuple(args, "y*nnnny*nny*w*p|w*w*w*y*y*n", &logits, &batch, &heads, &rows, &keys, &lengths, &r0, &window,
                          &sinks, &lse, &given, &out, &top, &column, &earlier, &fields, &n_earlier))
        return NULL;
    PyObject *result = NULL;
    int stats = out.buf != NULL;
    const int32_t *f = stats ? fields.buf : NULL;
    float *scratch = NULL;
    if (!check(&logits, batch * heads * rows * keys, 4, "logits") || !check(&lengths, batch, 8, "lengths") ||
        !check(&lse, batch * heads * rows, 4, "lse") || (sinks.len != 0 && !check(&sinks, heads, 4, "sinks")))
        goto done;
    if (r0 < 0 || r0 + rows > keys) {
        PyErr_Format(PyExc_ValueError, "block: rows %zd .. %zd need keys up to the last row, given %zd", r0, r0 + rows - 1, keys);
        goto done;
    }
    if (stats) {
        if (!check(&fields, F_N, 4, "fields") || !check(&out, batch * heads * rows * f[F_COUNT], 4, "out") ||
            !check(&top, batch * heads * rows * f[F_TOP_K], 4, "top") || !check(&column, batch * heads * keys, 8, "column") ||
            !check(&earlier, batch * n_earlier, 8, "earlier"))
            goto done;
        if (f[F_TOP_K] > 64 || n_earlier < r0 + rows) {
            PyErr_SetString(PyExc_ValueError, "block: top_k over 64 or earlier positions short of the rows");
            goto done;
        }
    }
    scratch = PyMem_RawMalloc((size_t)(keys + keys / SPAN + 1) * sizeof(float)); /* a row's weights, then its spans' maxima */
    if (!scratch) {
        PyErr_NoMemory();
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS;
    const int64_t *length = lengths.buf;
    for (Py_ssize_t b = 0; b < batch; b++)
        for (Py_ssize_t h = 0; h < heads; h++)
            for (Py_ssize_t rr = 0; rr < rows; rr++) {
                Py_ssize_t i = r0 + rr, n = length[b] < keys ? length[b] : keys;
                Py_ssize_t hi = i < n - 1 ? i : n - 1, lo = window > 0 && i - window + 1 > 0 ? i - window + 1 : 0;
                Py_ssize_t at = (b * heads + h) * rows + rr;
                float *row_lse = (float *)lse.buf + at;
                if (hi < lo) { /* a row that sees no key (a padding row past a window): nothing to reduce */
                    if (!given) *row_lse = -INFINITY;
                    if (stats) {
                        memset((float *)out.buf + at * f[F_COUNT], 0, f[F_COUNT] * sizeof(float));
                        for (int t = 0; t < f[F_TOP_K]; t++) ((int32_t *)top.buf)[at * f[F_TOP_K] + t] = -1;
                    }
                    continue;
                }
                one_row((const float *)logits.buf + at * keys, lo, hi, i, row_lse, given, sinks.len != 0,
                        sinks.len ? ((const float *)sinks.buf)[h] : 0.0f, scratch, stats ? (float *)out.buf + at * f[F_COUNT] : NULL,
                        stats ? (int32_t *)top.buf + at * f[F_TOP_K] : NULL,
                        stats && i < length[b] ? (double *)column.buf + (b * heads + h) * keys : NULL,
                        stats ? ((const int64_t *)earlier.buf)[b * n_earlier + i] : -1, f);
            }
    Py_END_ALLOW_THREADS;
    result = Py_None;
    Py_INCREF(result);
done:
    PyMem_RawFree(scratch);
    PyBuffer_Release(&logits);
    PyBuffer_Release(&lengths);
    PyBuffer_Release(&sinks);
    PyBuffer_Release(&lse);
    if (out.buf) PyBuffer_Release(&out);
    if (top.buf) PyBuffer_Release(&top);
    if (column.buf) PyBuffer_Release(&column);
    if (earlier.buf) PyBuffer_Release(&earlier);
    if (fields.buf) PyBuffer_Release(&fields);
    return result;
}

static PyMethodDef methods[] = {
    {"block", block, METH_VARARGS, "Reduce one block of a causal layer's rows from its logits (ingest/_rows.c)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "attnstore.ingest._rows",
                                    "One block of a causal layer's rows reduced from its logits (ingest/_rows.c).", -1, methods};

PyMODINIT_FUNC PyInit__rows(void) {
    PyObject *mod = PyModule_Create(&module);
    if (mod && PyModule_AddIntConstant(mod, "KERNEL_VERSION", KERNEL_VERSION) < 0) Py_CLEAR(mod);
    return mod;
}
