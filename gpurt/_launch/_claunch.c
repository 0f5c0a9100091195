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
 * needs the CUDA headers: cuLaunchKernel's C signature is declared below.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <structmember.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gpurt._launch._claunch packs parameters in the host's byte order, which must be little-endian"
#endif

#if PY_VERSION_HEX < 0x030B0000 /* PyFloat_Pack2/4 became public in Python 3.11 */
#define PyFloat_Pack2(x, p, le) _PyFloat_Pack2((x), (unsigned char *)(p), (le))
#define PyFloat_Pack4(x, p, le) _PyFloat_Pack4((x), (unsigned char *)(p), (le))
#endif

/* The largest parameter buffer and parameter count a PackingLauncher packs on the stack; the
 * classic 4 KiB kernel parameter limit. Larger kernels launch through their Python launcher. */
#define MAX_PARAM_BYTES 4096
#define MAX_PARAMS 1024

/* CUresult cuLaunchKernel(CUfunction f, unsigned gridDimX, gridDimY, gridDimZ,
 *     unsigned blockDimX, blockDimY, blockDimZ, unsigned sharedMemBytes, CUstream hStream,
 *     void **kernelParams, void **extra) */
typedef int (*launch_fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                         unsigned, void *, void **, void **);

/* ---- conversions ------------------------------------------------------------------------- */

/* An unsigned int from a Python int, raising OverflowError out of range and TypeError for
 * anything that is not an int (as the cuda.bindings conversions do). */
static int as_uint(PyObject *value, unsigned *out)
{
    unsigned long number = PyLong_AsUnsignedLong(value);
    if (number == (unsigned long)-1 && PyErr_Occurred()) {
        return -1;
    }
    if (number > UINT_MAX) {
        PyErr_SetString(PyExc_OverflowError, "value too large for an unsigned int");
        return -1;
    }
    *out = (unsigned)number;
    return 0;
}

/* A pointer from None (NULL), an int or anything with __index__ (a CUstream). */
static int as_pointer(PyObject *value, void **out)
{
    if (value == Py_None) {
        *out = NULL;
        return 0;
    }
    PyObject *number = PyNumber_Index(value);
    if (number == NULL) {
        return -1;
    }
    unsigned long long address = PyLong_AsUnsignedLongLong(number);
    Py_DECREF(number);
    if (address == (unsigned long long)-1 && PyErr_Occurred()) {
        return -1;
    }
    *out = (void *)(uintptr_t)address;
    return 0;
}

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

/* ---- Launcher: the driver call ----------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    launch_fn launch;
    unsigned long long address;  /* of cuLaunchKernel (read-only attribute) */
    unsigned long long function; /* the CUfunction (read-only attribute) */
    PyObject *dims;              /* dims(value, what) -> (x, y, z) for the other forms */
} Launcher;

static PyTypeObject LauncherType;

/* Grid or block dims given as an int or a 3-tuple of ints: 1 when done, 0 when ``value`` has
 * another form (nothing converted), -1 with an exception set for a value out of range. */
static int plain_dims3(PyObject *value, unsigned out[3])
{
    if (PyLong_CheckExact(value)) {
        out[1] = out[2] = 1;
        return as_uint(value, &out[0]) < 0 ? -1 : 1;
    }
    if (!PyTuple_CheckExact(value) || PyTuple_GET_SIZE(value) != 3) {
        return 0;
    }
    for (Py_ssize_t i = 0; i < 3; i++) {
        if (!PyLong_CheckExact(PyTuple_GET_ITEM(value, i))) {
            return 0;
        }
    }
    for (Py_ssize_t i = 0; i < 3; i++) {
        if (as_uint(PyTuple_GET_ITEM(value, i), &out[i]) < 0) {
            return -1;
        }
    }
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

/* cuLaunchKernel with the GIL released. */
static int call_driver(Launcher *self, const unsigned grid[3], const unsigned block[3],
                       unsigned shared_mem, void *stream, void **params)
{
    void *function = (void *)(uintptr_t)self->function;
    int result;
    Py_BEGIN_ALLOW_THREADS
    result = self->launch(function, grid[0], grid[1], grid[2], block[0], block[1], block[2],
                          shared_mem, stream, params, NULL);
    Py_END_ALLOW_THREADS
    return result;
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

static PyTypeObject LauncherType = {
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

/* ---- PackingLauncher: packing plain arguments and launching ------------------------------ */

/* One __slots__ attribute of the objects of one type, read straight from the object as its
 * member descriptor does (an attribute read through getattr costs more than the packing of a
 * plain argument); ``offset`` is -1 where the type has no such slot: then getattr reads it. */
typedef struct {
    PyObject *type; /* a strong reference, or NULL before the first look */
    Py_ssize_t offset;
} Slot;

static void slot_find(Slot *slot, PyObject *type, PyObject *name)
{
    Py_ssize_t offset = -1;
    PyObject *descr = PyObject_GetAttr(type, name);
    if (descr != NULL && Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
        PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
        if (member->type == T_OBJECT_EX) {
            offset = member->offset;
        }
    }
    Py_XDECREF(descr);
    PyErr_Clear(); /* no such class attribute: getattr finds it on the object, or not */
    PyObject *old = slot->type; /* type and offset change together, with no Python between */
    slot->type = Py_NewRef(type);
    slot->offset = offset;
    Py_XDECREF(old);
}

/* ``value.name`` (a new reference), or NULL where it is unset or cannot be read. */
static PyObject *slot_get(Slot *slot, PyObject *value, PyObject *name)
{
    if ((PyObject *)Py_TYPE(value) != slot->type) {
        slot_find(slot, (PyObject *)Py_TYPE(value), name);
    }
    if (slot->offset < 0) {
        return PyObject_GetAttr(value, name);
    }
    return Py_XNewRef(*(PyObject **)((char *)value + slot->offset));
}

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

/* The functions below return 1 when they packed ``value`` and 0 when they leave it to the
 * Python launcher, with no exception set. */

static int unsupported(void)
{
    PyErr_Clear();
    return 0;
}

/* Bytes of a code this module packs, 0 for any other code. */
static int code_size(char code)
{
    switch (code) {
    case 'b': case 'B': return 1;
    case 'h': case 'H': case 'e': return 2;
    case 'i': case 'I': case 'f': return 4;
    case 'q': case 'Q': case 'd': case 'P': return 8;
    default: return 0;
    }
}

/* An integer struct code (lower case signed, upper case unsigned), range-checked as struct
 * does. */
static int pack_integer(char code, PyObject *value, unsigned char *at)
{
    int size = code_size(code), is_signed = code >= 'a';
    PyObject *number = PyLong_CheckExact(value) ? Py_NewRef(value) : PyNumber_Index(value);
    if (number == NULL) {
        return unsupported();
    }
    int fits;
    if (is_signed) {
        long long v = PyLong_AsLongLong(number);
        long long limit = size == 8 ? LLONG_MAX : (1LL << (8 * size - 1)) - 1;
        fits = !(v == -1 && PyErr_Occurred()) && v >= -limit - 1 && v <= limit;
        memcpy(at, &v, size);
    } else {
        unsigned long long v = PyLong_AsUnsignedLongLong(number);
        unsigned long long limit = size == 8 ? ULLONG_MAX : (1ULL << (8 * size)) - 1;
        fits = !(v == (unsigned long long)-1 && PyErr_Occurred()) && v <= limit;
        memcpy(at, &v, size);
    }
    Py_DECREF(number);
    return fits ? 1 : unsupported();
}

/* A float struct code (f, d, e), converted as struct does. */
static int pack_float(char code, PyObject *value, unsigned char *at)
{
    double x = PyFloat_CheckExact(value) ? PyFloat_AS_DOUBLE(value) : PyFloat_AsDouble(value);
    if (x == -1.0 && PyErr_Occurred()) {
        return unsupported();
    }
    if (code == 'd') {
        memcpy(at, &x, sizeof x);
        return 1;
    }
    int failed = code == 'f' ? PyFloat_Pack4(x, (char *)at, 1) : PyFloat_Pack2(x, (char *)at, 1);
    return failed ? unsupported() : 1;
}

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

static PyObject *str_dict, *str_bound, *str_streams, *str_handles,
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
static PyObject *thread_attributes(PyObject *thread)
{
    PyObject *attributes = PyObject_GetAttr(thread, str_dict);
    if (attributes != NULL && !PyDict_CheckExact(attributes)) {
        Py_CLEAR(attributes);
    }
    return attributes;
}

/* This thread's device index, when its context is bound (borrowed from ``device``, this
 * thread's attributes), else NULL. */
static PyObject *bound_device(PyObject *device)
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
static PyObject *current_stream(PyObject *attributes, PyObject *index)
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
        {&str_device, "device"}, {&str_index, "index"}, {&str_ptr, "ptr"}, {&str_dict, "__dict__"},
        {&str_bound, "bound"}, {&str_streams, "streams"}, {&str_handles, "handles"},
        {&str_loaded, "_loaded"}, {&str_launch, "launch"},
        {&str_max_dynamic_shared, "max_dynamic_shared"}, {&str_shared_mem, "shared_mem"},
        {&str_stream, "stream"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        *names[i].name = PyUnicode_InternFromString(names[i].text);
        if (*names[i].name == NULL) {
            return NULL;
        }
    }
    if (PyType_Ready(&LauncherType) < 0 || PyType_Ready(&PackingLauncherType) < 0 ||
        PyType_Ready(&KernelCallType) < 0) {
        return NULL;
    }
    PyObject *module = PyModule_Create(&claunch_module);
    if (module == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(module, "Launcher", (PyObject *)&LauncherType) < 0 ||
        PyModule_AddObjectRef(module, "PackingLauncher", (PyObject *)&PackingLauncherType) < 0 ||
        PyModule_AddObjectRef(module, "KernelCall", (PyObject *)&KernelCallType) < 0 ||
        PyModule_AddIntConstant(module, "MAX_PARAM_BYTES", MAX_PARAM_BYTES) < 0 ||
        PyModule_AddIntConstant(module, "MAX_PARAMS", MAX_PARAMS) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
