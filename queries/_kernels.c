/* attnstore.queries._kernels: attnstore's compiled reduces in one extension module. Each C file of queries/ that
   defines a part with KERNEL_PART (queries/_kernels.h) is compiled into this module (pyproject.toml's ext-modules
   `sources`) and becomes its attribute of the file's name, a namespace holding its functions and its KERNEL_VERSION:
   `_kernels._clark.sums`, `_kernels._patterns.raw_scores`, `_kernels._words.word_maps`. queries/engine/kernels.py
   `kernel(name)` returns one part after checking its version. One module rather than one per file: one build, one
   import, one thing for the wheel and the build rules to name. */
#include "_kernels.h"

static const struct {
    const char *name;
    PyObject *(*make)(void);
} parts[] = {
    {"_clark", kernel_part_clark},
    {"_patterns", kernel_part_patterns},
    {"_words", kernel_part_words},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "attnstore.queries._kernels",
                                    "attnstore's compiled reduces, one attribute per part (queries/_kernels.c).", -1, NULL};

PyMODINIT_FUNC PyInit__kernels(void) {
    PyObject *mod = PyModule_Create(&module);
    for (size_t i = 0; mod && i < sizeof parts / sizeof parts[0]; i++) {
        PyObject *part = parts[i].make();
        if (!part || PyModule_AddObjectRef(mod, parts[i].name, part) < 0) Py_CLEAR(mod);
        Py_XDECREF(part);
    }
    return mod;
}
