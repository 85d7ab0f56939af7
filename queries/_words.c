/* Word-level maps and their unique argmaxes (queries/word_level.py `word_level`, queries/common.py `unique_argmax`).

   numpy made the word-level maps with two float32 matrix products per example (the rows of a word averaged, the
   columns of a word summed) after a float32 cast, and each argmax that must be unique with three more passes
   (argmax, the maximum taken back, a count of the cells equal to it), the transposed one over a strided view: with
   units_of, ~10 ns a cell for the dependency kind on one thread. Here each cell is read once and added into its
   (row word, column word) sum in double, then divided by the row word's token count and rounded to float32 (the word
   maps' dtype), and the argmaxes are one pass each; the GIL is released (`python benchmarks/reduce.py --home H
   --run MRPC-dev --kinds word_argmax`: 11.15-11.49 -> 5.02-5.07 ns a cell; docs/PERFORMANCE.md, 2026-11-28 "the
   heaviest reduces compiled"). Built with the package like queries/_clark.c. */
#include "_kernels.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define KERNEL_VERSION 1 /* checked against queries/engine/kernels.py VERSIONS: a stale build fails in one line */

/* One T x T map into its U x U word map. Keys come in runs of consecutive tokens of one unit (a word's pieces), so
   each run's cells are summed first and added to their unit once. */
#define WORD_MAP(ROW_T, VALUE)                                                                                        \
    do {                                                                                                              \
        memset(sums, 0, (size_t)(U * U) * sizeof(double));                                                           \
        for (Py_ssize_t q = 0; q < T; q++) {                                                                          \
            const ROW_T *r = head + q * T;                                                                            \
            double *row = sums + unit[q] * U;                                                                         \
            for (Py_ssize_t g = 0; g < n_runs; g++) {                                                                 \
                double s = 0;                                                                                         \
                for (Py_ssize_t k = run_start[g]; k < run_start[g + 1]; k++) s += VALUE(k);                           \
                row[run_unit[g]] += s;                                                                                \
            }                                                                                                         \
        }                                                                                                             \
        float *o = out + m * K * K;                                                                                   \
        for (Py_ssize_t i = 0; i < K; i++)                                                                            \
            for (Py_ssize_t j = 0; j < K; j++) o[i * K + j] = (float)(sums[keep[i] * U + keep[j]] / size[keep[i]]);  \
    } while (0)

/* word_maps(maps, n_maps, T, unit, U, keep, table, out, float16): maps are n_maps contiguous T x T maps, float16 codes
   (uint16) looked up in `table` (65,536 float32 values) when `float16`, else float64; unit: each token's unit (T
   int64 in [0, U), every unit with a token); keep: the K units (int64) whose rows and columns are written, in that
   order (a query's words without the special tokens: no copy of the whole word map to cut); out: n_maps x K x K
   float32. */
static PyObject *word_maps(PyObject *self, PyObject *args) {
    Py_buffer maps, unit_buf, keep_buf, table, out_buf;
    Py_ssize_t n_maps, T, U;
    int float16;
    if (!PyArg_ParseTuple(args, "y*nny*ny*y*w*p", &maps, &n_maps, &T, &unit_buf, &U, &keep_buf, &table, &out_buf, &float16))
        return NULL;
    Py_ssize_t K = keep_buf.len / 8;
    PyObject *result = NULL;
    double *sums = NULL, *size = NULL;
    Py_ssize_t *run_start = NULL, *run_unit = NULL;
    if (n_maps < 0 || T < 0 || U < 0) {
        PyErr_SetString(PyExc_ValueError, "_words.word_maps: negative n_maps, length or units");
        goto done;
    }
    if (!check_size(&maps, n_maps * T * T, float16 ? 2 : 8, "_words.word_maps", "maps")
        || !check_size(&unit_buf, T, 8, "_words.word_maps", "unit") || (float16 && !check_size(&table, 65536, 4, "_words.word_maps", "table"))
        || !check_size(&keep_buf, K, 8, "_words.word_maps", "keep") || !check_size(&out_buf, n_maps * K * K, 4, "_words.word_maps", "out"))
        goto done;
    const int64_t *unit = unit_buf.buf, *keep = keep_buf.buf;
    for (Py_ssize_t i = 0; i < K; i++)
        if (keep[i] < 0 || keep[i] >= U) {
            PyErr_Format(PyExc_ValueError, "_words.word_maps: kept unit %lld is not in [0, %zd)", (long long)keep[i], U);
            goto done;
        }
    sums = malloc((size_t)(U * U + 1) * sizeof(double));
    size = calloc((size_t)U + 1, sizeof(double));
    run_start = malloc((size_t)(T + 1) * sizeof(Py_ssize_t));
    run_unit = malloc((size_t)(T + 1) * sizeof(Py_ssize_t));
    if (!sums || !size || !run_start || !run_unit) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t n_runs = 0;
    for (Py_ssize_t k = 0; k < T; k++) {
        if (unit[k] < 0 || unit[k] >= U) {
            PyErr_Format(PyExc_ValueError, "_words.word_maps: token %zd's unit %lld is not in [0, %zd)", k, (long long)unit[k], U);
            goto done;
        }
        size[unit[k]] += 1;
        if (k == 0 || unit[k] != unit[k - 1]) {
            run_start[n_runs] = k;
            run_unit[n_runs++] = unit[k];
        }
    }
    run_start[n_runs] = T;
    for (Py_ssize_t u = 0; u < U; u++)
        if (size[u] == 0) {
            PyErr_Format(PyExc_ValueError, "_words.word_maps: unit %zd has no token", u);
            goto done;
        }
    float *out = out_buf.buf;
    Py_BEGIN_ALLOW_THREADS;
    FOR_EACH_MAP(WORD_MAP);
    Py_END_ALLOW_THREADS;
    result = Py_None;
    Py_INCREF(result);
done:
    free(sums);
    free(size);
    free(run_start);
    free(run_unit);
    PyBuffer_Release(&maps);
    PyBuffer_Release(&unit_buf);
    PyBuffer_Release(&keep_buf);
    PyBuffer_Release(&table);
    PyBuffer_Release(&out_buf);
    return result;
}

/* Each row's unique argmax over its C values: the index of its largest value, or -1 where that value is not > 0, is
   reached more than once, or the row holds a NaN (numpy's argmax then names the NaN, which equals nothing: -1, as
   queries/common.py computed it). The maximum first, in four partial maxima (one would wait on each comparison), then
   the first index holding it and how many do. */
#define ROW_ARGMAX(T_)                                                                                                \
    static void rows_##T_(const T_ *s, Py_ssize_t R, Py_ssize_t C, int64_t *dest) {                                   \
        for (Py_ssize_t r = 0; r < R; r++, s += C) {                                                                  \
            T_ m0 = -INFINITY, m1 = -INFINITY, m2 = -INFINITY, m3 = -INFINITY;                                        \
            int nan = 0;                                                                                              \
            Py_ssize_t j = 0;                                                                                         \
            for (; j + 4 <= C; j += 4) {                                                                              \
                nan |= (s[j] != s[j]) | (s[j + 1] != s[j + 1]) | (s[j + 2] != s[j + 2]) | (s[j + 3] != s[j + 3]);     \
                m0 = s[j] > m0 ? s[j] : m0;                                                                           \
                m1 = s[j + 1] > m1 ? s[j + 1] : m1;                                                                   \
                m2 = s[j + 2] > m2 ? s[j + 2] : m2;                                                                   \
                m3 = s[j + 3] > m3 ? s[j + 3] : m3;                                                                   \
            }                                                                                                         \
            for (; j < C; j++) {                                                                                      \
                nan |= s[j] != s[j];                                                                                  \
                m0 = s[j] > m0 ? s[j] : m0;                                                                           \
            }                                                                                                         \
            T_ top = m0 > m1 ? m0 : m1, top2 = m2 > m3 ? m2 : m3;                                                     \
            top = top > top2 ? top : top2;                                                                            \
            Py_ssize_t best = -1, ties = 0;                                                                           \
            for (j = 0; j < C; j++)                                                                                   \
                if (s[j] == top && ties++ == 0) best = j;                                                             \
            dest[r] = (nan || ties != 1 || !(top > 0)) ? -1 : best;                                                   \
        }                                                                                                             \
    }

/* Each column's, the same rule over its R values: the rows are walked in order with every column's running maximum,
   its first row and its count side by side (contiguous, so each row is one pass over them). `top` / `best` / `ties`:
   C values of scratch each. */
#define COLUMN_ARGMAX(T_)                                                                                             \
    static void columns_##T_(const T_ *s, Py_ssize_t R, Py_ssize_t C, int64_t *dest, T_ *top, Py_ssize_t *best,       \
                             Py_ssize_t *ties) {                                                                      \
        for (Py_ssize_t c = 0; c < C; c++) {                                                                          \
            top[c] = -INFINITY;                                                                                       \
            best[c] = -1;                                                                                             \
            ties[c] = 0;                                                                                              \
        }                                                                                                             \
        for (Py_ssize_t r = 0; r < R; r++, s += C)                                                                    \
            for (Py_ssize_t c = 0; c < C; c++) {                                                                      \
                T_ x = s[c];                                                                                          \
                int above = x > top[c] || x != x; /* a NaN is kept as the maximum: it equals nothing after it */     \
                ties[c] = above ? 1 : ties[c] + (x == top[c]);                                                        \
                best[c] = above ? r : best[c];                                                                        \
                top[c] = above ? x : top[c];                                                                          \
            }                                                                                                         \
        for (Py_ssize_t c = 0; c < C; c++) dest[c] = (ties[c] != 1 || !(top[c] > 0)) ? -1 : best[c];                 \
    }

ROW_ARGMAX(float)
ROW_ARGMAX(double)
COLUMN_ARGMAX(float)
COLUMN_ARGMAX(double)

/* unique_argmax(scores, n, R, C, out, transpose, float32): scores are n contiguous R x C matrices (float32 or float64);
   out: n x R int64 (each row's argmax over its C columns) or, with `transpose`, n x C (each column's over its R rows). */
static PyObject *unique_argmax(PyObject *self, PyObject *args) {
    Py_buffer scores, out_buf;
    Py_ssize_t n, R, C;
    int transpose, float32;
    if (!PyArg_ParseTuple(args, "y*nnnw*pp", &scores, &n, &R, &C, &out_buf, &transpose, &float32)) return NULL;
    PyObject *result = NULL;
    double *top = NULL;
    Py_ssize_t *best = NULL, *ties = NULL;
    if (n < 0 || R < 0 || C < 0) {
        PyErr_SetString(PyExc_ValueError, "_words.unique_argmax: negative n, rows or columns");
        goto done;
    }
    if (!check_size(&scores, n * R * C, float32 ? 4 : 8, "_words.unique_argmax", "scores")
        || !check_size(&out_buf, n * (transpose ? C : R), 8, "_words.unique_argmax", "out"))
        goto done;
    top = malloc((size_t)(C + 1) * sizeof(double));
    best = malloc((size_t)(C + 1) * sizeof(Py_ssize_t));
    ties = malloc((size_t)(C + 1) * sizeof(Py_ssize_t));
    if (!top || !best || !ties) {
        PyErr_NoMemory();
        goto done;
    }
    int64_t *dest = out_buf.buf;
    Py_BEGIN_ALLOW_THREADS;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (float32) {
            const float *s = (const float *)scores.buf + i * R * C;
            if (transpose)
                columns_float(s, R, C, dest + i * C, (float *)top, best, ties);
            else
                rows_float(s, R, C, dest + i * R);
        } else {
            const double *s = (const double *)scores.buf + i * R * C;
            if (transpose)
                columns_double(s, R, C, dest + i * C, top, best, ties);
            else
                rows_double(s, R, C, dest + i * R);
        }
    }
    Py_END_ALLOW_THREADS;
    result = Py_None;
    Py_INCREF(result);
done:
    free(top);
    free(best);
    free(ties);
    PyBuffer_Release(&scores);
    PyBuffer_Release(&out_buf);
    return result;
}

static PyMethodDef methods[] = {
    {"word_maps", word_maps, METH_VARARGS, "Word-level maps (queries/word_level.py word_level)."},
    {"unique_argmax", unique_argmax, METH_VARARGS, "Unique argmaxes of rows or columns (queries/common.py unique_argmax)."},
    {NULL, NULL, 0, NULL},
};

KERNEL_PART(_words, "Word-level maps and their argmaxes, compiled.", methods)
