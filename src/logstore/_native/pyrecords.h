/* pyrecords.h -- what the source files of the _records extension share: pyrecords.c (Record
 * objects from decoded rows, the encoder's columns), pypoint.c (reads of one record) and
 * pyappend.c (appends of one record). Internal to the extension: nothing here is part of the
 * cffi core or of logstore.h. */

#ifndef LOGSTORE_PYRECORDS_H
#define LOGSTORE_PYRECORDS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include "logstore.h"

/* Shared between the two files of one shared object, and invisible outside it. */
#define LSR_INTERNAL __attribute__((visibility("hidden")))

/* An address from cffi (an int): OverflowError for a negative one or one too large. */
LSR_INTERNAL uintptr_t arg_address(PyObject *arg);

/* 0 when the Record arguments are usable, else -1 with TypeError set. */
LSR_INTERNAL int check_record_args(PyObject *record_type, PyObject *ttypes, PyObject *headers_fn);

/* One Record for row i of `out`, its key and value copied from base[0, size) (the bytes of
 * `buf`, which headers_fn receives for a row with headers), or NULL with an exception set. */
LSR_INTERNAL PyObject *build_one(PyTypeObject *record_type, const ls_records_out *out, Py_ssize_t i,
                                 PyObject *buf, const char *base, Py_ssize_t size, PyObject *ttypes,
                                 PyObject *no_headers, PyObject *headers_fn);

/* pypoint.c's module functions (configure, point, point_active) and its type (PointLog). */
extern LSR_INTERNAL PyMethodDef point_methods[];
LSR_INTERNAL int add_point_types(PyObject *module);

/* pyappend.c's type (RecordAppender). */
LSR_INTERNAL int add_append_types(PyObject *module);

#endif
