/* _claunch.h: what the C files of gpurt._launch._claunch share (_claunch.c: the module and
 * KernelCall; _claunch_launcher.c: Launcher, the driver call; _claunch_packing.c:
 * PackingLauncher, argument packing). The helpers are static inline, so each file inlines them
 * as the single file did; the few symbols the files share are hidden (CLAUNCH_INTERNAL), so the
 * extension exports PyInit__claunch only. Private to the extension: no stable interface.
 */
#ifndef GPURT_CLAUNCH_H
#define GPURT_CLAUNCH_H

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

/* The largest parameter buffer and parameter count a PackingLauncher packs on the stack; the
 * classic 4 KiB kernel parameter limit. Larger kernels launch through their Python launcher. */
#define MAX_PARAM_BYTES 4096
#define MAX_PARAMS 1024

/* CUresult cuLaunchKernel(CUfunction f, unsigned gridDimX, gridDimY, gridDimZ,
 *     unsigned blockDimX, blockDimY, blockDimZ, unsigned sharedMemBytes, CUstream hStream,
 *     void **kernelParams, void **extra) */
typedef int (*launch_fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                         unsigned, void *, void **, void **);

#if defined(__GNUC__) || defined(__clang__)
#define CLAUNCH_INTERNAL __attribute__((visibility("hidden")))
#else
#define CLAUNCH_INTERNAL
#endif

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    launch_fn launch;
    unsigned long long address;  /* of cuLaunchKernel (read-only attribute) */
    unsigned long long function; /* the CUfunction (read-only attribute) */
    PyObject *dims;              /* dims(value, what) -> (x, y, z) for the other forms */
} Launcher;

extern CLAUNCH_INTERNAL PyTypeObject LauncherType;

/* This thread's view of gpurt/_core/state.py's THREAD (defined in _claunch.c, where KernelCall
 * documents the contract): the thread's attribute dict (a new reference) or NULL; the thread's
 * device index when its context is bound (borrowed from that dict) or NULL; the current stream
 * handle of device ``index`` on the thread (a new reference) or NULL. */
CLAUNCH_INTERNAL PyObject *thread_attributes(PyObject *thread);
CLAUNCH_INTERNAL PyObject *bound_device(PyObject *attributes);
CLAUNCH_INTERNAL PyObject *current_stream(PyObject *attributes, PyObject *index);

/* Add the type Launcher (_claunch_launcher.c), PackingLauncher (_claunch_packing.c),
 * PlannedLaunch (_claunch_planned.c) to ``module``: 0, or -1 with an exception set. */
CLAUNCH_INTERNAL int claunch_add_launcher(PyObject *module);
CLAUNCH_INTERNAL int claunch_add_packing_launcher(PyObject *module);
CLAUNCH_INTERNAL int claunch_add_planned_launch(PyObject *module);
/* Add the function signature (_claunch_signature.c) to ``module``. */
CLAUNCH_INTERNAL int claunch_add_signature(PyObject *module);
/* A PlannedLaunch (_claunch_planned.c) on the current stream with pointer values: 1 launched,
 * -1 with an exception set, 0 when the caller must call it as a Python object. ``attributes``:
 * this thread's attributes (thread_attributes) when the caller read them already, or NULL. */
CLAUNCH_INTERNAL int planned_launch_addresses(PyObject *callable,
                                              const unsigned long long *addresses,
                                              Py_ssize_t count, PyObject *attributes);
/* Add the type Dispatcher (_claunch_dispatch.c) to ``module``. */
CLAUNCH_INTERNAL int claunch_add_dispatcher(PyObject *module);

/* The words of a plan key (_claunch_signature.c): each item led by a word saying what it is;
 * a gpurt Array is WORD_ARRAY, ndim, shape, strides (bytes), dtype.num, address % 16, device
 * index. array_words writes one Array's (and its address): how many words, or -1 where it
 * cannot be described. */
#define MAX_WORDS 256
enum { WORD_INT = 1, WORD_NONE = 2, WORD_ARRAY = 3 };
CLAUNCH_INTERNAL Py_ssize_t array_words(PyObject *array, long long *words, Py_ssize_t room,
                                        unsigned long long *address);

/* The words of an int item (WORD_INT, its value) or None (WORD_NONE) at ``words``, ``room``
 * left: how many, 0 when the item is neither, -1 when it does not fit (an int out of range
 * leaves OverflowError set). */
static inline Py_ssize_t scalar_words(PyObject *item, long long *words, Py_ssize_t room)
{
    if (item == Py_None) {
        if (room < 1) {
            return -1;
        }
        words[0] = WORD_NONE;
        return 1;
    }
    if (!PyLong_Check(item)) {
        return 0;
    }
    if (room < 2) {
        return -1;
    }
    words[0] = WORD_INT;
    words[1] = PyLong_AsLongLong(item);
    return words[1] == -1 && PyErr_Occurred() ? -1 : 2;
}

/* ``value`` (a new reference, or NULL after a failed call; released here) as a 64-bit word:
 * 0, or -1 when it is NULL or not an int that fits (the failed call's exception stays). */
CLAUNCH_INTERNAL int take_word(PyObject *value, long long *out);

/* ---- conversions ------------------------------------------------------------------------- */

/* An unsigned int from a Python int, raising OverflowError out of range and TypeError for
 * anything that is not an int (as the cuda.bindings conversions do). */
static inline int as_uint(PyObject *value, unsigned *out)
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
static inline int as_pointer(PyObject *value, void **out)
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

/* Leave a value to the Python launcher: clear any exception and return 0 (for the functions
 * that return 1 when they took a value and 0 when they leave it, with no exception set). */
static inline int unsupported(void)
{
    PyErr_Clear();
    return 0;
}

/* Grid or block dims given as an int or a 3-tuple of ints: 1 when done, 0 when ``value`` has
 * another form (nothing converted), -1 with an exception set for a value out of range. */
static inline int plain_dims3(PyObject *value, unsigned out[3])
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

/* ---- reading slots ------------------------------------------------------------------------ */

/* One __slots__ attribute of the objects of one type, read straight from the object as its
 * member descriptor does (an attribute read through getattr costs more than the packing of a
 * plain argument); ``offset`` is -1 where the type has no such slot: then getattr reads it. */
typedef struct {
    PyObject *type; /* a strong reference, or NULL before the first look */
    Py_ssize_t offset;
} Slot;

static inline void slot_find(Slot *slot, PyObject *type, PyObject *name)
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
static inline PyObject *slot_get(Slot *slot, PyObject *value, PyObject *name)
{
    if ((PyObject *)Py_TYPE(value) != slot->type) {
        slot_find(slot, (PyObject *)Py_TYPE(value), name);
    }
    if (slot->offset < 0) {
        return PyObject_GetAttr(value, name);
    }
    return Py_XNewRef(*(PyObject **)((char *)value + slot->offset));
}

/* ---- packing ----------------------------------------------------------------------------- */

#if PY_VERSION_HEX < 0x030B0000 /* PyFloat_Pack2/4 became public in Python 3.11 */
#define PyFloat_Pack2(x, p, le) _PyFloat_Pack2((x), (unsigned char *)(p), (le))
#define PyFloat_Pack4(x, p, le) _PyFloat_Pack4((x), (unsigned char *)(p), (le))
#endif

/* The pack_ functions below return 1 when they packed ``value`` and 0 when they leave it to the
 * Python launcher (through unsupported()), with no exception set. */

/* Bytes of a code this module packs, 0 for any other code. */
static inline int code_size(char code)
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
static inline int pack_integer(char code, PyObject *value, unsigned char *at)
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
static inline int pack_float(char code, PyObject *value, unsigned char *at)
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

/* cuLaunchKernel with the GIL released. */
static inline int call_driver(Launcher *self, const unsigned grid[3], const unsigned block[3],
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

#endif /* GPURT_CLAUNCH_H */
