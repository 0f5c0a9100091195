/* Launcher (gpurt._launch._claunch): the driver call, one per loaded kernel; see _claunch.c. */
#include "_claunch.h"

/* A PyArg "O&" converter: an unsigned 64-bit address from a non-negative int. */
static int address_converter(PyObject *value, void *out)
{
    unsigned long long address = PyLong_AsUnsignedLongLong(value);
    if (address == (unsigned long long)-1 && PyErr_Occurred()) {
        return 0;
    }
    *(unsigned long long *)out = address;
    return 1;
}

/* Grid or block dims in any form: plain ones here, the others through dims(value, what), which
 * raises for what is not valid. */
static int dims3(Launcher *self, PyObject *value, const char *what, unsigned out[3])
{
    int done = plain_dims3(value, out);
    if (done != 0) {
        return done < 0 ? -1 : 0;
    }
    PyObject *dims = PyObject_CallFunction(self->dims, "Os", value, what);
    if (dims == NULL) {
        return -1;
    }
    int failed = !PyTuple_Check(dims) || PyTuple_GET_SIZE(dims) != 3;
    if (failed) {
        PyErr_Format(PyExc_TypeError, "dims(%s) must return a 3-tuple", what);
    }
    for (Py_ssize_t i = 0; !failed && i < 3; i++) {
        failed = as_uint(PyTuple_GET_ITEM(dims, i), &out[i]) < 0;
    }
    Py_DECREF(dims);
    return failed ? -1 : 0;
}

static PyObject *launcher_call(PyObject *callable, PyObject *const *args, size_t nargsf,
                               PyObject *kwnames)
{
    Launcher *self = (Launcher *)callable;
    if (PyVectorcall_NARGS(nargsf) != 5 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames))) {
        PyErr_SetString(PyExc_TypeError, "Launcher takes 5 positional arguments: "
                                         "(grid, block, shared_mem, stream, params)");
        return NULL;
    }
    unsigned grid[3], block[3], shared_mem;
    void *stream, *params;
    if (dims3(self, args[0], "grid", grid) < 0 || dims3(self, args[1], "block", block) < 0 ||
        as_uint(args[2], &shared_mem) < 0 || as_pointer(args[3], &stream) < 0 ||
        as_pointer(args[4], &params) < 0) {
        return NULL;
    }
    return PyLong_FromLong(call_driver(self, grid, block, shared_mem, stream, (void **)params));
}

static PyObject *launcher_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"address", "function", "dims", NULL};
    unsigned long long address, function;
    PyObject *dims;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O&O&O:Launcher", names, address_converter,
                                     &address, address_converter, &function, &dims)) {
        return NULL;
    }
    if (address == 0) {
        PyErr_SetString(PyExc_ValueError, "the address of cuLaunchKernel must not be 0");
        return NULL;
    }
    if (!PyCallable_Check(dims)) {
        PyErr_SetString(PyExc_TypeError, "dims must be callable");
        return NULL;
    }
    Launcher *self = (Launcher *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->vectorcall = launcher_call;
    self->launch = (launch_fn)(uintptr_t)address;
    self->address = address;
    self->function = function;
    self->dims = Py_NewRef(dims);
    return (PyObject *)self;
}

static int launcher_traverse(Launcher *self, visitproc visit, void *arg)
{
    Py_VISIT(self->dims);
    return 0;
}

static int launcher_clear(Launcher *self)
{
    Py_CLEAR(self->dims);
    return 0;
}

static void launcher_dealloc(Launcher *self)
{
    PyObject_GC_UnTrack(self);
    launcher_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *launcher_repr(Launcher *self)
{
    return PyUnicode_FromFormat("<gpurt._launch._claunch.Launcher function=%p cuLaunchKernel=%p>",
                                (void *)(uintptr_t)self->function,
                                (void *)(uintptr_t)self->address);
}

static PyMemberDef launcher_members[] = {
    {"address", T_ULONGLONG, offsetof(Launcher, address), READONLY,
     "the address of the driver's cuLaunchKernel"},
    {"function", T_ULONGLONG, offsetof(Launcher, function), READONLY,
     "the CUfunction this launcher launches"},
    {NULL},
};

PyTypeObject LauncherType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gpurt._launch._claunch.Launcher",
    .tp_doc = "Launcher(address, function, dims): calls cuLaunchKernel at ``address`` for the "
              "CUfunction ``function``;\n"
              "launcher(grid, block, shared_mem, stream, params) returns the CUresult as an int.",
    .tp_basicsize = sizeof(Launcher),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = launcher_new,
    .tp_dealloc = (destructor)launcher_dealloc,
    .tp_traverse = (traverseproc)launcher_traverse,
    .tp_clear = (inquiry)launcher_clear,
    .tp_repr = (reprfunc)launcher_repr,
    .tp_members = launcher_members,
    .tp_vectorcall_offset = offsetof(Launcher, vectorcall),
    .tp_call = PyVectorcall_Call,
};

/* CUresult cuStreamIsCapturing(CUstream, CUstreamCaptureStatus *) */
typedef int (*is_capturing_fn)(void *, int *);

/* capture_status(address, handle) -> (CUresult, CUstreamCaptureStatus) as ints: the driver's
 * cuStreamIsCapturing at ``address`` asked about stream ``handle`` (an int), without the
 * bindings' enum objects (a split-K call asks on every call). */
static PyObject *capture_status(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    unsigned long long address, handle;
    if (nargs != 2 || !address_converter(args[0], &address) ||
        !address_converter(args[1], &handle)) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "capture_status(address, handle) takes two ints");
        }
        return NULL;
    }
    if (address == 0) {
        PyErr_SetString(PyExc_ValueError, "capture_status: no cuStreamIsCapturing address");
        return NULL;
    }
    int status = 0;
    int result = ((is_capturing_fn)(uintptr_t)address)((void *)(uintptr_t)handle, &status);
    return Py_BuildValue("(ii)", result, status);
}

static PyMethodDef launcher_functions[] = {
    {"capture_status", (PyCFunction)(void (*)(void))capture_status, METH_FASTCALL,
     "capture_status(address, handle) -> (result, status): cuStreamIsCapturing at address"},
    {NULL},
};

int claunch_add_launcher(PyObject *module)
{
    if (PyType_Ready(&LauncherType) < 0 || PyModule_AddFunctions(module, launcher_functions) < 0) {
        return -1;
    }
    return PyModule_AddObjectRef(module, "Launcher", (PyObject *)&LauncherType);
}
