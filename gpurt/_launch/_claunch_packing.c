/* PackingLauncher (gpurt._launch._claunch): packing plain arguments into a parameter buffer on
 * the C stack and launching with a Launcher; see _claunch.c. */
#include "_claunch.h"

typedef struct {
    Py_ssize_t offset;
    char code; /* a struct code: b B h H i I q Q e f d, or P for a pointer */
} Field;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    Launcher *launcher;
    PyObject *array_type; /* gpurt.Array: its .ptr is taken when .device.index matches */
    PyObject *hooks;      /* the list of launch hooks: launches with hooks go to fallback */
    PyObject *fallback;   /* fallback(grid, block, args, shared_mem, stream, index) */
    PyObject *refused;    /* refused(code, grid, block, shared_mem) raises */
    Py_ssize_t size;      /* bytes of the parameter buffer */
    Py_ssize_t count;     /* parameters */
    Field *fields;
    Slot ptr, device, index; /* Array.ptr, Array.device and Array.device.index */
} PackingLauncher;

static PyObject *str_device, *str_index, *str_ptr; /* attribute names, interned */

/* A pointer: None, an int, or a gpurt Array on device ``index``. */
static int pack_pointer(PackingLauncher *self, PyObject *value, long index, unsigned char *at)
{
    unsigned long long address = 0;
    if (PyLong_CheckExact(value)) {
        address = PyLong_AsUnsignedLongLong(value);
    } else if ((PyObject *)Py_TYPE(value) == self->array_type) {
        PyObject *device = slot_get(&self->device, value, str_device);
        PyObject *on = device == NULL ? NULL : slot_get(&self->index, device, str_index);
        Py_XDECREF(device);
        long on_index = on == NULL ? -1 : PyLong_AsLong(on);
        Py_XDECREF(on);
        if (on == NULL || (on_index == -1 && PyErr_Occurred()) || on_index != index) {
            return unsupported(); /* no int index, or another device: Python says which */
        }
        PyObject *ptr = slot_get(&self->ptr, value, str_ptr);
        if (ptr == NULL) {
            return unsupported();
        }
        address = PyLong_AsUnsignedLongLong(ptr);
        Py_DECREF(ptr);
    } else if (value != Py_None) {
        return unsupported();
    }
    if (address == (unsigned long long)-1 && PyErr_Occurred()) {
        return unsupported();
    }
    memcpy(at, &address, sizeof address);
    return 1;
}

static int pack_args(PackingLauncher *self, PyObject *args, long index, unsigned char *buffer,
                     void **pointers)
{
    if (!PyTuple_CheckExact(args) || PyTuple_GET_SIZE(args) != self->count) {
        return 0;
    }
    memset(buffer, 0, self->size);
    for (Py_ssize_t i = 0; i < self->count; i++) {
        Field field = self->fields[i];
        PyObject *value = PyTuple_GET_ITEM(args, i);
        unsigned char *at = buffer + field.offset;
        int packed;
        if (field.code == 'P') {
            packed = pack_pointer(self, value, index, at);
        } else if (field.code == 'f' || field.code == 'd' || field.code == 'e') {
            packed = pack_float(field.code, value, at);
        } else {
            packed = pack_integer(field.code, value, at);
        }
        if (!packed) {
            return 0;
        }
        pointers[i] = at;
    }
    return 1;
}

static PyObject *packing_call(PyObject *callable, PyObject *const *args, size_t nargsf,
                              PyObject *kwnames)
{
    PackingLauncher *self = (PackingLauncher *)callable;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs != 6 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames))) {
        PyErr_SetString(PyExc_TypeError, "PackingLauncher takes 6 positional arguments: "
                                         "(grid, block, args, shared_mem, stream, index)");
        return NULL;
    }
    _Alignas(16) unsigned char buffer[MAX_PARAM_BYTES];
    void *pointers[MAX_PARAMS];
    unsigned grid[3], block[3], shared_mem;
    void *stream;
    long index = PyLong_AsLong(args[5]);
    int plain = PyList_GET_SIZE(self->hooks) == 0 && !(index == -1 && PyErr_Occurred()) &&
                plain_dims3(args[0], grid) == 1 && plain_dims3(args[1], block) == 1 &&
                PyLong_CheckExact(args[3]) && as_uint(args[3], &shared_mem) == 0 &&
                as_pointer(args[4], &stream) == 0 &&
                pack_args(self, args[2], index, buffer, pointers) && !PyErr_Occurred();
    if (!plain) {
        PyErr_Clear();
        return PyObject_Vectorcall(self->fallback, args, nargs, NULL);
    }
    int result = call_driver(self->launcher, grid, block, shared_mem, stream, pointers);
    if (result == 0) {
        Py_RETURN_NONE;
    }
    PyObject *code = PyLong_FromLong(result);
    if (code == NULL) {
        return NULL;
    }
    PyObject *refused = PyObject_CallFunctionObjArgs(self->refused, code, args[0], args[1],
                                                     args[3], NULL);
    Py_DECREF(code);
    return refused;
}

static PyObject *packing_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"launcher", "size", "layout", "array_type", "hooks", "fallback",
                            "refused", NULL};
    PyObject *launcher, *layout, *array_type, *hooks, *fallback, *refused;
    Py_ssize_t size;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!nO!O!O!OO:PackingLauncher", names,
                                     &LauncherType, &launcher, &size, &PyTuple_Type, &layout,
                                     &PyType_Type, &array_type, &PyList_Type, &hooks, &fallback,
                                     &refused)) {
        return NULL;
    }
    Py_ssize_t count = PyTuple_GET_SIZE(layout);
    if (size < 0 || size > MAX_PARAM_BYTES || count > MAX_PARAMS) {
        PyErr_Format(PyExc_ValueError, "at most %d parameters in %d bytes, got %zd in %zd",
                     MAX_PARAMS, MAX_PARAM_BYTES, count, size);
        return NULL;
    }
    if (!PyCallable_Check(fallback) || !PyCallable_Check(refused)) {
        PyErr_SetString(PyExc_TypeError, "fallback and refused must be callable");
        return NULL;
    }
    Field *fields = PyMem_Calloc(count ? count : 1, sizeof(Field));
    if (fields == NULL) {
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_ssize_t offset;
        const char *code;
        Py_ssize_t length;
        PyObject *item = PyTuple_GET_ITEM(layout, i);
        if (!PyTuple_Check(item)) {
            PyErr_Format(PyExc_TypeError, "layout entry %zd: %R is not an (offset, code) tuple",
                         i, item);
        }
        if (PyErr_Occurred() || !PyArg_ParseTuple(item, "ns#", &offset, &code, &length)) {
            PyMem_Free(fields);
            return NULL;
        }
        int bytes = length == 1 ? code_size(*code) : 0;
        /* offset > size - bytes, not offset + bytes > size: that sum overflows (UB) */
        if (bytes == 0 || offset < 0 || offset > size - bytes) {
            PyErr_Format(PyExc_ValueError, "layout entry %zd: (%zd, %R) is not an (offset, "
                         "code) inside %zd bytes with a code of bBhHiIqQefdP", i, offset,
                         PyTuple_GET_ITEM(item, 1), size);
            PyMem_Free(fields);
            return NULL;
        }
        fields[i].offset = offset;
        fields[i].code = *code;
    }
    PackingLauncher *self = (PackingLauncher *)type->tp_alloc(type, 0);
    if (self == NULL) {
        PyMem_Free(fields);
        return NULL;
    }
    self->vectorcall = packing_call;
    self->launcher = (Launcher *)Py_NewRef(launcher);
    self->array_type = Py_NewRef(array_type);
    self->hooks = Py_NewRef(hooks);
    self->fallback = Py_NewRef(fallback);
    self->refused = Py_NewRef(refused);
    self->size = size;
    self->count = count;
    self->fields = fields;
    return (PyObject *)self;
}

static int packing_traverse(PackingLauncher *self, visitproc visit, void *arg)
{
    Py_VISIT(self->launcher);
    Py_VISIT(self->array_type);
    Py_VISIT(self->ptr.type);
    Py_VISIT(self->device.type);
    Py_VISIT(self->index.type);
    Py_VISIT(self->hooks);
    Py_VISIT(self->fallback);
    Py_VISIT(self->refused);
    return 0;
}

static int packing_clear(PackingLauncher *self)
{
    Py_CLEAR(self->launcher);
    Py_CLEAR(self->array_type);
    Py_CLEAR(self->ptr.type);
    Py_CLEAR(self->device.type);
    Py_CLEAR(self->index.type);
    Py_CLEAR(self->hooks);
    Py_CLEAR(self->fallback);
    Py_CLEAR(self->refused);
    return 0;
}

static void packing_dealloc(PackingLauncher *self)
{
    PyObject_GC_UnTrack(self);
    packing_clear(self);
    PyMem_Free(self->fields);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef packing_members[] = {
    {"launcher", T_OBJECT, offsetof(PackingLauncher, launcher), READONLY,
     "the Launcher that makes the driver call"},
    {"fallback", T_OBJECT, offsetof(PackingLauncher, fallback), READONLY,
     "the Python launcher that takes every launch this one does not"},
    {NULL},
};

static PyTypeObject PackingLauncherType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gpurt._launch._claunch.PackingLauncher",
    .tp_doc = "PackingLauncher(launcher, size, layout, array_type, hooks, fallback, refused):\n"
              "packing(grid, block, args, shared_mem, stream, index) packs plain arguments at "
              "the (offset, struct code) pairs of ``layout`` and launches with ``launcher``;\n"
              "every other launch goes to ``fallback`` with the same arguments.",
    .tp_basicsize = sizeof(PackingLauncher),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = packing_new,
    .tp_dealloc = (destructor)packing_dealloc,
    .tp_traverse = (traverseproc)packing_traverse,
    .tp_clear = (inquiry)packing_clear,
    .tp_members = packing_members,
    .tp_vectorcall_offset = offsetof(PackingLauncher, vectorcall),
    .tp_call = PyVectorcall_Call,
};

int claunch_add_packing_launcher(PyObject *module)
{
    struct {
        PyObject **name;
        const char *text;
    } names[] = {{&str_device, "device"}, {&str_index, "index"}, {&str_ptr, "ptr"}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        *names[i].name = PyUnicode_InternFromString(names[i].text);
        if (*names[i].name == NULL) {
            return -1;
        }
    }
    if (PyType_Ready(&PackingLauncherType) < 0) {
        return -1;
    }
    return PyModule_AddObjectRef(module, "PackingLauncher", (PyObject *)&PackingLauncherType);
}
