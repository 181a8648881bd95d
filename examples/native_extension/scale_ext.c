/* Example, native extension: a CPython extension module in plain C that scales a float32 clops
 * tensor in place with its own OpenCL kernel, through the tensor view of clops/clops.h.
 *
 *     import clops, clops_scale_ext
 *     x = clops.asarray(np.arange(8, dtype=np.float32))
 *     clops_scale_ext.scale(clops.native.tensor_view(x), 2.0)
 *     (x + 1).to_numpy()   # clops waits for the extension's kernel
 *
 * Build it with build.py beside this file. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define CL_TARGET_OPENCL_VERSION 120
#include <clops/clops.h>

#include <stddef.h>

/* Any rank and strides: the shape, then the strides (elements), in one constant buffer. */
static const char *SCALE_SOURCE =
    "__kernel void scale(__global float *x, long offset, int ndim, __constant long *dims,\n"
    "                    float factor) {\n"
    "    long i = get_global_id(0), at = offset;\n"
    "    for (int d = ndim - 1; d >= 0; --d) {\n"
    "        at += (i % dims[d]) * dims[ndim + d];\n"
    "        i /= dims[d];\n"
    "    }\n"
    "    x[at] *= factor;\n"
    "}\n";

/* One built kernel, for the context it was built in (rebuilt when a view has another one). */
static cl_context kernel_context = NULL;
static cl_program program = NULL;
static cl_kernel kernel = NULL;

static PyObject *cl_failed(const char *call, cl_int err) {
    return PyErr_Format(PyExc_RuntimeError, "%s failed with OpenCL error %d", call, (int)err);
}

static void drop_kernel(void) {
    if (kernel) clReleaseKernel(kernel);
    if (program) clReleaseProgram(program);
    kernel = NULL;
    program = NULL;
    kernel_context = NULL;
}

/* The scale kernel for `view`'s context; NULL with a Python exception set on failure. */
static cl_kernel scale_kernel(const clops_tensor_view *view) {
    cl_int err;
    if (kernel && kernel_context == view->context) return kernel;
    drop_kernel();
    program = clCreateProgramWithSource(view->context, 1, &SCALE_SOURCE, NULL, &err);
    if (err != CL_SUCCESS) {
        cl_failed("clCreateProgramWithSource", err);
        return NULL;
    }
    err = clBuildProgram(program, 1, &view->device, "", NULL, NULL);
    if (err != CL_SUCCESS) {
        char log[4096] = "";
        clGetProgramBuildInfo(program, view->device, CL_PROGRAM_BUILD_LOG, sizeof log - 1, log,
                              NULL);
        PyErr_Format(PyExc_RuntimeError, "building the scale kernel failed (%d):\n%s", (int)err,
                     log);
        drop_kernel();
        return NULL;
    }
    kernel = clCreateKernel(program, "scale", &err);
    if (err != CL_SUCCESS) {
        drop_kernel();
        cl_failed("clCreateKernel", err);
        return NULL;
    }
    kernel_context = view->context;
    return kernel;
}

static PyObject *scale(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"view", "factor", "wait_for", NULL};
    PyObject *capsule;
    float factor;
    unsigned long long extra_wait = 0; /* a cl_event as an integer, 0 for none */
    (void)self;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "Of|K", keywords, &capsule, &factor,
                                     &extra_wait))
        return NULL;
    const clops_tensor_view *view = clops_tensor_view_from_capsule(capsule);
    if (view == NULL) return NULL;
    if (view->dtype != CLOPS_DTYPE_FLOAT32)
        return PyErr_Format(PyExc_TypeError, "scale takes float32 tensors (CLOPS_DTYPE_FLOAT32 = %d), not dtype code %d",
                            CLOPS_DTYPE_FLOAT32, (int)view->dtype);
    size_t count = 1;
    for (int d = 0; d < view->ndim; ++d) {
        count *= (size_t)view->shape[d];
        if (view->strides[d] == 0 && view->shape[d] > 1)
            return PyErr_Format(PyExc_ValueError,
                                "scale writes in place: axis %d is broadcast (stride 0); pass a "
                                "tensor that owns its elements (x.copy())", d);
    }
    if (count == 0) Py_RETURN_NONE;

    cl_kernel k = scale_kernel(view);
    if (k == NULL) return NULL;
    cl_int err;
    cl_long dims[64];
    if (view->ndim > 32)
        return PyErr_Format(PyExc_ValueError, "scale takes up to 32 axes, not %d", view->ndim);
    for (int d = 0; d < view->ndim; ++d) {
        dims[d] = view->shape[d];
        dims[view->ndim + d] = view->strides[d];
    }
    size_t dims_bytes = sizeof(cl_long) * (size_t)(view->ndim > 0 ? 2 * view->ndim : 1);
    cl_mem dims_buf = clCreateBuffer(view->context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                                     dims_bytes, dims, &err);
    if (err != CL_SUCCESS) return cl_failed("clCreateBuffer", err);
    cl_long offset = view->offset / view->itemsize;
    cl_int ndim = view->ndim;
    err = clSetKernelArg(k, 0, sizeof(cl_mem), &view->mem);
    err |= clSetKernelArg(k, 1, sizeof offset, &offset);
    err |= clSetKernelArg(k, 2, sizeof ndim, &ndim);
    err |= clSetKernelArg(k, 3, sizeof(cl_mem), &dims_buf);
    err |= clSetKernelArg(k, 4, sizeof factor, &factor);
    if (err != CL_SUCCESS) {
        clReleaseMemObject(dims_buf);
        return cl_failed("clSetKernelArg", err);
    }

    /* Wait for what clops says is pending on the tensor, and for the caller's event. */
    cl_event waits[2];
    cl_uint nwaits = 0;
    if (view->wait_event != NULL) waits[nwaits++] = view->wait_event;
    if (extra_wait != 0) waits[nwaits++] = (cl_event)(uintptr_t)extra_wait;
    cl_event done;
    err = clEnqueueNDRangeKernel(view->queue, k, 1, NULL, &count, NULL, nwaits,
                                 nwaits ? waits : NULL, &done);
    clReleaseMemObject(dims_buf); /* the runtime keeps it until the kernel is done */
    if (err != CL_SUCCESS) return cl_failed("clEnqueueNDRangeKernel", err);

    /* clops' later work on the tensor waits for `done`; clops retains its own reference. */
    int reported = clops_report_write(capsule, done);
    clReleaseEvent(done);
    if (reported < 0) return NULL;
    Py_RETURN_NONE;
}

/* The view as this extension sees it (for tests of the struct's layout). */
static PyObject *view_fields(PyObject *self, PyObject *capsule) {
    (void)self;
    const clops_tensor_view *view = clops_tensor_view_from_capsule(capsule);
    if (view == NULL) return NULL;
    PyObject *shape = PyTuple_New(view->ndim);
    PyObject *strides = PyTuple_New(view->ndim);
    if (shape == NULL || strides == NULL) {
        Py_XDECREF(shape);
        Py_XDECREF(strides);
        return NULL;
    }
    for (int d = 0; d < view->ndim; ++d) {
        PyTuple_SET_ITEM(shape, d, PyLong_FromLongLong(view->shape[d]));
        PyTuple_SET_ITEM(strides, d, PyLong_FromLongLong(view->strides[d]));
    }
    return Py_BuildValue(
        "{s:I,s:I,s:n,s:n,s:N,s:L,s:i,s:i,s:L,s:N,s:N,s:N,s:N,s:N,s:N}",
        "version", (unsigned)view->version, "size", (unsigned)view->size,
        "sizeof", (Py_ssize_t)sizeof(clops_tensor_view),
        "offsetof_wait_event", (Py_ssize_t)offsetof(clops_tensor_view, wait_event),
        "mem", PyLong_FromVoidPtr(view->mem), "offset", (long long)view->offset,
        "ndim", view->ndim, "dtype", view->dtype, "itemsize", (long long)view->itemsize,
        "shape", shape, "strides", strides, "queue", PyLong_FromVoidPtr(view->queue),
        "context", PyLong_FromVoidPtr(view->context),
        "device", PyLong_FromVoidPtr(view->device),
        "wait_event", PyLong_FromVoidPtr(view->wait_event));
}

static PyMethodDef methods[] = {
    {"scale", (PyCFunction)(void (*)(void))scale, METH_VARARGS | METH_KEYWORDS,
     "scale(view, factor, wait_for=0): multiply a float32 tensor in place by factor, after the "
     "cl_event wait_for (an int) if given; view is clops.native.tensor_view(tensor)."},
    {"view_fields", view_fields, METH_O, "view_fields(view): the clops_tensor_view as a dict."},
    {NULL, NULL, 0, NULL},
};

static void free_module(void *module) {
    (void)module;
    drop_kernel();
}

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "clops_scale_ext",
    "Example: scale a clops tensor in place with an OpenCL kernel of this extension.", -1,
    methods, NULL, NULL, NULL, free_module,
};

PyMODINIT_FUNC PyInit_clops_scale_ext(void) { return PyModule_Create(&module); }
