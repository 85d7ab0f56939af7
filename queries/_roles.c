/* Voita et al.'s head roles from each row's argmax (queries/head_roles.py `_reduce`).

   numpy took each row's maximum outside the separators and its argmax (float16 maps compared as their bits since
   07bca0d, 2026-11-28), then counted the argmaxes' offsets and their hits on the rarest token in five more passes over
   the (layer, head, query) argmaxes: ~2.1 ns a cell (`python benchmarks/reduce.py --home H --run MRPC-dev --kinds
   head_roles`; docs/PERFORMANCE.md, 2026-11-28 "the heaviest reduces compiled"). Here each cell is read once, as
   float64 from float16 by table or from a float64 map, without the GIL. The rules are numpy's on float64 values: the
   first of equal maxima; a NaN is the argmax where it is the first (numpy's argmax), and makes the row's maximum NaN.
   Built with the package like queries/_clark.c. */
#include "_kernels.h"

#define KERNEL_VERSION 1

/* One T x T map: `confidence` (the rows' maxima outside the separators, summed), `counts` (rows whose argmax lies
   `offsets[j]` keys from the query, per j) and `rare_hits` (rows whose argmax is the key `rare`). */
#define ROLES(ROW_T, VALUE)                                                                                           \
    do {                                                                                                              \
        double confidence = 0;                                                                                        \
        int64_t hits = 0;                                                                                             \
        int64_t *counts = out_counts + m * n_offsets;                                                                 \
        for (Py_ssize_t j = 0; j < n_offsets; j++) counts[j] = 0;                                                     \
        for (Py_ssize_t q = 0; q < T; q++) {                                                                          \
            const ROW_T *r = head + q * T;                                                                            \
            Py_ssize_t best = 0;                                                                                      \
            double top = VALUE(0), outside = 0;                                                                       \
            int any_outside = 0, nan = top != top;                                                                    \
            for (Py_ssize_t k = 0; k < T; k++) {                                                                      \
                double x = VALUE(k);                                                                                  \
                if (!nan && (x > top || x != x)) {                                                                    \
                    best = k;                                                                                         \
                    top = x;                                                                                          \
                    nan = x != x;                                                                                     \
                }                                                                                                     \
                if (kept[k] && (!any_outside || x > outside || x != x)) {                                             \
                    outside = (any_outside && outside != outside) ? outside : x;                                      \
                    any_outside = 1;                                                                                  \
                }                                                                                                     \
            }                                                                                                         \
            confidence += outside;                                                                                    \
            for (Py_ssize_t j = 0; j < n_offsets; j++) counts[j] += (best - q) == offsets[j];                          \
            hits += best == rare;                                                                                     \
        }                                                                                                             \
        out_confidence[m] = confidence;                                                                               \
        out_rare[m] = hits;                                                                                           \
    } while (0)

#define F "_roles.roles"
/* roles(maps, n_maps, T, kept, offsets, rare, table, confidence, counts, rare_hits, float16): maps are n_maps contiguous
   T x T maps (float16 codes looked up in `table` when `float16`, else float64); kept: T bytes, 1 for a key that is not
   a separator; offsets: K int64; rare: a key (-1: none); out: confidence n_maps doubles, counts n_maps x K int64,
   rare_hits n_maps int64. */
static PyObject *roles(PyObject *self, PyObject *args) {
    Py_buffer maps, kept_buf, offsets_buf, table, conf_buf, counts_buf, rare_buf;
    Py_ssize_t n_maps, T, rare;
    int float16;
    if (!PyArg_ParseTuple(args, "y*nny*y*ny*w*w*w*p", &maps, &n_maps, &T, &kept_buf, &offsets_buf, &rare, &table,
                          &conf_buf, &counts_buf, &rare_buf, &float16))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t n_offsets = offsets_buf.len / 8;
    if (n_maps < 0 || T < 1) {
        PyErr_SetString(PyExc_ValueError, F ": negative n_maps, or maps of no token");
        goto done;
    }
    if (!check_size(&maps, n_maps * T * T, float16 ? 2 : 8, F, "maps") || !check_size(&kept_buf, T, 1, F, "kept")
        || !check_size(&offsets_buf, n_offsets, 8, F, "offsets") || (float16 && !check_size(&table, 65536, 4, F, "table"))
        || !check_size(&conf_buf, n_maps, 8, F, "confidence") || !check_size(&counts_buf, n_maps * n_offsets, 8, F, "counts")
        || !check_size(&rare_buf, n_maps, 8, F, "rare_hits"))
        goto done;
    const uint8_t *kept = kept_buf.buf;
    const int64_t *offsets = offsets_buf.buf;
    double *out_confidence = conf_buf.buf;
    int64_t *out_counts = counts_buf.buf, *out_rare = rare_buf.buf;
    Py_BEGIN_ALLOW_THREADS;
    FOR_EACH_MAP(ROLES);
    Py_END_ALLOW_THREADS;
    result = Py_None;
    Py_INCREF(result);
done:
    PyBuffer_Release(&maps);
    PyBuffer_Release(&kept_buf);
    PyBuffer_Release(&offsets_buf);
    PyBuffer_Release(&table);
    PyBuffer_Release(&conf_buf);
    PyBuffer_Release(&counts_buf);
    PyBuffer_Release(&rare_buf);
    return result;
}

static PyMethodDef methods[] = {
    {"roles", roles, METH_VARARGS, "Each map's confidence, argmax offsets and rare-token hits (queries/head_roles.py)."},
    {NULL, NULL, 0, NULL},
};

KERNEL_MODULE(_roles, "Voita et al.'s head roles, compiled.", methods)
