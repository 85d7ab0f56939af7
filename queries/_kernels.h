/* What the compiled reduces (queries/_clark.c, _patterns.c, _words.c: the parts of the one extension module
   attnstore.queries._kernels, queries/_kernels.c) share: the size check of a buffer argument, the loop over an
   example's maps as float16 codes or float64 values, and each part's namespace with its KERNEL_VERSION (checked
   against queries/engine/kernels.py VERSIONS). */
#ifndef ATTNSTORE_KERNELS_H
#define ATTNSTORE_KERNELS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* 1 when buffer `b` holds `items` items of `itemsize` bytes, else 0 with a ValueError naming `function` and `name`. */
static inline int check_size(Py_buffer *b, Py_ssize_t items, Py_ssize_t itemsize, const char *function,
                             const char *name) {
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

/* The part `NAME` (the file queries/NAME.c): a function `kernel_partNAME` making its namespace, a module object
   holding `METHODS` and the file's KERNEL_VERSION, which queries/_kernels.c sets as the attribute NAME of
   attnstore.queries._kernels (`kernel("NAME")` in queries/engine/kernels.py). */
#define KERNEL_PART(NAME, DOC, METHODS)                                                                               \
    PyObject *kernel_part##NAME(void) {                                                                               \
        PyObject *part = PyModule_New("attnstore.queries._kernels." #NAME);                                           \
        if (part && (PyModule_SetDocString(part, DOC) < 0 || PyModule_AddFunctions(part, METHODS) < 0                 \
                     || PyModule_AddIntConstant(part, "KERNEL_VERSION", KERNEL_VERSION) < 0)) {                       \
            Py_DECREF(part);                                                                                          \
            return NULL;                                                                                              \
        }                                                                                                             \
        return part;                                                                                                  \
    }

/* The parts, each defined by KERNEL_PART in its file. */
PyObject *kernel_part_clark(void);
PyObject *kernel_part_patterns(void);
PyObject *kernel_part_words(void);

#endif
