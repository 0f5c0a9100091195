/* signature (gpurt._launch._claunch): the key of a planned call, built without Python objects.
 *
 * signature(array_type, *items) -> bytes or None
 *
 * The bundled kernels cache a plan per call signature (gpurt/_launch/planned.py's plan_key):
 * items are ints (bools included), None, and gpurt Arrays (objects of exactly ``array_type``),
 * each Array standing for its shape, strides, dtype (its ``num``), address modulo 16 and device
 * index. The key is those numbers as 64-bit words in a bytes object, each item led by a word
 * saying what it is, so two keys are equal exactly when the items are; None when an item is
 * of another kind or an int does not fit 64 bits (then the caller keys the call otherwise).
 * A tuple of the same numbers costs several times as much to build, hash and compare.
 */
#include "_claunch.h"


static PyObject *str_shape, *str_strides, *str_dtype, *str_num, *str_ptr, *str_device,
    *str_index; /* attribute names, interned */
/* The Array's slots, and the index of its device, read in place (see slot_get) */
static Slot shape_slot, strides_slot, dtype_slot, ptr_slot, device_slot, index_slot;

int take_word(PyObject *value, long long *out)
{
    int ok = value != NULL && PyLong_Check(value);
    if (ok) {
        *out = PyLong_AsLongLong(value);
        ok = !(*out == -1 && PyErr_Occurred());
    }
    Py_XDECREF(value);
    return ok ? 0 : -1;
}

/* An int attribute ``name`` of ``owner`` as a 64-bit word: 0, or -1 (no exception set) when
 * it is missing or not an int that fits. */
static int int_attribute(PyObject *owner, PyObject *name, long long *out)
{
    return take_word(PyObject_GetAttr(owner, name), out);
}

/* The items of a tuple of ints (shape or strides) as words: 0, or -1 when they do not fit. */
static int int_tuple(PyObject *tuple, Py_ssize_t ndim, long long *words)
{
    if (!PyTuple_Check(tuple) || PyTuple_GET_SIZE(tuple) != ndim) {
        return -1;
    }
    for (Py_ssize_t i = 0; i < ndim; i++) {
        PyObject *item = PyTuple_GET_ITEM(tuple, i);
        if (!PyLong_Check(item)) {
            return -1;
        }
        words[i] = PyLong_AsLongLong(item);
        if (words[i] == -1 && PyErr_Occurred()) {
            return -1;
        }
    }
    return 0;
}

/* The words of one Array at ``words`` (room for ``room``) and its address at ``address``: how
 * many words, or -1 where it cannot be described (too many dimensions, an unreadable field). */
Py_ssize_t array_words(PyObject *array, long long *words, Py_ssize_t room,
                       unsigned long long *address)
{
    PyObject *shape = slot_get(&shape_slot, array, str_shape);
    PyObject *strides = shape == NULL ? NULL : slot_get(&strides_slot, array, str_strides);
    PyObject *dtype = strides == NULL ? NULL : slot_get(&dtype_slot, array, str_dtype);
    PyObject *device = dtype == NULL ? NULL : slot_get(&device_slot, array, str_device);
    Py_ssize_t ndim = shape != NULL && PyTuple_Check(shape) ? PyTuple_GET_SIZE(shape) : -1;
    Py_ssize_t count = 2 + 2 * ndim + 3;
    int ok = device != NULL && ndim >= 0 && count <= room;
    if (ok) {
        words[0] = WORD_ARRAY;
        words[1] = ndim;
        PyObject *ptr = slot_get(&ptr_slot, array, str_ptr); /* unsigned: read masked */
        PyObject *index = slot_get(&index_slot, device, str_index);
        ok = ptr != NULL && PyLong_Check(ptr) && index != NULL && PyLong_Check(index) &&
             int_tuple(shape, ndim, words + 2) == 0 &&
             int_tuple(strides, ndim, words + 2 + ndim) == 0 &&
             int_attribute(dtype, str_num, &words[2 + 2 * ndim]) == 0;
        if (ok) {
            words[4 + 2 * ndim] = PyLong_AsLongLong(index);
            ok = !PyErr_Occurred();
        }
        Py_XDECREF(index);
        if (ok) {
            *address = PyLong_AsUnsignedLongLongMask(ptr);
            words[3 + 2 * ndim] = (long long)(*address & 15);
            ok = !PyErr_Occurred();
        }
        Py_XDECREF(ptr);
    }
    Py_XDECREF(shape);
    Py_XDECREF(strides);
    Py_XDECREF(dtype);
    Py_XDECREF(device);
    return ok ? count : -1;
}

static PyObject *signature(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || !PyType_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "signature(array_type, *items) needs the array type");
        return NULL;
    }
    long long words[MAX_WORDS];
    Py_ssize_t used = 0;
    for (Py_ssize_t i = 1; i < nargs; i++) {
        PyObject *item = args[i];
        Py_ssize_t added = scalar_words(item, words + used, MAX_WORDS - used);
        if (added == 0) {
            unsigned long long address;
            added = (PyObject *)Py_TYPE(item) == args[0]
                        ? array_words(item, words + used, MAX_WORDS - used, &address)
                        : -1;
        }
        if (added < 0) {
            PyErr_Clear();
            Py_RETURN_NONE; /* not a signature this function makes: the caller keys it */
        }
        used += added;
    }
    return PyBytes_FromStringAndSize((const char *)words, used * (Py_ssize_t)sizeof(long long));
}

static PyMethodDef signature_methods[] = {
    {"signature", (PyCFunction)(void (*)(void))signature, METH_FASTCALL,
     "signature(array_type, *items) -> bytes or None: the key of a planned call whose items "
     "are ints, None and arrays of exactly array_type (shape, strides, dtype.num, ptr % 16, "
     "device.index); None for other items."},
    {NULL},
};

int claunch_add_signature(PyObject *module)
{
    struct {
        PyObject **name;
        const char *text;
    } names[] = {{&str_shape, "shape"}, {&str_strides, "strides"}, {&str_dtype, "dtype"},
                 {&str_num, "num"}, {&str_ptr, "ptr"}, {&str_device, "device"},
                 {&str_index, "index"}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        *names[i].name = PyUnicode_InternFromString(names[i].text);
        if (*names[i].name == NULL) {
            return -1;
        }
    }
    return PyModule_AddFunctions(module, signature_methods);
}
