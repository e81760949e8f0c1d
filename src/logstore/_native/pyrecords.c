/* pyrecords.c -- Record objects built in C (CPython extension logstore._native._records).
 *
 * The cffi core (batch.c, scan.c) validates batches and decodes their records into the row arrays
 * of an ls_records_out. Turning those rows into Python objects was the read path's remaining
 * per-record cost in Python (a list per column, a slice per key and value, a zip and a tuple per
 * record). This module does that one step in C: for each row it creates the offset and timestamp
 * ints, the key and value bytes (copied out of the caller's buffer) and the Record tuple, and
 * appends it to a list. Reads of one record are pypoint.c's, the other file of this extension.
 * Nothing else lives here: validation, walking and policy stay in the cffi core and in Python.
 * The module is a regular CPython extension beside the cffi one (the way python-zstandard ships
 * both), because cffi cannot create Python objects without a round trip through Python per object.
 *
 * Every position and length is checked against the buffer before bytes are copied, although the
 * decoder that produced them already checked them: this module does not trust its caller.
 */

#include <stddef.h>
#include <string.h>
#include "pyrecords.h"

#define RECORD_FIELDS 6

_Static_assert(sizeof(size_t) == sizeof(uintptr_t), "addresses are passed as size_t");

/* (The unsigned long long conversion is slower: it goes through a byte array.) */
uintptr_t arg_address(PyObject *arg) {
    return (uintptr_t)PyLong_AsSize_t(arg);
}

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

PyObject *build_one(PyTypeObject *record_type, const ls_records_out *out, Py_ssize_t i, PyObject *buf,
                    const char *base, Py_ssize_t size, PyObject *ttypes, PyObject *no_headers,
                    PyObject *headers_fn) {
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

int check_record_args(PyObject *record_type, PyObject *ttypes, PyObject *headers_fn) {
    if (!PyType_Check(record_type) || !PyType_IsSubtype((PyTypeObject *)record_type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "record_type must be a tuple subclass");
        return -1;
    }
    if (!PyTuple_Check(ttypes) || PyTuple_GET_SIZE(ttypes) != 2) {
        PyErr_SetString(PyExc_TypeError, "timestamp_types must be a tuple of two");
        return -1;
    }
    if (!PyCallable_Check(headers_fn)) {
        PyErr_SetString(PyExc_TypeError, "headers_fn must be callable");
        return -1;
    }
    return 0;
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
    if (check_record_args(record_type, ttypes, headers_fn) < 0) {
        return NULL;
    }
    if (!PyList_Check(into)) {
        PyErr_SetString(PyExc_TypeError, "into must be a list");
        return NULL;
    }
    uintptr_t address = arg_address(args[2]);
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

PyDoc_STRVAR(column_doc,
"column(items, nullable)\n"
"\n"
"For the batch encoder: a list or tuple of bytes (and None when ``nullable``) as (data, lens):\n"
"the items concatenated, and their lengths as native int32 (-1 for None). Returns None for\n"
"anything else (another sequence type, another item type, None where not nullable, an item\n"
"over 2 GiB): the caller's general path handles it and names what is wrong.");

static PyObject *column(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "column() takes 2 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *items = args[0];
    int nullable = PyObject_IsTrue(args[1]);
    if (nullable < 0) {
        return NULL;
    }
    if (!PyList_CheckExact(items) && !PyTuple_CheckExact(items)) {
        Py_RETURN_NONE;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(items);
    PyObject **item = PySequence_Fast_ITEMS(items);
    if (n > INT32_MAX) {
        Py_RETURN_NONE;
    }
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (item[i] == Py_None) {
            if (!nullable) {
                Py_RETURN_NONE;
            }
            continue;
        }
        if (!PyBytes_CheckExact(item[i])) {
            Py_RETURN_NONE;
        }
        Py_ssize_t len = PyBytes_GET_SIZE(item[i]);
        if (len > INT32_MAX || total > PY_SSIZE_T_MAX - len) {
            Py_RETURN_NONE;
        }
        total += len;
    }
    PyObject *data = PyBytes_FromStringAndSize(NULL, total);
    PyObject *lens = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(int32_t));
    if (data == NULL || lens == NULL) {
        Py_XDECREF(data);
        Py_XDECREF(lens);
        return NULL;
    }
    /* Allocating two bytes objects runs no Python code (they are not tracked by the cyclic
     * collector, so no collection starts), but the copy checks the items again all the same: a
     * list changed meanwhile would make the sizes above wrong. */
    item = PySequence_Fast_ITEMS(items);
    char *d = PyBytes_AS_STRING(data);
    char *l = PyBytes_AS_STRING(lens);
    Py_ssize_t room = total;
    int changed = PySequence_Fast_GET_SIZE(items) != n;
    for (Py_ssize_t i = 0; i < n && !changed; i++) {
        int32_t len = -1;
        if (item[i] != Py_None) {
            if (!PyBytes_CheckExact(item[i]) || PyBytes_GET_SIZE(item[i]) > room) {
                changed = 1;
                break;
            }
            len = (int32_t)PyBytes_GET_SIZE(item[i]);
            memcpy(d, PyBytes_AS_STRING(item[i]), (size_t)len);
            d += len;
            room -= len;
        } else if (!nullable) {
            changed = 1;
            break;
        }
        memcpy(l + i * (Py_ssize_t)sizeof(int32_t), &len, sizeof len);
    }
    if (changed || room != 0) {
        Py_DECREF(data);
        Py_DECREF(lens);
        Py_RETURN_NONE;
    }
    PyObject *result = PyTuple_Pack(2, data, lens);
    Py_DECREF(data);
    Py_DECREF(lens);
    return result;
}

static PyMethodDef methods[] = {
    {"build", (PyCFunction)(void (*)(void))build, METH_FASTCALL, build_doc},
    {"column", (PyCFunction)(void (*)(void))column, METH_FASTCALL, column_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "logstore._native._records",
    "Record objects built in C from the cffi core's decoded rows.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__records(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) {
        return NULL;
    }
    if (PyModule_AddFunctions(m, point_methods) < 0 || add_point_types(m) < 0 || add_append_types(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
