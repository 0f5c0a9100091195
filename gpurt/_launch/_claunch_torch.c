/* Reading plain CUDA torch tensors for the Dispatcher (_claunch_dispatch.c, which says which
 * tensors are taken): from the tensor's own accessors, as gpurt/_array/interop.py's
 * torch_fields reads them, never through its array interfaces.
 */
#include "_claunch_dispatch.h"

static PyObject *str_dtype, *str_requires_grad, *str_layout, *str_is_cuda, *str_is_neg,
    *str_get_device, *str_shape, *str_stride, *str_data_ptr;

/* ``owner.name`` is ``expected`` (identity): 1, else 0 (no exception set). */
static int attribute_is(PyObject *owner, PyObject *name, PyObject *expected)
{
    PyObject *value = PyObject_GetAttr(owner, name);
    Py_XDECREF(value);
    return value == expected ? 1 : unsupported();
}

/* ``owner.name()`` as a 64-bit int: 0, or -1 (no exception set). */
static int method_int(PyObject *owner, PyObject *name, long long *out)
{
    return take_word(PyObject_CallMethodNoArgs(owner, name), out);
}

/* Whether torch's current stream on device ``index`` is this thread's current gpurt stream
 * there: 1 or 0 (no exception set). */
static int same_stream(Dispatcher *self, Reading *reading, long long index)
{
    PyObject *number = PyLong_FromLongLong(index);
    PyObject *raw = number == NULL ? NULL : PyObject_CallOneArg(self->raw_stream, number);
    PyObject *attributes = raw == NULL ? NULL : attributes_of(self, reading);
    PyObject *place = attributes == NULL ? NULL : place_of(self, reading, index);
    /* the place holds the current stream's handle; without one, read the thread's streams */
    PyObject *ours = place != NULL ? Py_NewRef(PyTuple_GET_ITEM(place, 1))
                     : attributes == NULL ? NULL
                                          : current_stream(attributes, number);
    int same = ours != NULL && PyLong_Check(raw) && PyLong_Check(ours) &&
               PyObject_RichCompareBool(raw, ours, Py_EQ) == 1;
    Py_XDECREF(number);
    Py_XDECREF(raw);
    Py_XDECREF(ours);
    return same ? 1 : unsupported();
}

/* The words of a plain CUDA torch tensor, keyed as its gpurt view (see the top), and its
 * address: how many words, or -1 (no exception set) where it is not such a tensor. The streams
 * of device ``*streamed`` were compared already in this call; it becomes the tensor's.
 * ``*found`` becomes the tensor's entry in ``dtypes`` (a new reference) when it is one. */
Py_ssize_t tensor_words(Dispatcher *self, Reading *reading, PyObject *tensor, long long *words,
                        Py_ssize_t room, unsigned long long *address, long long *streamed,
                        PyObject **found)
{
    PyObject *dtype = PyObject_GetAttr(tensor, str_dtype);
    PyObject *entry = dtype == NULL ? NULL : PyDict_GetItemWithError(self->dtypes, dtype);
    Py_XDECREF(dtype); /* the dict holds the dtype */
    Py_XINCREF(entry); /* held: the accessors below may run code that replaces the dict */
    long long num = -1, itemsize = -1, index;
    if (entry != NULL && PyTuple_CheckExact(entry) && PyTuple_GET_SIZE(entry) >= 2) {
        num = PyLong_AsLongLong(PyTuple_GET_ITEM(entry, 0));
        itemsize = PyLong_AsLongLong(PyTuple_GET_ITEM(entry, 1));
    }
    if (num < 0 || itemsize <= 0 || PyErr_Occurred() ||
        !attribute_is(tensor, str_is_cuda, Py_True) ||
        !attribute_is(tensor, str_requires_grad, Py_False) ||
        !attribute_is(tensor, str_layout, self->strided) ||
        method_int(tensor, str_is_neg, &index) < 0 || index != 0 ||
        method_int(tensor, str_get_device, &index) < 0 || index < 0) {
        Py_XDECREF(entry);
        unsupported();
        return -1;
    }
    PyObject *shape = PyObject_GetAttr(tensor, str_shape);
    PyObject *stride = shape == NULL ? NULL : PyObject_CallMethodNoArgs(tensor, str_stride);
    Py_ssize_t ndim = shape != NULL && PyTuple_Check(shape) ? PyTuple_GET_SIZE(shape) : -1;
    Py_ssize_t count = 5 + 2 * ndim;
    int ok = stride != NULL && PyTuple_Check(stride) && ndim >= 0 &&
             PyTuple_GET_SIZE(stride) == ndim && count <= room;
    for (Py_ssize_t i = 0; ok && i < ndim; i++) {
        words[2 + i] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, i));
        words[2 + ndim + i] = PyLong_AsLongLong(PyTuple_GET_ITEM(stride, i)) * itemsize;
        ok = !PyErr_Occurred() && words[2 + i] > 0; /* no empty tensors: they have no address */
    }
    Py_XDECREF(shape);
    Py_XDECREF(stride);
    long long ptr;
    if (!ok || method_int(tensor, str_data_ptr, &ptr) < 0 ||
        (index != *streamed && !same_stream(self, reading, index))) {
        Py_DECREF(entry);
        unsupported();
        return -1;
    }
    *found = entry;
    *streamed = index;
    *address = (unsigned long long)ptr;
    words[0] = WORD_ARRAY;
    words[1] = ndim;
    words[2 + 2 * ndim] = num;
    words[3 + 2 * ndim] = (long long)(*address & 15);
    words[4 + 2 * ndim] = index;
    return count;
}

/* ``tensor`` (a plain CUDA torch tensor on this thread's current device, keyed by
 * tensor_words) as the Array gpurt.asarray makes of it, or None (see dispatch_view). */
PyObject *tensor_view(Dispatcher *self, Reading *reading, PyObject *tensor)
{
    long long words[MAX_WORDS];
    unsigned long long address;
    long long streamed = -1;
    PyObject *entry = NULL; /* (num, itemsize, numpy dtype) */
    Py_ssize_t count = tensor_words(self, reading, tensor, words, MAX_WORDS, &address,
                                    &streamed, &entry);
    Py_ssize_t ndim = count < 0 ? 0 : words[1];
    PyObject *place = count < 0 || PyTuple_GET_SIZE(entry) != 3
                          ? NULL
                          : place_of(self, reading, streamed);
    if (place == NULL) {
        Py_XDECREF(entry);
        return Py_NewRef(Py_None);
    }
    Py_INCREF(place); /* held: the allocations below may run code that drops it */
    PyObject *dtype = PyTuple_GET_ITEM(entry, 2);
    PyObject *ptr = PyLong_FromUnsignedLongLong(address);
    PyObject *shape = PyTuple_New(ndim), *strides = PyTuple_New(ndim);
    /* C-contiguous as gpurt/_array/layout.py's is_contiguous: size-1 dims do not count */
    long long step = PyLong_AsLongLong(PyTuple_GET_ITEM(entry, 1));
    int contiguous = 1;
    for (Py_ssize_t i = ndim - 1; shape != NULL && strides != NULL && i >= 0; i--) {
        long long size = words[2 + i], stride = words[2 + ndim + i];
        PyTuple_SET_ITEM(shape, i, PyLong_FromLongLong(size));
        PyTuple_SET_ITEM(strides, i, PyLong_FromLongLong(stride));
        contiguous &= size == 1 || stride == step;
        step *= size;
    }
    PyObject *array = NULL;
    if (ptr != NULL && shape != NULL && strides != NULL && !PyErr_Occurred()) {
        PyObject *values[N_FIELDS] = {ptr, shape, strides, dtype, PyTuple_GET_ITEM(place, 3),
                                      PyTuple_GET_ITEM(place, 2), tensor,
                                      contiguous ? Py_True : Py_False};
        array = new_array(self, values);
    }
    Py_XDECREF(ptr);
    Py_XDECREF(shape);
    Py_XDECREF(strides);
    Py_DECREF(entry);
    Py_DECREF(place);
    return array;
}

int claunch_torch_names(void)
{
    struct {
        PyObject **name;
        const char *text;
    } names[] = {{&str_dtype, "dtype"}, {&str_requires_grad, "requires_grad"},
                 {&str_layout, "layout"}, {&str_is_cuda, "is_cuda"}, {&str_is_neg, "is_neg"},
                 {&str_get_device, "get_device"}, {&str_shape, "shape"},
                 {&str_stride, "stride"}, {&str_data_ptr, "data_ptr"}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        *names[i].name = PyUnicode_InternFromString(names[i].text);
        if (*names[i].name == NULL) {
            return -1;
        }
    }
    return 0;
}
