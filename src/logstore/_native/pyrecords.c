/* pyrecords.c -- Record objects built in C (CPython extension logstore._native._records).
 *
 * The cffi core (batch.c, scan.c) validates batches and decodes their records into the row arrays
 * of an ls_records_out. Turning those rows into Python objects was the read path's remaining
 * per-record cost in Python (a list per column, a slice per key and value, a zip and a tuple per
 * record). This module does that one step in C: for each row it creates the offset and timestamp
 * ints, the key and value bytes (copied out of the caller's buffer) and the Record tuple, and
 * appends it to a list. Nothing else lives here: validation, walking and policy stay in the cffi
 * core and in Python. The module is a regular CPython extension beside the cffi one (the way
 * python-zstandard ships both), because cffi cannot create Python objects without a round trip
 * through Python per object.
 *
 * Every position and length is checked against the buffer before bytes are copied, although the
 * decoder that produced them already checked them: this module does not trust its caller.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stddef.h>
#include "logstore.h"

#define RECORD_FIELDS 6

/* The bytes of buf[pos, pos + len), None for len -1, or NULL with ValueError for a span that is
 * not inside the buffer. */
static PyObject *span_bytes(const char *base, Py_ssize_t size, int32_t pos, int32_t len) {
    if (len == -1) {
        Py_RETURN_NONE;
    }
    if (len < 0 || pos < 0 || (Py_ssize_t)pos > size || (Py_ssize_t)len > size - (Py_ssize_t)pos) {
        PyErr_Format(PyExc_ValueError, "record span [%d, %d + %d) lies outside the %zd-byte buffer",
                     (int)pos, (int)pos, (int)len, size);
        return NULL;
    }
    return PyBytes_FromStringAndSize(base + pos, len);
}

/* One Record for row i, or NULL with an exception set. */
static PyObject *build_one(PyTypeObject *record_type, const ls_records_out *out, Py_ssize_t i,
                           PyObject *buf, const char *base, Py_ssize_t size, PyObject *ttypes,
                           PyObject *no_headers, PyObject *headers_fn) {
    PyObject *fields[RECORD_FIELDS] = {NULL};
    fields[0] = PyLong_FromLongLong(out->offsets[i]);
    fields[1] = PyLong_FromLongLong(out->timestamps[i]);
    if (fields[0] == NULL || fields[1] == NULL) {
        goto fail;
    }
    fields[2] = PyTuple_GET_ITEM(ttypes, out->timestamp_types[i] != 0);
    Py_INCREF(fields[2]);
    fields[3] = span_bytes(base, size, out->key_pos[i], out->key_len[i]);
    if (fields[3] == NULL) {
        goto fail;
    }
    fields[4] = span_bytes(base, size, out->value_pos[i], out->value_len[i]);
    if (fields[4] == NULL) {
        goto fail;
    }
    if (out->header_count[i] == 0) {
        fields[5] = no_headers;
        Py_INCREF(no_headers);
    } else {
        fields[5] = PyObject_CallFunction(headers_fn, "Oiii", buf, (int)out->headers_pos[i],
                                          (int)out->headers_len[i], (int)out->header_count[i]);
        if (fields[5] == NULL) {
            goto fail;
        }
    }
    PyObject *record = record_type->tp_alloc(record_type, RECORD_FIELDS);
    if (record == NULL) {
        goto fail;
    }
    for (int f = 0; f < RECORD_FIELDS; f++) {
        PyTuple_SET_ITEM(record, f, fields[f]);  /* steals the reference */
    }
    if (fields[5] == no_headers) {
        /* Ints, bytes or None, a timestamp type (a module constant) and the shared read-only
         * empty headers list: such a Record cannot be part of a reference cycle, so the cyclic
         * collector need not track it. Tracked, every read of a million records paid for
         * collections that traversed records which could never be garbage in a cycle (CPython
         * untracks such tuples itself only for atomic items, which these are not by type). */
        PyObject_GC_UnTrack(record);
    }
    return record;
fail:
    for (int f = 0; f < RECORD_FIELDS; f++) {
        Py_XDECREF(fields[f]);
    }
    return NULL;
}

PyDoc_STRVAR(build_doc,
"build(record_type, buf, out_address, n, timestamp_types, no_headers, headers_fn, into)\n"
"\n"
"Append to the list ``into`` one ``record_type`` (a tuple subclass of six fields: offset,\n"
"timestamp, timestamp type, key, value, headers) for each of the first ``n`` rows of the\n"
"ls_records_out at address ``out_address`` (an int from cffi). Keys and values are copied from\n"
"``buf`` (any object with the buffer protocol; the rows' positions are positions in it).\n"
"``timestamp_types`` is a pair (CreateTime, LogAppendTime) of the objects to use; a row without\n"
"headers gets ``no_headers`` itself, one with headers ``headers_fn(buf, position, length,\n"
"count)``. Raises ValueError for a span outside ``buf`` or n beyond the rows' capacity; the\n"
"records appended before an error stay in ``into``. Holds the GIL (it creates objects).");

static PyObject *build(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 8) {
        PyErr_Format(PyExc_TypeError, "build() takes 8 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *record_type = args[0], *buf = args[1], *ttypes = args[4];
    PyObject *no_headers = args[5], *headers_fn = args[6], *into = args[7];
    if (!PyType_Check(record_type) || !PyType_IsSubtype((PyTypeObject *)record_type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "record_type must be a tuple subclass");
        return NULL;
    }
    if (!PyTuple_Check(ttypes) || PyTuple_GET_SIZE(ttypes) != 2) {
        PyErr_SetString(PyExc_TypeError, "timestamp_types must be a tuple of two");
        return NULL;
    }
    if (!PyList_Check(into)) {
        PyErr_SetString(PyExc_TypeError, "into must be a list");
        return NULL;
    }
    if (!PyCallable_Check(headers_fn)) {
        PyErr_SetString(PyExc_TypeError, "headers_fn must be callable");
        return NULL;
    }
    uintptr_t address = (uintptr_t)PyLong_AsUnsignedLongLong(args[2]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    Py_ssize_t n = PyLong_AsSsize_t(args[3]);
    if (n == -1 && PyErr_Occurred()) {
        return NULL;
    }
    const ls_records_out *out = (const ls_records_out *)address;
    if (out == NULL || n < 0 || n > out->capacity) {
        PyErr_Format(PyExc_ValueError, "row count %zd outside the rows' capacity", n);
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    PyObject *result = Py_None;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *record = build_one((PyTypeObject *)record_type, out, i, buf, (const char *)view.buf,
                                     view.len, ttypes, no_headers, headers_fn);
        if (record == NULL) {
            result = NULL;
            break;
        }
        int rc = PyList_Append(into, record);
        Py_DECREF(record);
        if (rc < 0) {
            result = NULL;
            break;
        }
    }
    PyBuffer_Release(&view);
    Py_XINCREF(result);
    return result;
}

static PyMethodDef methods[] = {
    {"build", (PyCFunction)(void (*)(void))build, METH_FASTCALL, build_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "logstore._native._records",
    "Record objects built in C from the cffi core's decoded rows.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__records(void) {
    return PyModule_Create(&module);
}
