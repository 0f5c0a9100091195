/* Dispatcher (gpurt._launch._claunch): a repeated call of a bundled kernel, from its arguments
 * to its launch, in C; and gpurt.asarray of a plain torch tensor.
 *
 * Dispatcher(array_type, thread, alloc, finalizers=None)
 *     dispatcher(table, *items) -> tuple of outputs, or None
 *     dispatcher.key(*items) -> (key, addresses) or None
 *     dispatcher.view(obj) -> Array or None
 *     dispatcher.set_torch(tensor_type, dtypes, strided, raw_stream)
 *
 * ``items`` are a call's ints, None (an output to allocate) and arrays: gpurt Arrays (exactly
 * ``array_type``) and, once set_torch has named torch's tensor type, plain CUDA torch tensors.
 * The key is the one gpurt.nvrtc.plan_key makes (_claunch_signature.c): a torch tensor is keyed
 * as the Array gpurt.asarray would view it (shape, byte strides, dtype.num, address % 16,
 * device), so a plan made for the view is found for the tensor. A tensor is read only where
 * gpurt.asarray's own torch path (gpurt/_array/interop.py's torch_fields) takes it as it is: a
 * dense CUDA tensor with at least one element, of a dtype in ``dtypes`` (torch dtype -> (num,
 * itemsize[, numpy dtype]); no complex dtypes, so no conjugate bit), needing no gradient, not
 * negated, whose device's current torch stream (``raw_stream(index)``) is this thread's
 * current gpurt stream there (so nothing needs ordering).
 *
 * ``table`` maps keys to entries (launch, order, outputs, allocs[, layouts]): ``outputs`` are
 * the item positions of the outputs, ``allocs`` for each the arguments of ``alloc(*args)``
 * (gpurt.empty) that makes it when its item is None; ``launch(None, *addresses)`` (a planned
 * launch on the current stream) gets the addresses of the items at the positions in ``order``.
 * A call returns the outputs (the given objects, or the new Arrays). None, with nothing done,
 * when an item is of another kind or the key is not in the table: the caller then takes the
 * call the general way (which explains every error).
 *
 * With ``finalizers`` (gpurt/_array/ownership.py's FINALIZERS) and an array_type whose slots
 * are gpurt.Array's, the dispatcher also makes Arrays itself, filling their slots as
 * gpurt/array.py's _make does: an output whose ``layouts`` entry is (index, shape, strides,
 * dtype, nbytes), where this thread's place (gpurt/_core/state.py's ``place``) is device
 * ``index``'s, is gpurt.empty's body in C (the place's malloc, the Array, the place's finalizer
 * in FINALIZERS); ``view`` is gpurt.asarray of a tensor on the place's device (its Device and
 * Stream, the tensor as owner). Elsewhere alloc makes the outputs and view returns None.
 */
#include "_claunch_dispatch.h"

#define MAX_ITEMS 32

static const char *const field_names[N_FIELDS] = {"ptr", "shape", "strides", "dtype", "device",
                                                  "stream", "_owner", "_contiguous"};
static PyObject *str_ptr, *str_place;

PyObject *attributes_of(Dispatcher *self, Reading *reading)
{
    if (reading->attributes == NULL) {
        reading->attributes = thread_attributes(self->thread);
        PyErr_Clear();
    }
    return reading->attributes;
}

PyObject *place_of(Dispatcher *self, Reading *reading, long long index)
{
    PyObject *attributes = attributes_of(self, reading);
    PyObject *place = attributes == NULL ? NULL
                                         : PyDict_GetItemWithError(attributes, str_place);
    if (place == NULL || !PyTuple_CheckExact(place) || PyTuple_GET_SIZE(place) != 6 ||
        !PyLong_CheckExact(PyTuple_GET_ITEM(place, 0)) ||
        PyLong_AsLongLong(PyTuple_GET_ITEM(place, 0)) != index) {
        PyErr_Clear();
        return NULL;
    }
    return place;
}


/* The key of ``items`` into ``key`` (a new bytes object) and each item's address (0 for ints
 * and None): 1, or 0 (no exception set) where an item cannot be keyed here. */
static int make_key(Dispatcher *self, Reading *reading, PyObject *const *items,
                    Py_ssize_t count, unsigned long long *addresses, PyObject **key)
{
    long long words[MAX_WORDS];
    Py_ssize_t used = 0;
    long long streamed = -1; /* the device whose streams a tensor of this call matched */
    if (count > MAX_ITEMS) {
        return 0;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *item = items[i];
        PyObject *type = (PyObject *)Py_TYPE(item);
        Py_ssize_t added = scalar_words(item, words + used, MAX_WORDS - used);
        addresses[i] = 0;
        if (added == 0 && type == self->array_type) {
            added = array_words(item, words + used, MAX_WORDS - used, &addresses[i]);
        } else if (added == 0 && type == self->tensor_type) { /* NULL before set_torch */
            PyObject *entry = NULL;
            added = tensor_words(self, reading, item, words + used, MAX_WORDS - used,
                                 &addresses[i], &streamed, &entry);
            Py_XDECREF(entry);
        } else if (added == 0) {
            added = -1;
        }
        if (added < 0) {
            return unsupported();
        }
        used += added;
    }
    *key = PyBytes_FromStringAndSize((const char *)words, used * (Py_ssize_t)sizeof(long long));
    return *key == NULL ? -1 : 1;
}

/* An item position from a table entry's tuple: 0..count-1, or -1 with TypeError set. */
static Py_ssize_t position(PyObject *tuple, Py_ssize_t i, Py_ssize_t count)
{
    Py_ssize_t at = PyLong_AsSsize_t(PyTuple_GET_ITEM(tuple, i));
    if (at < 0 || at >= count) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "dispatch table entry: position %R is not an item",
                     PyTuple_GET_ITEM(tuple, i));
        return -1;
    }
    return at;
}

PyObject *new_array(Dispatcher *self, PyObject *const values[N_FIELDS])
{
    PyTypeObject *type = (PyTypeObject *)self->array_type;
    PyObject *array = type->tp_alloc(type, 0);
    for (int i = 0; array != NULL && i < N_FIELDS; i++) {
        *(PyObject **)((char *)array + self->offsets[i]) = Py_NewRef(values[i]);
    }
    return array;
}

/* The output that ``gpurt.empty(shape, dtype, index)`` would make, made here: ``layout`` is
 * (index, shape, strides, dtype, nbytes) of add_dispatch. It takes the block from the
 * allocator's malloc of this thread's place, fills the Array's slots and has the place's
 * finalizer give the block back when the Array dies (FINALIZERS, as gpurt.empty does), so
 * the allocator's statistics are the same as through gpurt.empty. 1 made (``*made`` and
 * ``*address`` set), 0 where the place is not the device's or the layout is not one this
 * makes (the caller calls alloc), -1 with an exception set. */
static int make_output(Dispatcher *self, Reading *reading, PyObject *layout, PyObject **made,
                       unsigned long long *address)
{
    if (self->finalizers == NULL || !PyTuple_CheckExact(layout) ||
        PyTuple_GET_SIZE(layout) != 5 || !PyLong_CheckExact(PyTuple_GET_ITEM(layout, 0)) ||
        !PyLong_CheckExact(PyTuple_GET_ITEM(layout, 4)) ||
        PyObject_IsTrue(PyTuple_GET_ITEM(layout, 4)) != 1) {
        return unsupported(); /* zero bytes have no block: gpurt.empty makes those */
    }
    long long index = PyLong_AsLongLong(PyTuple_GET_ITEM(layout, 0));
    PyObject *place = index < 0 ? NULL : place_of(self, reading, index);
    if (place == NULL) {
        return unsupported();
    }
    Py_INCREF(place); /* malloc runs Python code, which may drop the thread's place */
    PyObject *args[2] = {PyTuple_GET_ITEM(layout, 4), PyTuple_GET_ITEM(place, 1)};
    PyObject *ptr = PyObject_Vectorcall(PyTuple_GET_ITEM(place, 4), args, 2, NULL);
    PyObject *array = NULL;
    if (ptr != NULL && PyLong_Check(ptr)) {
        *address = PyLong_AsUnsignedLongLong(ptr);
        PyObject *values[N_FIELDS] = {ptr, PyTuple_GET_ITEM(layout, 1),
                                      PyTuple_GET_ITEM(layout, 2), PyTuple_GET_ITEM(layout, 3),
                                      PyTuple_GET_ITEM(place, 3), PyTuple_GET_ITEM(place, 2),
                                      Py_None, Py_True};
        array = PyErr_Occurred() ? NULL : new_array(self, values);
    } else if (ptr != NULL) {
        PyErr_SetString(PyExc_TypeError, "the allocator's malloc returned no address");
    }
    PyObject *ref = array == NULL ? NULL : PyWeakref_NewRef(array, PyTuple_GET_ITEM(place, 5));
    if (ref == NULL || PyDict_SetItem(self->finalizers, ref, ptr) < 0) {
        Py_CLEAR(array);
    }
    Py_XDECREF(ref); /* FINALIZERS holds it until it has called back */
    Py_XDECREF(ptr);
    Py_DECREF(place);
    *made = array;
    return array == NULL ? -1 : 1;
}

/* The outputs of ``entry`` (given items, or new arrays made here or by alloc), their addresses
 * written into ``addresses``: a new tuple, or NULL with an exception set. */
static PyObject *outputs(Dispatcher *self, Reading *reading, PyObject *outs, PyObject *allocs,
                         PyObject *layouts, PyObject *const *items, Py_ssize_t count,
                         unsigned long long *addresses)
{
    Py_ssize_t n = PyTuple_GET_SIZE(outs);
    PyObject *result = PyTuple_New(n);
    for (Py_ssize_t i = 0; result != NULL && i < n; i++) {
        Py_ssize_t at = position(outs, i, count);
        PyObject *made = NULL;
        int done = 0;
        if (at >= 0 && items[at] != Py_None) {
            made = Py_NewRef(items[at]);
        } else if (at >= 0 && layouts != NULL) {
            done = make_output(self, reading, PyTuple_GET_ITEM(layouts, i), &made,
                               &addresses[at]);
        }
        if (at >= 0 && items[at] == Py_None && done == 0) {
            PyObject *args = PyTuple_GET_ITEM(allocs, i);
            made = PyTuple_Check(args) ? PyObject_Call(self->alloc, args, NULL) : NULL;
            PyObject *ptr = made == NULL ? NULL : PyObject_GetAttr(made, str_ptr);
            addresses[at] = ptr == NULL ? 0 : PyLong_AsUnsignedLongLong(ptr);
            Py_XDECREF(ptr);
            if (!PyTuple_Check(args) && !PyErr_Occurred()) {
                PyErr_SetString(PyExc_TypeError, "dispatch table entry: allocs must be tuples");
            }
            if (PyErr_Occurred()) {
                Py_CLEAR(made);
            }
        }
        if (made == NULL) {
            Py_CLEAR(result);
            break;
        }
        PyTuple_SET_ITEM(result, i, made);
    }
    return result;
}

/* Run ``entry`` for ``items``: the outputs, or NULL with an exception set. */
static PyObject *run_entry(Dispatcher *self, Reading *reading, PyObject *entry,
                           PyObject *const *items, Py_ssize_t count,
                           unsigned long long *addresses)
{
    Py_ssize_t size = PyTuple_CheckExact(entry) ? PyTuple_GET_SIZE(entry) : 0;
    int valid = size == 4 || size == 5;
    PyObject *launch = valid ? PyTuple_GET_ITEM(entry, 0) : NULL;
    PyObject *order = valid ? PyTuple_GET_ITEM(entry, 1) : NULL;
    PyObject *outs = valid ? PyTuple_GET_ITEM(entry, 2) : NULL;
    PyObject *allocs = valid ? PyTuple_GET_ITEM(entry, 3) : NULL;
    PyObject *layouts = size == 5 ? PyTuple_GET_ITEM(entry, 4) : NULL;
    if (!valid || !PyTuple_CheckExact(order) || !PyTuple_CheckExact(outs) ||
        !PyTuple_CheckExact(allocs) || PyTuple_GET_SIZE(allocs) != PyTuple_GET_SIZE(outs) ||
        (layouts != NULL && (!PyTuple_CheckExact(layouts) ||
                             PyTuple_GET_SIZE(layouts) != PyTuple_GET_SIZE(outs))) ||
        PyTuple_GET_SIZE(order) > MAX_ITEMS * 2) {
        PyErr_SetString(PyExc_TypeError, "dispatch table entries are (launch, order, "
                                         "outputs, allocs[, layouts])");
        return NULL;
    }
    PyObject *result = outputs(self, reading, outs, allocs, layouts, items, count, addresses);
    Py_ssize_t n = PyTuple_GET_SIZE(order);
    unsigned long long values[MAX_ITEMS * 2];
    for (Py_ssize_t i = 0; result != NULL && i < n; i++) {
        Py_ssize_t at = position(order, i, count);
        if (at < 0) {
            Py_CLEAR(result);
            break;
        }
        values[i] = addresses[at];
    }
    int launched = result == NULL ? 0
                                  : planned_launch_addresses(launch, values, n,
                                                             reading->attributes);
    if (launched != 0) { /* launched from here, or refused by the driver */
        if (launched < 0) {
            Py_CLEAR(result);
        }
        return result;
    }
    PyObject *args[MAX_ITEMS * 2 + 1];
    args[0] = Py_None;
    Py_ssize_t made = 0;
    for (; result != NULL && made < n; made++) {
        args[1 + made] = PyLong_FromUnsignedLongLong(values[made]);
        if (args[1 + made] == NULL) {
            Py_CLEAR(result);
            break;
        }
    }
    PyObject *done = result == NULL ? NULL : PyObject_Vectorcall(launch, args, 1 + n, NULL);
    for (Py_ssize_t i = 0; i < made; i++) {
        Py_DECREF(args[1 + i]);
    }
    if (done == NULL) {
        Py_XDECREF(result);
        return NULL;
    }
    Py_DECREF(done);
    return result;
}

static PyObject *dispatch_call(PyObject *callable, PyObject *const *args, size_t nargsf,
                               PyObject *kwnames)
{
    Dispatcher *self = (Dispatcher *)callable;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs < 1 || !PyDict_CheckExact(args[0]) ||
        (kwnames != NULL && PyTuple_GET_SIZE(kwnames))) {
        PyErr_SetString(PyExc_TypeError, "dispatcher(table, *items) takes a dict and items");
        return NULL;
    }
    unsigned long long addresses[MAX_ITEMS];
    PyObject *key = NULL;
    Reading reading = {NULL};
    int keyed = make_key(self, &reading, args + 1, nargs - 1, addresses, &key);
    PyObject *entry = keyed <= 0 ? NULL : PyDict_GetItemWithError(args[0], key);
    Py_XDECREF(key);
    PyObject *result = NULL;
    if (entry != NULL) {
        Py_INCREF(entry); /* alloc runs Python code, which may change the table */
        result = run_entry(self, &reading, entry, args + 1, nargs - 1, addresses);
        Py_DECREF(entry);
    } else if (keyed == 0 || (keyed > 0 && !PyErr_Occurred())) {
        result = Py_NewRef(Py_None); /* not a call this takes, or not planned yet */
    }
    Py_XDECREF(reading.attributes);
    return result;
}

static PyObject *dispatch_key(Dispatcher *self, PyObject *const *args, Py_ssize_t nargs)
{
    unsigned long long addresses[MAX_ITEMS];
    PyObject *key = NULL;
    Reading reading = {NULL};
    int keyed = make_key(self, &reading, args, nargs, addresses, &key);
    Py_XDECREF(reading.attributes);
    if (keyed <= 0) {
        return keyed < 0 ? NULL : Py_NewRef(Py_None);
    }
    PyObject *found = PyTuple_New(nargs);
    for (Py_ssize_t i = 0; found != NULL && i < nargs; i++) {
        PyObject *address = PyLong_FromUnsignedLongLong(addresses[i]);
        if (address == NULL) {
            Py_CLEAR(found);
            break;
        }
        PyTuple_SET_ITEM(found, i, address);
    }
    if (found == NULL) {
        Py_DECREF(key);
        return NULL;
    }
    return Py_BuildValue("(NN)", key, found);
}

static PyObject *dispatch_set_torch(Dispatcher *self, PyObject *args)
{
    PyObject *tensor_type, *dtypes, *strided, *raw_stream;
    if (!PyArg_ParseTuple(args, "O!O!OO:set_torch", &PyType_Type, &tensor_type, &PyDict_Type,
                          &dtypes, &strided, &raw_stream)) {
        return NULL;
    }
    if (!PyCallable_Check(raw_stream)) {
        PyErr_SetString(PyExc_TypeError, "raw_stream must be callable");
        return NULL;
    }
    Py_XSETREF(self->dtypes, Py_NewRef(dtypes));
    Py_XSETREF(self->strided, Py_NewRef(strided));
    Py_XSETREF(self->raw_stream, Py_NewRef(raw_stream));
    Py_XSETREF(self->tensor_type, Py_NewRef(tensor_type)); /* last: it turns the reader on */
    Py_RETURN_NONE;
}

/* dispatcher.view(obj): see the method table. */
static PyObject *dispatch_view(Dispatcher *self, PyObject *obj)
{
    if (self->tensor_type == NULL || (PyObject *)Py_TYPE(obj) != self->tensor_type ||
        self->finalizers == NULL) {
        return Py_NewRef(Py_None);
    }
    Reading reading = {NULL};
    PyObject *array = tensor_view(self, &reading, obj);
    Py_XDECREF(reading.attributes);
    return array;
}

/* The offsets of array_type's slots named in field_names: 1, or 0 where one is not a plain
 * object slot (then outputs come from alloc only). */
static int find_fields(PyObject *array_type, Py_ssize_t offsets[N_FIELDS])
{
    for (int i = 0; i < N_FIELDS; i++) {
        PyObject *descr = PyObject_GetAttrString(array_type, field_names[i]);
        int plain = descr != NULL && Py_IS_TYPE(descr, &PyMemberDescr_Type) &&
                    ((PyMemberDescrObject *)descr)->d_member->type == T_OBJECT_EX;
        offsets[i] = plain ? ((PyMemberDescrObject *)descr)->d_member->offset : -1;
        Py_XDECREF(descr);
        if (!plain) {
            return unsupported();
        }
    }
    return 1;
}

static PyObject *dispatch_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"array_type", "thread", "alloc", "finalizers", NULL};
    PyObject *array_type, *thread, *alloc, *finalizers = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!OO|O!:Dispatcher", names, &PyType_Type,
                                     &array_type, &thread, &alloc, &PyDict_Type,
                                     &finalizers)) {
        return NULL;
    }
    if (!PyCallable_Check(alloc)) {
        PyErr_SetString(PyExc_TypeError, "alloc must be callable");
        return NULL;
    }
    Dispatcher *self = (Dispatcher *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->vectorcall = dispatch_call;
    self->array_type = Py_NewRef(array_type);
    self->thread = Py_NewRef(thread);
    self->alloc = Py_NewRef(alloc);
    if (finalizers != NULL && find_fields(array_type, self->offsets)) {
        self->finalizers = Py_NewRef(finalizers);
    }
    return (PyObject *)self;
}

static int dispatch_traverse(Dispatcher *self, visitproc visit, void *arg)
{
    Py_VISIT(self->array_type);
    Py_VISIT(self->thread);
    Py_VISIT(self->alloc);
    Py_VISIT(self->tensor_type);
    Py_VISIT(self->dtypes);
    Py_VISIT(self->strided);
    Py_VISIT(self->raw_stream);
    Py_VISIT(self->finalizers);
    return 0;
}

static int dispatch_clear(Dispatcher *self)
{
    Py_CLEAR(self->array_type);
    Py_CLEAR(self->thread);
    Py_CLEAR(self->alloc);
    Py_CLEAR(self->tensor_type);
    Py_CLEAR(self->dtypes);
    Py_CLEAR(self->strided);
    Py_CLEAR(self->raw_stream);
    Py_CLEAR(self->finalizers);
    return 0;
}

static void dispatch_dealloc(Dispatcher *self)
{
    PyObject_GC_UnTrack(self);
    dispatch_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef dispatch_methods[] = {
    {"key", (PyCFunction)(void (*)(void))dispatch_key, METH_FASTCALL,
     "key(*items) -> (key, addresses) or None: the plan key of the items and each one's "
     "address (0 for ints and None)"},
    {"view", (PyCFunction)dispatch_view, METH_O,
     "view(obj) -> Array or None: a plain CUDA torch tensor on this thread's current device "
     "and gpurt's current stream there, as the Array gpurt.asarray makes of it (dtypes "
     "entries (num, itemsize, numpy dtype)); None for anything else"},
    {"set_torch", (PyCFunction)dispatch_set_torch, METH_VARARGS,
     "set_torch(tensor_type, dtypes, strided, raw_stream): read plain CUDA torch tensors"},
    {NULL},
};

static PyMemberDef dispatch_members[] = {
    {"tensor_type", T_OBJECT, offsetof(Dispatcher, tensor_type), READONLY,
     "torch.Tensor once set_torch named it, else None"},
    {NULL},
};

static PyTypeObject DispatcherType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gpurt._launch._claunch.Dispatcher",
    .tp_doc = "Dispatcher(array_type, thread, alloc, finalizers=None): dispatcher(table, "
              "*items) runs the "
              "table's entry for the items' plan key and returns the outputs, or None.",
    .tp_basicsize = sizeof(Dispatcher),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = dispatch_new,
    .tp_dealloc = (destructor)dispatch_dealloc,
    .tp_traverse = (traverseproc)dispatch_traverse,
    .tp_clear = (inquiry)dispatch_clear,
    .tp_methods = dispatch_methods,
    .tp_members = dispatch_members,
    .tp_vectorcall_offset = offsetof(Dispatcher, vectorcall),
    .tp_call = PyVectorcall_Call,
};

int claunch_add_dispatcher(PyObject *module)
{
    str_ptr = PyUnicode_InternFromString("ptr");
    str_place = PyUnicode_InternFromString("place");
    if (str_ptr == NULL || str_place == NULL || claunch_torch_names() < 0) {
        return -1;
    }
    if (PyType_Ready(&DispatcherType) < 0) {
        return -1;
    }
    return PyModule_AddObjectRef(module, "Dispatcher", (PyObject *)&DispatcherType);
}
