/* Each layer's maps averaged over its heads, for attention rollout (queries/rollout.py `residual_maps`).

   numpy cast float16 maps to float32 by table into a kept buffer, a few layers at a time, and averaged them in
   float64 (~2 ns a cell with the rest of the reduce); here each cell is read once, added in float64 head after head
   (numpy's order for a mean over the head axis) and the sum divided by the head count, without the GIL. Every float16
   in [0, 1] is a multiple of 2^-24, so these sums are exact and the means equal numpy's bit for bit. Built with the
   package like queries/_clark.c. */
#include "_kernels.h"

#define KERNEL_VERSION 1

/* The cells of one layer's heads, head after head, into `sum` (T x T doubles, zeroed by the caller). */
#define ADD_HEADS(ROW_T, VALUE)                                                                                       \
    do {                                                                                                              \
        for (Py_ssize_t h = 0; h < n_heads; h++) {                                                                    \
            const ROW_T *r = layer + h * T * T;                                                                       \
            for (Py_ssize_t c = 0; c < T * T; c++) sum[c] += VALUE(c);                                                \
        }                                                                                                             \
    } while (0)

#define F "_rollout.head_means"
/* head_means(maps, n_layers, n_heads, T, table, out, float16): maps are n_layers x n_heads contiguous T x T maps,
   float16 codes (uint16) looked up in `table` (65,536 float32 values) when `float16`, else float64; out: n_layers x
   T x T doubles, each layer's mean over its heads. */
static PyObject *head_means(PyObject *self, PyObject *args) {
    Py_buffer maps, table, out_buf;
    Py_ssize_t n_layers, n_heads, T;
    int float16;
    if (!PyArg_ParseTuple(args, "y*nnny*w*p", &maps, &n_layers, &n_heads, &T, &table, &out_buf, &float16)) return NULL;
    PyObject *result = NULL;
    if (n_layers < 0 || n_heads < 1 || T < 0) {
        PyErr_SetString(PyExc_ValueError, F ": negative layers or length, or no head");
        goto done;
    }
    if (!check_size(&maps, n_layers * n_heads * T * T, float16 ? 2 : 8, F, "maps")
        || (float16 && !check_size(&table, 65536, 4, F, "table")) || !check_size(&out_buf, n_layers * T * T, 8, F, "out"))
        goto done;
    double *out = out_buf.buf;
    Py_BEGIN_ALLOW_THREADS;
    for (Py_ssize_t l = 0; l < n_layers; l++) {
        double *sum = out + l * T * T;
        for (Py_ssize_t c = 0; c < T * T; c++) sum[c] = 0;
        if (float16) {
            const float *tab = table.buf;
            const uint16_t *layer = (const uint16_t *)maps.buf + l * n_heads * T * T;
            ADD_HEADS(uint16_t, VALUE_BY_TABLE);
        } else {
            const double *layer = (const double *)maps.buf + l * n_heads * T * T;
            ADD_HEADS(double, VALUE_AS_IS);
        }
        for (Py_ssize_t c = 0; c < T * T; c++) sum[c] /= (double)n_heads;
    }
    Py_END_ALLOW_THREADS;
    result = Py_None;
    Py_INCREF(result);
done:
    PyBuffer_Release(&maps);
    PyBuffer_Release(&table);
    PyBuffer_Release(&out_buf);
    return result;
}

static PyMethodDef methods[] = {
    {"head_means", head_means, METH_VARARGS, "Each layer's maps averaged over its heads (queries/rollout.py)."},
    {NULL, NULL, 0, NULL},
};

KERNEL_MODULE(_rollout, "Head means for attention rollout, compiled.", methods)
