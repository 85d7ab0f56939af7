/* The Clark summary's reduce in one pass over an example's maps (queries/clark.py `example_sums`).

   numpy needed five passes over each map and two table lookups a cell (the float32 value, p log p), ~3.4 ns a cell on
   one thread, and held the GIL between its calls; this reads each cell once, looks both numbers up in one interleaved
   table (store/float16.py's two tables, 8 bytes a float16 value) and runs without the GIL, so the reduce threads share
   the cores (`python benchmarks/reduce.py --home H --run MRPC-dev --kinds clark`: 3.26-3.55 -> 0.80-0.86 ns a cell;
   docs/PERFORMANCE.md, 2026-11-28 "the heaviest reduces compiled"). Every sum is accumulated in double from the exact
   float32 values.

   Built by setuptools with the package, a part of the extension module attnstore.queries._kernels (pyproject.toml's
   ext-modules, queries/_kernels.c); it needs a C compiler and Python's headers. It takes buffers, not numpy arrays, so
   it builds without numpy's headers. */
#include "_kernels.h"
#include <stdlib.h>
#include <string.h>

/* Raised whenever the arguments or the fields change, checked against queries/engine/kernels.py VERSIONS, so an editable
   install with a stale build fails in one line instead of computing the old thing. */
#define KERNEL_VERSION 1

enum { TO_PREVIOUS, TO_SELF, TO_NEXT, RECEIVED_CLS, RECEIVED_SEP, RECEIVED_PUNCT, RECEIVED_OTHER, SEP_FROM_SEP,
       SEP_FROM_OTHER, ENTROPY, ENTROPY_FROM_CLS, N_FIELDS };
enum { KEY_CLS = 1, KEY_SEP = 2, KEY_PUNCT = 4 };

typedef struct {
    float value; /* the float16's float32 value */
    float plogp; /* p log p, as store/float16.py computes it */
} entry;

/* One (layer, head) map of T x T cells; VALUE(k) and PLOGP(k) read cell k of the current row `r`. Four partial sums
   of a row's entropy break the chain of dependent additions (one sum: ~1.3 ns a cell); their order is fixed, so a
   result never depends on the thread or the machine. */
#define HEAD_SUMS(ROW_T, VALUE, PLOGP)                                                                                \
    do {                                                                                                              \
        double sums[N_FIELDS] = {0};                                                                                  \
        memset(received, 0, (size_t)T * sizeof(double));                                                              \
        for (Py_ssize_t q = 0; q < T; q++) {                                                                          \
            const ROW_T *r = head + q * T;                                                                            \
            const float *pr = plogps ? plogps + (head - first) + q * T : NULL;                                        \
            (void)pr; /* read by PLOGP for float32 maps only */                                                      \
            double h0 = 0, h1 = 0, h2 = 0, h3 = 0;                                                                    \
            Py_ssize_t k = 0;                                                                                         \
            for (; k + 4 <= T; k += 4) {                                                                              \
                h0 += PLOGP(k); received[k] += VALUE(k);                                                              \
                h1 += PLOGP(k + 1); received[k + 1] += VALUE(k + 1);                                                  \
                h2 += PLOGP(k + 2); received[k + 2] += VALUE(k + 2);                                                  \
                h3 += PLOGP(k + 3); received[k + 3] += VALUE(k + 3);                                                  \
            }                                                                                                         \
            for (; k < T; k++) { h0 += PLOGP(k); received[k] += VALUE(k); }                                           \
            double h = -((h0 + h1) + (h2 + h3));                                                                      \
            double to_sep = 0;                                                                                        \
            for (Py_ssize_t s = 0; s < n_sep; s++) to_sep += VALUE(seps[s]);                                          \
            if (q > 0) sums[TO_PREVIOUS] += VALUE(q - 1);                                                             \
            sums[TO_SELF] += VALUE(q);                                                                                \
            if (q + 1 < T) sums[TO_NEXT] += VALUE(q + 1);                                                             \
            sums[ENTROPY] += h;                                                                                       \
            if (cls[q] & KEY_CLS) sums[ENTROPY_FROM_CLS] += h;                                                        \
            sums[(cls[q] & KEY_SEP) ? SEP_FROM_SEP : SEP_FROM_OTHER] += to_sep;                                       \
        }                                                                                                             \
        for (Py_ssize_t k = 0; k < T; k++) {                                                                          \
            if (cls[k] & KEY_CLS) sums[RECEIVED_CLS] += received[k];                                                  \
            if (cls[k] & KEY_SEP) sums[RECEIVED_SEP] += received[k];                                                  \
            if (cls[k] & KEY_PUNCT) sums[RECEIVED_PUNCT] += received[k];                                              \
            if (!cls[k]) sums[RECEIVED_OTHER] += received[k];                                                         \
        }                                                                                                             \
        for (int f = 0; f < N_FIELDS; f++) out[f * n_maps + m] = sums[f];                                             \
    } while (0)

/* sums(maps, n_maps, T, keys, table_or_plogps, out, float16): maps are n_maps contiguous T x T maps, float16 codes
   (uint16) looked up in `table` (65,536 interleaved (value, p log p) float32 pairs) when `float16`, else float32 values
   with their p log p in `plogps` (float32, of the maps' shape); keys: T bytes of KEY_* bits; out: N_FIELDS x n_maps
   doubles, written field by field in the order of queries/clark.py CLARK_FIELDS. */
#define F "_clark.sums"
static PyObject *sums(PyObject *self, PyObject *args) {
    Py_buffer maps, keys, table, out_buf;
    Py_ssize_t n_maps, T;
    int float16;
    if (!PyArg_ParseTuple(args, "y*nny*y*w*p", &maps, &n_maps, &T, &keys, &table, &out_buf, &float16)) return NULL;
    PyObject *result = NULL;
    double *received = NULL;
    Py_ssize_t *seps = NULL;
    Py_ssize_t cells = n_maps * T * T;
    if (n_maps < 0 || T < 0) {
        PyErr_SetString(PyExc_ValueError, F ": negative n_maps or length");
        goto done;
    }
    if (!check_size(&maps, cells, float16 ? 2 : 4, F, "maps") || !check_size(&keys, T, 1, F, "keys")
        || !check_size(&table, float16 ? 65536 * 2 : cells, 4, F, "table") || !check_size(&out_buf, N_FIELDS * n_maps, 8, F, "out"))
        goto done;
    received = malloc((size_t)(T ? T : 1) * sizeof(double));
    seps = malloc((size_t)(T ? T : 1) * sizeof(Py_ssize_t));
    if (!received || !seps) {
        PyErr_NoMemory();
        goto done;
    }
    const uint8_t *cls = keys.buf;
    Py_ssize_t n_sep = 0;
    for (Py_ssize_t k = 0; k < T; k++)
        if (cls[k] & KEY_SEP) seps[n_sep++] = k;
    double *out = out_buf.buf;
    Py_BEGIN_ALLOW_THREADS;
    if (float16) {
        const entry *tab = table.buf;
        const uint16_t *first = maps.buf;
        const float *plogps = NULL; /* HEAD_SUMS reads p log p from the table */
        for (Py_ssize_t m = 0; m < n_maps; m++) {
            const uint16_t *head = first + m * T * T;
#define V16(k) ((double)tab[r[k]].value)
#define P16(k) ((double)tab[r[k]].plogp)
            HEAD_SUMS(uint16_t, V16, P16);
        }
    } else {
        const float *first = maps.buf;
        const float *plogps = table.buf;
        for (Py_ssize_t m = 0; m < n_maps; m++) {
            const float *head = first + m * T * T;
#define V32(k) ((double)r[k])
#define P32(k) ((double)pr[k])
            HEAD_SUMS(float, V32, P32);
        }
    }
    Py_END_ALLOW_THREADS;
    result = Py_None;
    Py_INCREF(result);
done:
    free(received);
    free(seps);
    PyBuffer_Release(&maps);
    PyBuffer_Release(&keys);
    PyBuffer_Release(&table);
    PyBuffer_Release(&out_buf);
    return result;
}

static PyMethodDef methods[] = {
    {"sums", sums, METH_VARARGS, "An example's Clark sums (queries/clark.py example_sums)."},
    {NULL, NULL, 0, NULL},
};

KERNEL_PART(_clark, "The Clark summary's reduce, compiled.", methods)
