/* PlannedLaunch (gpurt._launch._claunch): a launch planned once and repeated with new values.
 *
 * PlannedLaunch(launcher, launch_ex, grid, block, shared_mem, cluster, attribute, template,
 *               offsets, slots, thread, index, hooks, fallback, refused[, cooperative])
 *     planned(stream, *values) -> None
 *
 * Everything about the launch but a few values is fixed when gpurt/_launch/planned.py makes
 * it: the loaded kernel (``launcher``, a Launcher bound to the CUfunction on device ``index``),
 * grid, block, dynamic shared memory, an optional thread-block cluster (launched through
 * cuLaunchKernelEx at ``launch_ex`` with the launch attribute id ``attribute``), an optional
 * cooperative launch (``cooperative``: the id of that launch attribute, 0 for none; also
 * through cuLaunchKernelEx) and the
 * parameter buffer ``template``, packed and checked by the kernel's own plan, whose parameters
 * start at ``offsets``. A call copies the template onto the C stack, packs each value at its
 * ``slots`` entry (offset, struct code, size: "P" an int or None, a scalar code as
 * PackingLauncher packs it, "s" bytes of exactly ``size``) and launches on ``stream`` (an int
 * handle; None: the calling thread's current stream of device ``index``, read from
 * gpurt/_core/state.py's THREAD as KernelCall does).
 *
 * Whatever it does not take as it is -- launch hooks registered, a thread whose bound device is
 * not ``index``, a stream object, a value that does not pack -- goes to ``fallback(stream,
 * *values)``, which launches through Kernel.__call__ / Kernel.launch and explains every error.
 * A result other than success goes to ``refused(code)``, which raises.
 */
#include "_claunch.h"

/* cuLaunchKernelEx's CUlaunchConfig and CUlaunchAttribute (cuda.h, CUDA 12+), as far as
 * cluster and cooperative launches use them. */
typedef struct {
    unsigned id;
    unsigned pad;
    unsigned char value[64]; /* CUlaunchAttributeValue: clusterDim is 3 unsigned at 0, the
                                cooperative flag an int at 0 */
} LaunchAttribute;

typedef struct {
    unsigned grid[3];
    unsigned block[3];
    unsigned shared_mem;
    void *stream;
    LaunchAttribute *attributes;
    unsigned count;
} LaunchConfigEx;

/* CUresult cuLaunchKernelEx(const CUlaunchConfig *, CUfunction, void **params, void **extra) */
typedef int (*launch_ex_fn)(const LaunchConfigEx *, void *, void **, void **);

typedef struct {
    Py_ssize_t offset;
    Py_ssize_t size;
    char code;
} ValueSlot;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    Launcher *launcher;
    launch_ex_fn launch_ex; /* NULL without a cluster or a cooperative launch */
    unsigned grid[3], block[3], shared_mem;
    LaunchAttribute attributes[2]; /* cuLaunchKernelEx's: a cluster's, a cooperative launch's */
    unsigned nattributes;
    long index;
    PyObject *thread;   /* gpurt._core.state.THREAD */
    PyObject *hooks;    /* the list of launch hooks: launches with hooks go to fallback */
    PyObject *fallback; /* fallback(stream, *values) */
    PyObject *refused;  /* refused(code) raises */
    Py_ssize_t size, count, nslots;
    unsigned char *template;
    Py_ssize_t *offsets;
    ValueSlot *slots;
} PlannedLaunch;

static PyTypeObject PlannedLaunchType;

/* The handle to launch on for ``stream`` (None or an int), when this thread's bound device is
 * the planned one: 1 with *out set, 0 (no exception set) when fallback must take the call.
 * ``known``: this thread's attributes when the caller read them already (borrowed), or NULL. */
static int planned_stream(PlannedLaunch *self, PyObject *stream, PyObject *known, void **out)
{
    PyObject *attributes = known != NULL ? Py_NewRef(known) : thread_attributes(self->thread);
    PyObject *index = attributes == NULL ? NULL : bound_device(attributes);
    long bound = index == NULL ? -1 : PyLong_AsLong(index);
    int fits = index != NULL && bound == self->index;
    PyObject *handle = NULL;
    if (fits && stream == Py_None) {
        handle = current_stream(attributes, index);
    } else if (fits && PyLong_CheckExact(stream)) {
        handle = Py_NewRef(stream);
    }
    Py_XDECREF(attributes);
    int done = handle != NULL && as_pointer(handle, out) == 0;
    Py_XDECREF(handle);
    return done ? 1 : unsupported();
}

/* The values into ``buffer`` (the template already copied there): 1, or 0 (no exception set)
 * for one that does not pack. */
static int pack_values(PlannedLaunch *self, PyObject *const *values, unsigned char *buffer)
{
    for (Py_ssize_t i = 0; i < self->nslots; i++) {
        ValueSlot slot = self->slots[i];
        PyObject *value = values[i];
        unsigned char *at = buffer + slot.offset;
        int packed;
        if (slot.code == 's') {
            packed = PyBytes_CheckExact(value) && PyBytes_GET_SIZE(value) == slot.size;
            if (packed) {
                memcpy(at, PyBytes_AS_STRING(value), (size_t)slot.size);
            }
        } else if (slot.code == 'P') {
            packed = value == Py_None || PyLong_CheckExact(value);
            unsigned long long address = 0;
            if (packed && value != Py_None) {
                address = PyLong_AsUnsignedLongLong(value);
                packed = !(address == (unsigned long long)-1 && PyErr_Occurred());
            }
            memcpy(at, &address, sizeof address);
        } else if (slot.code == 'f' || slot.code == 'd' || slot.code == 'e') {
            packed = pack_float(slot.code, value, at);
        } else {
            packed = pack_integer(slot.code, value, at);
        }
        if (!packed) {
            return unsupported();
        }
    }
    return 1;
}

/* The driver call with the GIL released: cuLaunchKernel, or cuLaunchKernelEx for a cluster
 * or a cooperative launch. */
static int planned_driver(PlannedLaunch *self, void *stream, void **params)
{
    if (self->launch_ex == NULL) {
        return call_driver(self->launcher, self->grid, self->block, self->shared_mem, stream,
                           params);
    }
    LaunchConfigEx config;
    memset(&config, 0, sizeof config);
    memcpy(config.grid, self->grid, sizeof config.grid);
    memcpy(config.block, self->block, sizeof config.block);
    config.shared_mem = self->shared_mem;
    config.stream = stream;
    config.attributes = self->attributes;
    config.count = self->nattributes;
    void *function = (void *)(uintptr_t)self->launcher->function;
    int result;
    Py_BEGIN_ALLOW_THREADS
    result = self->launch_ex(&config, function, params, NULL);
    Py_END_ALLOW_THREADS
    return result;
}

static PyObject *planned_call(PyObject *callable, PyObject *const *args, size_t nargsf,
                              PyObject *kwnames)
{
    PlannedLaunch *self = (PlannedLaunch *)callable;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs != 1 + self->nslots || (kwnames != NULL && PyTuple_GET_SIZE(kwnames))) {
        PyErr_Format(PyExc_TypeError, "this planned launch takes (stream, %zd values), got %zd "
                     "positional arguments", self->nslots, nargs);
        return NULL;
    }
    _Alignas(16) unsigned char buffer[MAX_PARAM_BYTES];
    void *pointers[MAX_PARAMS];
    void *stream;
    if (PyList_GET_SIZE(self->hooks) != 0 || !planned_stream(self, args[0], NULL, &stream)) {
        return PyObject_Vectorcall(self->fallback, args, nargs, NULL);
    }
    memcpy(buffer, self->template, (size_t)self->size);
    if (!pack_values(self, args + 1, buffer)) {
        return PyObject_Vectorcall(self->fallback, args, nargs, NULL);
    }
    for (Py_ssize_t i = 0; i < self->count; i++) {
        pointers[i] = buffer + self->offsets[i];
    }
    int result = planned_driver(self, stream, pointers);
    if (result == 0) {
        Py_RETURN_NONE;
    }
    PyObject *code = PyLong_FromLong(result);
    if (code == NULL) {
        return NULL;
    }
    PyObject *refused = PyObject_CallOneArg(self->refused, code);
    Py_DECREF(code);
    return refused;
}

/* The launch of ``callable`` on the current stream with the addresses as its values, for the
 * Dispatcher (_claunch_dispatch.c): 1 when launched, -1 with an exception set when the driver
 * refused it, 0 (nothing done) where ``callable`` is not a PlannedLaunch whose values are all
 * pointers, or where it would take the call to its fallback (the caller then calls it). */
int planned_launch_addresses(PyObject *callable, const unsigned long long *addresses,
                             Py_ssize_t count, PyObject *attributes)
{
    if (!Py_IS_TYPE(callable, &PlannedLaunchType)) {
        return 0;
    }
    PlannedLaunch *self = (PlannedLaunch *)callable;
    void *stream;
    if (count != self->nslots || PyList_GET_SIZE(self->hooks) != 0) {
        return 0;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        if (self->slots[i].code != 'P') {
            return 0;
        }
    }
    if (!planned_stream(self, Py_None, attributes, &stream)) {
        return 0;
    }
    _Alignas(16) unsigned char buffer[MAX_PARAM_BYTES];
    void *pointers[MAX_PARAMS];
    memcpy(buffer, self->template, (size_t)self->size);
    for (Py_ssize_t i = 0; i < count; i++) {
        memcpy(buffer + self->slots[i].offset, &addresses[i], sizeof addresses[i]);
    }
    for (Py_ssize_t i = 0; i < self->count; i++) {
        pointers[i] = buffer + self->offsets[i];
    }
    int result = planned_driver(self, stream, pointers);
    if (result == 0) {
        return 1;
    }
    PyObject *code = PyLong_FromLong(result);
    PyObject *refused = code == NULL ? NULL : PyObject_CallOneArg(self->refused, code);
    Py_XDECREF(code);
    Py_XDECREF(refused);
    if (!PyErr_Occurred()) {
        PyErr_Format(PyExc_RuntimeError, "the launch failed with CUresult %d", result);
    }
    return -1;
}

/* ---- construction -------------------------------------------------------------------------- */

/* Three unsigned ints from a 3-tuple of ints. */
static int uint3(PyObject *value, const char *what, unsigned out[3])
{
    if (plain_dims3(value, out) == 1 && PyTuple_Check(value)) {
        return 0;
    }
    if (!PyErr_Occurred()) {
        PyErr_Format(PyExc_TypeError, "%s must be a 3-tuple of ints, got %R", what, value);
    }
    return -1;
}

/* The parameter offsets inside ``size`` bytes (a new array), or NULL with an exception set. */
static Py_ssize_t *read_offsets(PyObject *offsets, Py_ssize_t size)
{
    Py_ssize_t count = PyTuple_GET_SIZE(offsets);
    Py_ssize_t *found = PyMem_Calloc(count ? count : 1, sizeof(Py_ssize_t));
    if (found == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        found[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(offsets, i));
        if (found[i] == -1 && PyErr_Occurred()) {
            break;
        }
        if (found[i] < 0 || found[i] > size) {
            PyErr_Format(PyExc_ValueError, "parameter offset %zd is outside the %zd-byte "
                         "template", found[i], size);
            break;
        }
    }
    if (PyErr_Occurred()) {
        PyMem_Free(found);
        return NULL;
    }
    return found;
}

/* The (offset, code, size) slots inside ``size`` bytes (a new array), or NULL with an
 * exception set. */
static ValueSlot *read_slots(PyObject *slots, Py_ssize_t size)
{
    Py_ssize_t count = PyTuple_GET_SIZE(slots);
    ValueSlot *found = PyMem_Calloc(count ? count : 1, sizeof(ValueSlot));
    if (found == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *item = PyTuple_GET_ITEM(slots, i);
        const char *code;
        Py_ssize_t length, offset, bytes;
        if (!PyTuple_Check(item)) {
            PyErr_Format(PyExc_TypeError, "slot %zd: %R is not (offset, code, size)", i, item);
            break;
        }
        if (!PyArg_ParseTuple(item, "ns#n", &offset, &code, &length, &bytes)) {
            break;
        }
        int known = length == 1 && (*code == 's' ? bytes > 0 : code_size(*code) == bytes);
        /* offset > size - bytes, not offset + bytes > size: that sum overflows (UB) */
        if (!known || offset < 0 || bytes > size || offset > size - bytes) {
            PyErr_Format(PyExc_ValueError, "slot %zd: %R is not an (offset, code, size) inside "
                         "%zd bytes with a code of bBhHiIqQefdPs", i, item, size);
            break;
        }
        found[i] = (ValueSlot){offset, bytes, *code};
    }
    if (PyErr_Occurred()) {
        PyMem_Free(found);
        return NULL;
    }
    return found;
}

static PyObject *planned_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"launcher", "launch_ex", "grid", "block", "shared_mem", "cluster",
                            "attribute", "template", "offsets", "slots", "thread", "index",
                            "hooks", "fallback", "refused", "cooperative", NULL};
    PyObject *launcher, *grid, *block, *cluster, *template, *offsets, *slots, *thread, *hooks,
        *fallback, *refused;
    unsigned long long launch_ex;
    unsigned shared_mem, attribute, cooperative = 0;
    long index;
    if (!PyArg_ParseTupleAndKeywords(
            args, kwargs, "O!KOOIOIO!O!O!OlO!OO|I:PlannedLaunch", names, &LauncherType, &launcher,
            &launch_ex, &grid, &block, &shared_mem, &cluster, &attribute, &PyBytes_Type,
            &template, &PyTuple_Type, &offsets, &PyTuple_Type, &slots, &thread, &index,
            &PyList_Type, &hooks, &fallback, &refused, &cooperative)) {
        return NULL;
    }
    unsigned grid3[3], block3[3], cluster3[3];
    if (uint3(grid, "grid", grid3) < 0 || uint3(block, "block", block3) < 0 ||
        uint3(cluster, "cluster", cluster3) < 0) {
        return NULL;
    }
    Py_ssize_t size = PyBytes_GET_SIZE(template), count = PyTuple_GET_SIZE(offsets);
    if (size > MAX_PARAM_BYTES || count > MAX_PARAMS) {
        PyErr_Format(PyExc_ValueError, "at most %d parameters in %d bytes, got %zd in %zd",
                     MAX_PARAMS, MAX_PARAM_BYTES, count, size);
        return NULL;
    }
    if (!PyCallable_Check(fallback) || !PyCallable_Check(refused)) {
        PyErr_SetString(PyExc_TypeError, "fallback and refused must be callable");
        return NULL;
    }
    int clustered = cluster3[0] * cluster3[1] * cluster3[2] != 1;
    if ((clustered || cooperative != 0) && launch_ex == 0) {
        PyErr_SetString(PyExc_ValueError, "a cluster or cooperative launch needs the address "
                                          "of cuLaunchKernelEx");
        return NULL;
    }
    unsigned char *bytes = PyMem_Malloc(size ? size : 1);
    Py_ssize_t *offsets_found = bytes == NULL ? NULL : read_offsets(offsets, size);
    ValueSlot *slots_found = offsets_found == NULL ? NULL : read_slots(slots, size);
    PlannedLaunch *self = slots_found == NULL ? NULL : (PlannedLaunch *)type->tp_alloc(type, 0);
    if (self == NULL) {
        PyMem_Free(bytes);
        PyMem_Free(offsets_found);
        PyMem_Free(slots_found);
        return bytes == NULL ? PyErr_NoMemory() : NULL;
    }
    memcpy(bytes, PyBytes_AS_STRING(template), (size_t)size);
    self->vectorcall = planned_call;
    self->launcher = (Launcher *)Py_NewRef(launcher);
    memset(self->attributes, 0, sizeof self->attributes);
    self->nattributes = 0;
    if (clustered) {
        self->attributes[self->nattributes].id = attribute;
        memcpy(self->attributes[self->nattributes++].value, cluster3, sizeof cluster3);
    }
    if (cooperative != 0) {
        int one = 1;
        self->attributes[self->nattributes].id = cooperative;
        memcpy(self->attributes[self->nattributes++].value, &one, sizeof one);
    }
    self->launch_ex = self->nattributes ? (launch_ex_fn)(uintptr_t)launch_ex : NULL;
    memcpy(self->grid, grid3, sizeof grid3);
    memcpy(self->block, block3, sizeof block3);
    self->shared_mem = shared_mem;
    self->index = index;
    self->thread = Py_NewRef(thread);
    self->hooks = Py_NewRef(hooks);
    self->fallback = Py_NewRef(fallback);
    self->refused = Py_NewRef(refused);
    self->size = size;
    self->count = count;
    self->nslots = PyTuple_GET_SIZE(slots);
    self->template = bytes;
    self->offsets = offsets_found;
    self->slots = slots_found;
    return (PyObject *)self;
}

static int planned_traverse(PlannedLaunch *self, visitproc visit, void *arg)
{
    Py_VISIT(self->launcher);
    Py_VISIT(self->thread);
    Py_VISIT(self->hooks);
    Py_VISIT(self->fallback);
    Py_VISIT(self->refused);
    return 0;
}

static int planned_clear(PlannedLaunch *self)
{
    Py_CLEAR(self->launcher);
    Py_CLEAR(self->thread);
    Py_CLEAR(self->hooks);
    Py_CLEAR(self->fallback);
    Py_CLEAR(self->refused);
    return 0;
}

static void planned_dealloc(PlannedLaunch *self)
{
    PyObject_GC_UnTrack(self);
    planned_clear(self);
    PyMem_Free(self->template);
    PyMem_Free(self->offsets);
    PyMem_Free(self->slots);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *planned_template(PlannedLaunch *self, void *closure)
{
    return PyBytes_FromStringAndSize((const char *)self->template, self->size);
}

static PyGetSetDef planned_getset[] = {
    {"template", (getter)planned_template, NULL, "the parameter buffer packed at plan time",
     NULL},
    {NULL},
};

static PyMemberDef planned_members[] = {
    {"launcher", T_OBJECT, offsetof(PlannedLaunch, launcher), READONLY,
     "the Launcher that makes the driver call"},
    {"fallback", T_OBJECT, offsetof(PlannedLaunch, fallback), READONLY,
     "the Python launch that takes every call this one does not"},
    {NULL},
};

static PyTypeObject PlannedLaunchType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gpurt._launch._claunch.PlannedLaunch",
    .tp_doc = "PlannedLaunch(launcher, launch_ex, grid, block, shared_mem, cluster, attribute, "
              "template, offsets, slots, thread, index, hooks, fallback, refused"
              "[, cooperative]):\n"
              "planned(stream, *values) packs ``values`` into a copy of ``template`` at "
              "``slots`` and launches; every other call goes to ``fallback``.",
    .tp_basicsize = sizeof(PlannedLaunch),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = planned_new,
    .tp_dealloc = (destructor)planned_dealloc,
    .tp_traverse = (traverseproc)planned_traverse,
    .tp_clear = (inquiry)planned_clear,
    .tp_getset = planned_getset,
    .tp_members = planned_members,
    .tp_vectorcall_offset = offsetof(PlannedLaunch, vectorcall),
    .tp_call = PyVectorcall_Call,
};

int claunch_add_planned_launch(PyObject *module)
{
    if (PyType_Ready(&PlannedLaunchType) < 0) {
        return -1;
    }
    return PyModule_AddObjectRef(module, "PlannedLaunch", (PyObject *)&PlannedLaunchType);
}
