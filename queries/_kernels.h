/* What the compiled reduces (queries/_clark.c, _patterns.c, _words.c, _rollout.c, _roles.c) share: the size check of a
   buffer argument, the loop over an example's maps as float16 codes or float64 values, and the module's creation with
   its KERNEL_VERSION (checked against queries/engine/kernels.py VERSIONS). */
#ifndef ATTNSTORE_KERNELS_H
#define ATTNSTORE_KERNELS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* 1 when buffer `b` holds `items` items of `itemsize` bytes, else 0 with a ValueError naming `function` and `name`. */
static int check_size(Py_buffer *b, Py_ssize_t items, Py_ssize_t itemsize, const char *function, const char *name) {
    if (b->len != items * itemsize) {
        PyErr_Format(PyExc_ValueError, "%s: %s holds %zd bytes, not %zd", function, name, b->len, items * itemsize);
        return 0;
    }
    return 1;
}

/* BODY(ROW_T, VALUE) for each of `n_maps` T x T maps in `maps`, with `head` pointing at map `m`: float16 codes
   (uint16) looked up in `table` (65,536 float32 values) when `float16`, else float64 values. VALUE(k) reads cell k of
   the row `r` that BODY points at. */
#define VALUE_BY_TABLE(k) ((double)tab[r[k]])
#define VALUE_AS_IS(k) (r[k])
#define FOR_EACH_MAP(BODY)                                                                                            \
    do {                                                                                                              \
        if (float16) {                                                                                                \
            const float *tab = table.buf;                                                                             \
            for (Py_ssize_t m = 0; m < n_maps; m++) {                                                                 \
                const uint16_t *head = (const uint16_t *)maps.buf + m * T * T;                                        \
                BODY(uint16_t, VALUE_BY_TABLE);                                                                       \
            }                                                                                                         \
        } else {                                                                                                      \
            for (Py_ssize_t m = 0; m < n_maps; m++) {                                                                 \
                const double *head = (const double *)maps.buf + m * T * T;                                            \
                BODY(double, VALUE_AS_IS);                                                                            \
            }                                                                                                         \
        }                                                                                                             \
    } while (0)

/* The module `NAME` with `METHODS` and its KERNEL_VERSION. */
#define KERNEL_MODULE(NAME, DOC, METHODS)                                                                             \
    static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, #NAME, DOC, -1, METHODS};                              \
    PyMODINIT_FUNC PyInit_##NAME(void) {                                                                              \
        PyObject *mod = PyModule_Create(&module);                                                                     \
        if (mod && PyModule_AddIntConstant(mod, "KERNEL_VERSION", KERNEL_VERSION) < 0) {                              \
            Py_DECREF(mod);                                                                                           \
            return NULL;                                                                                              \
        }                                                                                                             \
        return mod;                                                                                                   \
    }

#endif
