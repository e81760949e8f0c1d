/* pyappend.c -- the single-record append from Python in one call (part of the CPython extension
 * logstore._native._records; pyrecords.c and pypoint.c are the other parts).
 *
 * Log.append's fast path called the cffi core's ls_appender_append_record with ten arguments,
 * each converted by cffi, and the GIL released and taken back around it: a third of the cost of
 * an append outside the interpreter. A RecordAppender is bound to one ls_appender (an active
 * segment's, or the closed log's placeholder) and calls the core through its address with the
 * three arguments that vary: the timestamp, the key and the value. It holds a reference to the
 * cffi object that owns the struct, so the struct lives as long as the RecordAppender does.
 */

#include <stddef.h>

#include "pyrecords.h"

typedef int64_t (*append_record_fn)(ls_appender *, int64_t, int32_t, const char *, int32_t, const char *,
                                    int32_t, const char *, int32_t, int32_t);

typedef struct {
    PyObject_HEAD
    PyObject *owner;               /* the cffi object that owns *appender */
    ls_appender *appender;
    append_record_fn append;
    vectorcallfunc vectorcall;
} RecordAppender;

/* A key or value argument: None (null) or bytes of at most INT32_MAX bytes. 0, or -1 with an
 * exception set. */
static int record_field(PyObject *arg, const char *what, const char **data, int32_t *len) {
    if (arg == Py_None) {
        *data = NULL;
        *len = -1;
        return 0;
    }
    if (!PyBytes_CheckExact(arg)) {
        PyErr_Format(PyExc_TypeError, "%s must be bytes or None, not %.100s", what, Py_TYPE(arg)->tp_name);
        return -1;
    }
    if (PyBytes_GET_SIZE(arg) > INT32_MAX) {
        PyErr_Format(PyExc_OverflowError, "%s of %zd bytes does not fit a record", what, PyBytes_GET_SIZE(arg));
        return -1;
    }
    *data = PyBytes_AS_STRING(arg);
    *len = (int32_t)PyBytes_GET_SIZE(arg);
    return 0;
}

static PyObject *appender_call(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    RecordAppender *self = (RecordAppender *)callable;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs != 3 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames) > 0)) {
        PyErr_Format(PyExc_TypeError, "RecordAppender takes 3 positional arguments (%zd given)", nargs);
        return NULL;
    }
    long long timestamp = PyLong_AsLongLong(args[0]);
    if (timestamp == -1 && PyErr_Occurred()) {
        return NULL;
    }
    const char *key, *value;
    int32_t key_len, value_len;
    if (record_field(args[1], "key", &key, &key_len) < 0 || record_field(args[2], "value", &value, &value_len) < 0) {
        return NULL;
    }
    /* A small record is appended holding the GIL (releasing it costs more than the copy and CRC).
     * A large one releases it: its copy and CRC take a while, and the first store to a page of
     * the shared map may wait in the kernel (dirty-page throttling), which would stall every
     * thread of the process. Key and value stay alive either way (the caller holds them); the
     * caller (the log's lock) serializes the call with every other use of the appender. */
    int64_t rc;
    if ((int64_t)(key_len > 0 ? key_len : 0) + (value_len > 0 ? value_len : 0) >= 16384) {
        Py_BEGIN_ALLOW_THREADS
        rc = self->append(self->appender, (int64_t)timestamp, 0, key, key_len, value, value_len, NULL, 0, 0);
        Py_END_ALLOW_THREADS
    } else {
        rc = self->append(self->appender, (int64_t)timestamp, 0, key, key_len, value, value_len, NULL, 0, 0);
    }
    return PyLong_FromLongLong((long long)rc);
}

static PyObject *appender_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *owner, *address, *function;
    static char *names[] = {"owner", "address", "function", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO:RecordAppender", names, &owner, &address, &function)) {
        return NULL;
    }
    uintptr_t a = arg_address(address);
    if (PyErr_Occurred()) {
        return NULL;
    }
    uintptr_t f = arg_address(function);
    if (PyErr_Occurred()) {
        return NULL;
    }
    if (a == 0 || f == 0) {
        PyErr_SetString(PyExc_ValueError, "the appender's and the function's addresses must not be NULL");
        return NULL;
    }
    RecordAppender *self = (RecordAppender *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->owner = Py_NewRef(owner);
    self->appender = (ls_appender *)a;
    self->append = (append_record_fn)f;
    self->vectorcall = appender_call;
    return (PyObject *)self;
}

static int appender_traverse(RecordAppender *self, visitproc visit, void *arg) {
    Py_VISIT(self->owner);
    return 0;
}

static int appender_clear(RecordAppender *self) {
    Py_CLEAR(self->owner);
    return 0;
}

static void appender_dealloc(RecordAppender *self) {
    PyObject_GC_UnTrack(self);
    appender_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

PyDoc_STRVAR(appender_doc,
"RecordAppender(owner, address, function)\n"
"\n"
"Appends one record through the ls_appender at ``address`` (an int from cffi; ``owner`` is the\n"
"cffi object that owns the struct, kept alive here) with the core's ls_appender_append_record\n"
"at ``function`` (its address, from cffi). Called as ``appender(timestamp, key, value)`` (key\n"
"and value bytes or None, the timestamp an int64): a record without headers or attributes;\n"
"returns what the core returns, the offset assigned or a negative LS_ERR_ code. Raises TypeError\n"
"or OverflowError for arguments the core cannot take. Holds the GIL during the call. Not\n"
"thread-safe: the caller serializes it with every other use of the appender.");

static PyTypeObject RecordAppender_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "logstore._native._records.RecordAppender",
    .tp_basicsize = sizeof(RecordAppender),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = appender_doc,
    .tp_new = appender_new,
    .tp_dealloc = (destructor)appender_dealloc,
    .tp_traverse = (traverseproc)appender_traverse,
    .tp_clear = (inquiry)appender_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(RecordAppender, vectorcall),
};

int add_append_types(PyObject *module) {
    if (PyType_Ready(&RecordAppender_Type) < 0) {
        return -1;
    }
    Py_INCREF(&RecordAppender_Type);
    if (PyModule_AddObject(module, "RecordAppender", (PyObject *)&RecordAppender_Type) < 0) {
        Py_DECREF(&RecordAppender_Type);
        return -1;
    }
    return 0;
}
