/* gpurt._launch._claunch: the compiled launch path, from kernel(grid, block, args) to cuLaunchKernel.
 *
 * gpurt finds the driver's cuLaunchKernel once, through cuda.bindings (cuGetProcAddress, in
 * gpurt/_launch/path.py), and makes these objects (gpurt/_launch/kernel.py):
 *
 * Launcher(address, function, dims): the driver call, one per loaded kernel.
 *     launcher(grid, block, shared_mem, stream, params) -> the CUresult as an int
 *   Grid and block are ints or 3-tuples of ints; anything else goes through ``dims(value,
 *   "grid" | "block")``, gpurt's validating converter. ``params`` is the address of the void*
 *   array of a parameter buffer that gpurt's per-kernel plan (gpurt/_launch/args.py) packed.
 *
 * PackingLauncher(launcher, size, layout, array_type, hooks, fallback, refused): a launch.
 *     packing(grid, block, args, shared_mem, stream, index) -> None
 *   Packs plain arguments (ints, floats, numpy scalars, None and gpurt Arrays on device
 *   ``index``) at the offsets and with the struct codes of the plan's ``layout`` into a buffer
 *   on the C stack (the driver copies the parameters during the call) and launches with
 *   ``launcher``. Whatever it does not take as it is -- another argument type, a value out of
 *   range, an unusual grid, registered launch hooks -- it hands untouched to ``fallback``, the
 *   plan's generated Python launcher, which converts everything and explains every error. A
 *   result other than success goes to ``refused(code, grid, block, shared_mem)``, which raises.
 *
 * KernelCall(function): Kernel.__call__, the fast path of the Python ``function`` in C (see
 * its comment below).
 *
 * The GIL is released around cuLaunchKernel, as cuda.bindings does. Result codes become
 * exceptions in Python, in gpurt._core.driver.check, as for every other driver call. Nothing here
 * needs the CUDA headers: cuLaunchKernel's C signature is declared in _claunch.h.
 *
 * The files: this one holds KernelCall and the module; _claunch_launcher.c, Launcher;
 * _claunch_packing.c, PackingLauncher; _claunch.h, what they share (setup.py lists them).
 */
#include "_claunch.h"

/* ---- KernelCall: Kernel.__call__ ------------------------------------------------------ */

/* KernelCall(function, thread, convert) is Kernel.__call__ when this extension is there:
 * ``function`` is the Python __call__ of gpurt/_launch/kernel.py, and this does what its fast
 * path does, from C. ``thread`` is gpurt/_core/state.py's THREAD, whose contract that module
 * documents: this reads the calling thread's ``index`` and ``bound`` (its current device and
 * the device whose context is bound) and ``streams.handles`` (the current stream handle of
 * each device), then the kernel's _loaded[index] (.launch, .max_dynamic_shared), and calls
 * loaded.launch(grid, block, args, shared_mem, stream, index). ``convert`` is
 * gpurt.as_stream_handle, for a stream given as an object. Every other case -- a device not loaded or not bound yet, more dynamic shared
 * memory than allowed so far, a stream object, keywords it does not know -- goes to
 * ``function`` with the call's arguments as they were. */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *function; /* the Python __call__ */
    PyObject *thread;   /* gpurt._core.state.THREAD */
    PyObject *convert;  /* gpurt.as_stream_handle */
} KernelCall;

static PyObject *str_index, *str_dict, *str_bound, *str_streams, *str_handles,
    *str_loaded, *str_launch, *str_max_dynamic_shared, *str_shared_mem, *str_stream;

/* (grid, block, args, shared_mem, stream) of a call kernel(grid, block, args, shared_mem=0,
 * stream=None) into ``out`` (borrowed); 0 for any other form of call. */
static int gather(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, PyObject *out[5])
{
    if (nargs < 3 || nargs > 5) {
        return 0;
    }
    out[3] = out[4] = NULL;
    for (Py_ssize_t i = 0; i < nargs; i++) {
        out[i] = args[i];
    }
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t i = 0; i < nkw; i++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, i);
        int slot = name == str_shared_mem ? 3 : name == str_stream ? 4 : -1;
        if (slot < 0 || out[slot] != NULL) {
            return 0; /* another keyword (or one not interned), or a value given twice */
        }
        out[slot] = args[nargs + i];
    }
    return 1;
}

/* The attributes of this thread in the threading.local ``thread`` (a new reference to the
 * thread's dict; reading it once is cheaper than two attribute reads), or NULL. */
PyObject *thread_attributes(PyObject *thread)
{
    PyObject *attributes = PyObject_GetAttr(thread, str_dict);
    if (attributes != NULL && !PyDict_CheckExact(attributes)) {
        Py_CLEAR(attributes);
    }
    return attributes;
}

/* This thread's device index, when its context is bound (borrowed from ``device``, this
 * thread's attributes), else NULL. */
PyObject *bound_device(PyObject *device)
{
    PyObject *index = PyDict_GetItemWithError(device, str_index);
    PyObject *bound = index == NULL ? NULL : PyDict_GetItemWithError(device, str_bound);
    if (bound == NULL || !PyLong_CheckExact(index) || !PyLong_CheckExact(bound) ||
        PyObject_RichCompareBool(index, bound, Py_EQ) != 1) {
        return NULL;
    }
    return index;
}

/* The current stream handle of device ``index`` on this thread (a new reference) or NULL. */
PyObject *current_stream(PyObject *attributes, PyObject *index)
{
    PyObject *streams = PyDict_GetItemWithError(attributes, str_streams);
    PyObject *handles = streams == NULL ? NULL : PyObject_GetAttr(streams, str_handles);
    if (handles == NULL || !PyDict_CheckExact(handles)) {
        Py_XDECREF(handles);
        return NULL;
    }
    PyObject *handle = PyDict_GetItemWithError(handles, index);
    if (handle == NULL && !PyErr_Occurred()) {
        handle = PyLong_FromLong(0); /* the default stream */
    } else {
        Py_XINCREF(handle);
    }
    Py_DECREF(handles);
    return handle;
}

/* as_stream_handle(stream), the handle of a stream object; it raises for what is not a
 * stream. */
static PyObject *stream_handle(KernelCall *self, PyObject *stream)
{
    return PyObject_CallOneArg(self->convert, stream);
}

/* loaded.launch(...) for a plain call on a loaded, bound device: 1 with *result set (NULL
 * when the launch raised), 0 (no exception set) when Python must take the call. */
static int fast_call(KernelCall *self, PyObject *kernel, PyObject *const call[5],
                     PyObject **result)
{
    PyObject *shared_mem = call[3], *stream = call[4];
    if (shared_mem != NULL && !PyLong_CheckExact(shared_mem)) {
        return 0;
    }
    PyObject *attributes = thread_attributes(self->thread);
    PyObject *index = attributes == NULL ? NULL : Py_XNewRef(bound_device(attributes));
    if (index == NULL) {
        Py_XDECREF(attributes);
        return unsupported();
    }
    PyObject *table = PyObject_GetAttr(kernel, str_loaded);
    PyObject *loaded = table == NULL || !PyDict_CheckExact(table)
                           ? NULL : PyDict_GetItemWithError(table, index);
    Py_XINCREF(loaded);
    Py_XDECREF(table);
    PyObject *launch = loaded == NULL ? NULL : PyObject_GetAttr(loaded, str_launch);
    int fits = launch != NULL;
    if (fits && shared_mem != NULL && PyObject_IsTrue(shared_mem)) {
        PyObject *limit = PyObject_GetAttr(loaded, str_max_dynamic_shared);
        fits = limit != NULL && PyObject_RichCompareBool(shared_mem, limit, Py_LE) == 1;
        Py_XDECREF(limit);
    }
    Py_XDECREF(loaded);
    PyObject *handle = NULL;
    int raised = 0; /* by as_stream_handle: then that is the call's exception */
    if (fits && (stream == NULL || stream == Py_None)) {
        handle = current_stream(attributes, index);
    } else if (fits && PyLong_CheckExact(stream)) {
        handle = Py_NewRef(stream);
    } else if (fits) {
        handle = stream_handle(self, stream);
        raised = handle == NULL && PyErr_Occurred();
    }
    Py_DECREF(attributes);
    if (handle == NULL) {
        Py_XDECREF(launch);
        Py_DECREF(index);
        *result = NULL;
        return raised ? 1 : unsupported();
    }
    PyObject *zero = shared_mem == NULL ? PyLong_FromLong(0) : Py_NewRef(shared_mem);
    PyObject *launch_args[6] = {call[0], call[1], call[2], zero, handle, index};
    *result = zero == NULL ? NULL : PyObject_Vectorcall(launch, launch_args, 6, NULL);
    Py_XDECREF(zero);
    Py_DECREF(handle);
    Py_DECREF(launch);
    Py_DECREF(index);
    return 1;
}

static PyObject *kernel_call(PyObject *callable, PyObject *const *args, size_t nargsf,
                             PyObject *kwnames)
{
    KernelCall *self = (KernelCall *)callable;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *call[5], *result;
    if (nargs >= 1 && gather(args + 1, nargs - 1, kwnames, call) &&
        fast_call(self, args[0], call, &result)) {
        return result;
    }
    return PyObject_Vectorcall(self->function, args, nargsf, kwnames);
}

static PyObject *kernel_call_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *function, *thread, *convert;
    if (!PyArg_ParseTuple(args, "O!OO:KernelCall", &PyFunction_Type, &function, &thread,
                          &convert)) {
        return NULL;
    }
    if (!PyCallable_Check(convert)) {
        PyErr_SetString(PyExc_TypeError, "convert must be callable");
        return NULL;
    }
    KernelCall *self = (KernelCall *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->vectorcall = kernel_call;
    self->function = Py_NewRef(function);
    self->thread = Py_NewRef(thread);
    self->convert = Py_NewRef(convert);
    return (PyObject *)self;
}

static PyObject *kernel_call_get(PyObject *self, PyObject *instance, PyObject *owner)
{
    if (instance == NULL || instance == Py_None) {
        return Py_NewRef(self);
    }
    return PyMethod_New(self, instance);
}

static int kernel_call_traverse(KernelCall *self, visitproc visit, void *arg)
{
    Py_VISIT(self->function);
    Py_VISIT(self->thread);
    Py_VISIT(self->convert);
    return 0;
}

static int kernel_call_clear(KernelCall *self)
{
    Py_CLEAR(self->function);
    Py_CLEAR(self->thread);
    Py_CLEAR(self->convert);
    return 0;
}

static void kernel_call_dealloc(KernelCall *self)
{
    PyObject_GC_UnTrack(self);
    kernel_call_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *kernel_call_doc(KernelCall *self, void *closure)
{
    return PyObject_GetAttrString(self->function, "__doc__");
}

static PyGetSetDef kernel_call_getset[] = {
    {"__doc__", (getter)kernel_call_doc, NULL, "the Python __call__'s docstring", NULL},
    {NULL},
};

static PyMemberDef kernel_call_members[] = {
    {"__wrapped__", T_OBJECT, offsetof(KernelCall, function), READONLY,
     "the Python __call__, which takes every call this one does not"},
    {NULL},
};

static PyTypeObject KernelCallType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gpurt._launch._claunch.KernelCall",
    .tp_basicsize = sizeof(KernelCall),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
                Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_new = kernel_call_new,
    .tp_dealloc = (destructor)kernel_call_dealloc,
    .tp_traverse = (traverseproc)kernel_call_traverse,
    .tp_clear = (inquiry)kernel_call_clear,
    .tp_descr_get = kernel_call_get,
    .tp_getset = kernel_call_getset,
    .tp_members = kernel_call_members,
    .tp_vectorcall_offset = offsetof(KernelCall, vectorcall),
    .tp_call = PyVectorcall_Call,
};

/* ---- the module -------------------------------------------------------------------------- */

static struct PyModuleDef claunch_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "gpurt._launch._claunch",
    .m_doc = "The compiled launch path of gpurt: Launcher and PackingLauncher call "
             "cuLaunchKernel from C.",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__claunch(void)
{
    struct {
        PyObject **name;
        const char *text;
    } names[] = {
        {&str_index, "index"}, {&str_dict, "__dict__"}, {&str_bound, "bound"},
        {&str_streams, "streams"}, {&str_handles, "handles"}, {&str_loaded, "_loaded"},
        {&str_launch, "launch"}, {&str_max_dynamic_shared, "max_dynamic_shared"},
        {&str_shared_mem, "shared_mem"}, {&str_stream, "stream"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        *names[i].name = PyUnicode_InternFromString(names[i].text);
        if (*names[i].name == NULL) {
            return NULL;
        }
    }
    if (PyType_Ready(&KernelCallType) < 0) {
        return NULL;
    }
    PyObject *module = PyModule_Create(&claunch_module);
    if (module == NULL) {
        return NULL;
    }
    if (claunch_add_launcher(module) < 0 || claunch_add_packing_launcher(module) < 0 ||
        claunch_add_planned_launch(module) < 0 || claunch_add_signature(module) < 0 ||
        claunch_add_dispatcher(module) < 0 ||
        PyModule_AddObjectRef(module, "KernelCall", (PyObject *)&KernelCallType) < 0 ||
        PyModule_AddIntConstant(module, "MAX_PARAM_BYTES", MAX_PARAM_BYTES) < 0 ||
        PyModule_AddIntConstant(module, "MAX_PARAMS", MAX_PARAMS) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
