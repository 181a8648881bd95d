/* clops/clops.h: the C view of a clops tensor, for native extensions (plain C, pybind11,
 * Cython). Part of the clops wheel: compile with -I$(python -c "import clops;
 * print(clops.get_include())") and link with -lOpenCL.
 *
 * Python side: clops.native.tensor_view(t) returns a PyCapsule named "clops.tensor_view" whose
 * pointer is a `const clops_tensor_view *`; clops.native.report_write(capsule, event) (or
 * report_read) tells clops about the extension's last command on the tensor.
 *
 * Protocol, per call of the extension:
 *   1. get the view from the capsule (clops_tensor_view_from_capsule below);
 *   2. enqueue the work on view->queue (or any queue of view->context), with view->wait_event
 *      in the wait list of the first command when it is not NULL;
 *   3. report the event of the last command (clops_report_write / clops_report_read below),
 *      before clops is given the tensor again; clops retains the event itself, so release
 *      yours as usual. Later clops work on the tensor then waits for it, and the tensor's
 *      memory stays allocated until it completes.
 *
 * Lifetime: the struct, its shape and strides arrays and every handle in it are valid while
 * the capsule is alive (the capsule holds the tensor, its queue and the wait event). Retain a
 * handle (clRetainMemObject, clRetainCommandQueue...) to keep it longer.
 *
 * Versioning: `version` is the first field and never moves. A later version only appends
 * fields (and raises CLOPS_TENSOR_VIEW_VERSION); `size` is sizeof the struct clops filled in.
 * Check `version >= N` before reading a field added in version N. An incompatible change
 * would get a new capsule name, so an old extension fails with a clear error instead.
 */
#ifndef CLOPS_CLOPS_H
#define CLOPS_CLOPS_H

#include <stdint.h>

/* NOTE: define CL_TARGET_OPENCL_VERSION before this include to choose the OpenCL API level. */
#ifdef __APPLE__
#include <OpenCL/opencl.h>
#else
#include <CL/cl.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define CLOPS_TENSOR_VIEW_CAPSULE "clops.tensor_view"
#define CLOPS_TENSOR_VIEW_VERSION 1

/* Element types (clops_tensor_view.dtype). Numbers never change; new types get new numbers. */
#define CLOPS_DTYPE_BOOL 0 /* one byte, 0 or 1 */
#define CLOPS_DTYPE_INT8 1
#define CLOPS_DTYPE_INT16 2
#define CLOPS_DTYPE_INT32 3
#define CLOPS_DTYPE_INT64 4
#define CLOPS_DTYPE_UINT8 5
#define CLOPS_DTYPE_UINT16 6
#define CLOPS_DTYPE_UINT32 7
#define CLOPS_DTYPE_UINT64 8
#define CLOPS_DTYPE_FLOAT16 9    /* IEEE half (OpenCL vload_half / vstore_half) */
#define CLOPS_DTYPE_BFLOAT16 10  /* the high 16 bits of a float32 */
#define CLOPS_DTYPE_FLOAT32 11
#define CLOPS_DTYPE_FLOAT64 12
#define CLOPS_DTYPE_COMPLEX64 13  /* float2: real, imaginary */
#define CLOPS_DTYPE_COMPLEX128 14 /* double2 */

typedef struct clops_tensor_view {
    uint32_t version;         /* CLOPS_TENSOR_VIEW_VERSION of the clops that filled it in */
    uint32_t size;            /* sizeof(clops_tensor_view) in that version */
    cl_mem mem;               /* the buffer holding the elements (shared with other tensors) */
    int64_t offset;           /* bytes from the start of mem to element [0, ..., 0] */
    int32_t ndim;
    int32_t dtype;            /* CLOPS_DTYPE_* */
    int64_t itemsize;         /* bytes per element */
    const int64_t *shape;     /* ndim entries */
    const int64_t *strides;   /* ndim entries, in elements (not bytes); 0 on broadcast axes,
                                 negative on flipped ones */
    cl_command_queue queue;   /* the clops queue to enqueue on */
    cl_context context;
    cl_device_id device;
    cl_event wait_event;      /* NULL, or what the first command must wait for: the tensor's
                                 pending write, and for a write view its pending reads too.
                                 NULL when nothing is pending or it is ordered before the work
                                 already (earlier on the same in-order queue) */
} clops_tensor_view;

#ifdef __cplusplus
}
#endif

/* Helpers for CPython extensions (pybind11 and Cython modules include Python.h first). */
#if defined(Py_PYTHON_H)

/* The view in a capsule from clops.native.tensor_view; NULL with a Python exception set when
 * the object is not such a capsule or comes from a clops older than this header. */
static inline const clops_tensor_view *clops_tensor_view_from_capsule(PyObject *capsule) {
    const clops_tensor_view *view =
        (const clops_tensor_view *)PyCapsule_GetPointer(capsule, CLOPS_TENSOR_VIEW_CAPSULE);
    if (view == NULL) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError,
                     "expected the capsule of clops.native.tensor_view(tensor), not %.100s",
                     Py_TYPE(capsule)->tp_name);
        return NULL;
    }
    if (view->version < CLOPS_TENSOR_VIEW_VERSION) {
        PyErr_Format(PyExc_RuntimeError,
                     "this extension was built for clops tensor views of version %d but the "
                     "installed clops gives version %u; upgrade clops or rebuild the extension",
                     CLOPS_TENSOR_VIEW_VERSION, (unsigned)view->version);
        return NULL;
    }
    return view;
}

/* Report the extension's last command on the tensor of `capsule` (write != 0: it wrote the
 * tensor; 0: it only read it). Returns 0, or -1 with a Python exception set. */
static inline int clops_report(PyObject *capsule, cl_event event, int write) {
    PyObject *native = PyImport_ImportModule("clops.native");
    if (native == NULL) return -1;
    PyObject *result = PyObject_CallMethod(native, write ? "report_write" : "report_read", "ON",
                                           capsule, PyLong_FromVoidPtr((void *)event));
    Py_DECREF(native);
    if (result == NULL) return -1;
    Py_DECREF(result);
    return 0;
}

static inline int clops_report_write(PyObject *capsule, cl_event event) {
    return clops_report(capsule, event, 1);
}

static inline int clops_report_read(PyObject *capsule, cl_event event) {
    return clops_report(capsule, event, 0);
}

#endif /* Py_PYTHON_H */

#endif /* CLOPS_CLOPS_H */
