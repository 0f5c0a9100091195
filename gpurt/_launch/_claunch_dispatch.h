/* _claunch_dispatch.h: what the Dispatcher's two files share (_claunch_dispatch.c: the type,
 * keys, outputs and launch; _claunch_torch.c: reading plain CUDA torch tensors). Private to
 * the extension, like _claunch.h.
 */
#ifndef GPURT_CLAUNCH_DISPATCH_H
#define GPURT_CLAUNCH_DISPATCH_H

#include "_claunch.h"

/* The slots of a gpurt Array (gpurt/array.py), in the order new_array fills them. */
enum { F_PTR, F_SHAPE, F_STRIDES, F_DTYPE, F_DEVICE, F_STREAM, F_OWNER, F_CONTIGUOUS, N_FIELDS };

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *array_type;
    PyObject *thread;      /* gpurt._core.state.THREAD */
    PyObject *alloc;       /* gpurt.empty */
    PyObject *tensor_type; /* torch.Tensor once set, else NULL */
    PyObject *dtypes;      /* torch dtype -> (num, itemsize[, numpy dtype]) */
    PyObject *strided;     /* torch.strided */
    PyObject *raw_stream;  /* torch._C._cuda_getCurrentRawStream */
    PyObject *finalizers;  /* gpurt/_array/ownership.py's FINALIZERS, or NULL: alloc only */
    Py_ssize_t offsets[N_FIELDS]; /* of array_type's slots (see new_array) */
} Dispatcher;

/* What one call read of this thread's state, read once and only when needed: the thread's
 * attribute dict (gpurt/_core/state.py's THREAD), NULL before the first read. */
typedef struct {
    PyObject *attributes;
} Reading;

/* This thread's attributes (borrowed from ``reading``), or NULL (no exception set). */
CLAUNCH_INTERNAL PyObject *attributes_of(Dispatcher *self, Reading *reading);
/* This thread's place (gpurt/_array/ownership.py: index, handle, Stream, Device, malloc,
 * release) when it is device ``index``'s (borrowed from the thread's attributes), else NULL
 * (no exception set). */
CLAUNCH_INTERNAL PyObject *place_of(Dispatcher *self, Reading *reading, long long index);
/* A new Array of array_type with the slots ``values`` (in the F_ order), as gpurt/array.py's
 * _make fills one: a new reference, or NULL with an exception set. */
CLAUNCH_INTERNAL PyObject *new_array(Dispatcher *self, PyObject *const values[N_FIELDS]);

/* _claunch_torch.c: a plain CUDA torch tensor's plan-key words (see tensor_words there), and
 * its Array (tensor_view); claunch_torch_names interns the accessor names (0, or -1). */
CLAUNCH_INTERNAL Py_ssize_t tensor_words(Dispatcher *self, Reading *reading, PyObject *tensor,
                                         long long *words, Py_ssize_t room,
                                         unsigned long long *address, long long *streamed,
                                         PyObject **found);
CLAUNCH_INTERNAL PyObject *tensor_view(Dispatcher *self, Reading *reading, PyObject *tensor);
CLAUNCH_INTERNAL int claunch_torch_names(void);

#endif /* GPURT_CLAUNCH_DISPATCH_H */
