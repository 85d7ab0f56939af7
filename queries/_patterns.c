/* Kovaleva et al.'s raw pattern scores in one pass over each map (queries/patterns.py `_raw_scores`).

   numpy cast each example's maps to float64 (8 bytes a cell) and made three more float64 temporaries (the maps at
   plain keys, their product with the own-segment mask, its row sums): 7-11 ns a cell on one thread, holding the GIL
   between its calls. This reads each cell once, as float64 from float16 by table (store/float16.py: exact) or from a
   float64 map, and runs without the GIL (`python benchmarks/reduce.py --home H --run MRPC-dev --kinds
   pattern_scores`: 8.20-8.92 -> 1.57-1.60 ns a cell; docs/PERFORMANCE.md, 2026-11-28 "the heaviest reduces
   compiled"). Built with the package like queries/_clark.c. */
#include "_kernels.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define KERNEL_VERSION 1 /* checked against queries/engine/kernels.py VERSIONS: a stale build fails in one line */

enum { VERTICAL, DIAGONAL, SELF, BLOCK, STRIPE, N_SCORES };

/* One T x T map; VALUE(k) reads cell k of row `r`. Two partial sums of each row's totals halve the chains of dependent
   additions; their order is fixed, so a result never depends on the thread or the machine. `plain` is 1.0 at keys that are not special tokens, `segment` each
   token's segment. The block score (own-segment share of a plain query's attention to plain keys, averaged over plain
   queries) is left to the caller (NaN) when `block` is 0: fewer than two segments among the plain tokens. */
#define MAP_SCORES(ROW_T, VALUE)                                                                                      \
    do {                                                                                                              \
        double vertical = 0, neighbours = 0, self_ = 0, block_sum = 0;                                                \
        memset(columns, 0, (size_t)T * sizeof(double));                                                               \
        for (Py_ssize_t q = 0; q < T; q++) {                                                                          \
            const ROW_T *r = head + q * T;                                                                            \
            const int64_t own = segment[q];                                                                           \
            double to_special = 0, plain0 = 0, plain1 = 0, own0 = 0, own1 = 0;                                      \
            Py_ssize_t k = 0;                                                                                         \
            for (; k + 2 <= T; k += 2) {                                                                              \
                double v0 = VALUE(k), v1 = VALUE(k + 1);                                                              \
                columns[k] += v0;                                                                                     \
                columns[k + 1] += v1;                                                                                 \
                double p0 = v0 * plain[k], p1 = v1 * plain[k + 1];                                                    \
                plain0 += p0;                                                                                         \
                plain1 += p1;                                                                                         \
                own0 += segment[k] == own ? p0 : 0.0;                                                                 \
                own1 += segment[k + 1] == own ? p1 : 0.0;                                                             \
            }                                                                                                         \
            if (k < T) {                                                                                              \
                double v0 = VALUE(k);                                                                                 \
                columns[k] += v0;                                                                                     \
                double p0 = v0 * plain[k];                                                                            \
                plain0 += p0;                                                                                         \
                own0 += segment[k] == own ? p0 : 0.0;                                                                 \
            }                                                                                                         \
            for (Py_ssize_t s = 0; s < n_special; s++) to_special += VALUE(specials[s]);                              \
            double to_plain = plain0 + plain1, to_own = own0 + own1;                                                  \
            vertical += to_special;                                                                                   \
            if (q > 0) neighbours += VALUE(q - 1);                                                                    \
            if (q + 1 < T) neighbours += VALUE(q + 1);                                                                \
            self_ += VALUE(q);                                                                                        \
            if (block && plain[q] != 0.0) block_sum += to_plain > 0 ? to_own / to_plain : 0.0;                        \
        }                                                                                                             \
        double stripe = 0;                                                                                            \
        int any_plain = 0;                                                                                            \
        for (Py_ssize_t k = 0; k < T; k++)                                                                            \
            if (plain[k] != 0.0 && (!any_plain || columns[k] / T > stripe)) {                                         \
                stripe = columns[k] / T;                                                                              \
                any_plain = 1;                                                                                        \
            }                                                                                                         \
        out[VERTICAL * n_maps + m] = vertical / T;                                                                    \
        out[DIAGONAL * n_maps + m] = neighbours / T;                                                                  \
        out[SELF * n_maps + m] = self_ / T;                                                                           \
        out[BLOCK * n_maps + m] = block ? block_sum / n_plain : NAN;                                                  \
        out[STRIPE * n_maps + m] = stripe;                                                                            \
    } while (0)

/* raw_scores(maps, n_maps, T, plain, segment, table, out, float16, block): maps are n_maps contiguous T x T maps,
   float16 codes (uint16) looked up in `table` (65,536 float32 values) when `float16`, else float64; plain: T doubles
   (1.0 or 0.0); segment: T int64; out: N_SCORES x n_maps doubles in the order of queries/patterns.py RAW_SCORES. */
#define F "_patterns.raw_scores"
static PyObject *raw_scores(PyObject *self, PyObject *args) {
    Py_buffer maps, plain_buf, segment_buf, table, out_buf;
    Py_ssize_t n_maps, T;
    int float16, block;
    if (!PyArg_ParseTuple(args, "y*nny*y*y*w*pp", &maps, &n_maps, &T, &plain_buf, &segment_buf, &table, &out_buf,
                          &float16, &block))
        return NULL;
    PyObject *result = NULL;
    double *columns = NULL;
    Py_ssize_t *specials = NULL; /* the special keys: a row's attention to them is summed over these alone */
    if (n_maps < 0 || T < 1) {
        PyErr_SetString(PyExc_ValueError, "_patterns.raw_scores: negative n_maps, or maps of no token");
        goto done;
    }
    if (!check_size(&maps, n_maps * T * T, float16 ? 2 : 8, F, "maps") || !check_size(&plain_buf, T, 8, F, "plain")
        || !check_size(&segment_buf, T, 8, F, "segment") || (float16 && !check_size(&table, 65536, 4, F, "table"))
        || !check_size(&out_buf, N_SCORES * n_maps, 8, F, "out"))
        goto done;
    columns = malloc((size_t)T * sizeof(double));
    if (!columns) {
        PyErr_NoMemory();
        goto done;
    }
    const double *plain = plain_buf.buf;
    const int64_t *segment = segment_buf.buf;
    double *out = out_buf.buf;
    Py_ssize_t n_plain = 0, n_special = 0;
    specials = malloc((size_t)T * sizeof(Py_ssize_t));
    if (!specials) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t k = 0; k < T; k++) {
        if (plain[k] != 0.0)
            n_plain++;
        else
            specials[n_special++] = k;
    }
    Py_BEGIN_ALLOW_THREADS;
    FOR_EACH_MAP(MAP_SCORES);
    Py_END_ALLOW_THREADS;
    result = Py_None;
    Py_INCREF(result);
done:
    free(columns);
    free(specials);
    PyBuffer_Release(&maps);
    PyBuffer_Release(&plain_buf);
    PyBuffer_Release(&segment_buf);
    PyBuffer_Release(&table);
    PyBuffer_Release(&out_buf);
    return result;
}

static PyMethodDef methods[] = {
    {"raw_scores", raw_scores, METH_VARARGS, "Raw pattern scores of maps (queries/patterns.py _raw_scores)."},
    {NULL, NULL, 0, NULL},
};

KERNEL_PART(_patterns, "Kovaleva et al.'s raw pattern scores, compiled.", methods)
