/* pypoint.c -- reads of one record by offset, from Python in one call (part of the CPython
 * extension logstore._native._records; pyrecords.c is the other part).
 *
 * A read of one record through the general path costs a dozen Python calls around the C decoder.
 * Here the core's ls_point_read (through its address, handed over once by configure(): the core
 * is compiled once, into the cffi module) looks the offset up in a segment's offset index, checks
 * the entry against its batch and decodes the one record, and build_one() makes its Record.
 * point() and point_active() do that for one segment whose state the caller passes in.
 *
 * PointLog does it for a whole log in one call: it holds the log's segments (their base offsets
 * in a C array for the bisect) and, for each segment it has read, what the segment's describe
 * function said of it: its map, size and offset index for a sealed segment, its ls_appender for
 * the active one (whose position and index entries are read at each call), and its ls_point
 * state (the memo of validated batches). The owner drops a PointLog whenever the set of segments
 * changes. A segment's own changes (a new map after growth, sealing, truncation; an index
 * remapped) close the map it was described with, and the next read finds that out by failing to
 * take the map's buffer and describes the segment again; an active segment whose appender no
 * longer writes into the described map is described again too. So a read never follows a
 * pointer into memory that is no longer mapped, and every length it trusts (a sealed size, an
 * index's entries) was checked against the buffer it holds at the call.
 */

#include "pyrecords.h"

/* What point() builds its Record with, and the core's ls_point_read (set once by configure()). */
typedef int (*point_read_fn)(const char *, int64_t, const char *, int64_t, int64_t, int64_t, int64_t,
                             ls_point *);
static struct {
    PyObject *record_type, *ttypes, *no_headers, *headers_fn;
    point_read_fn read;
} point_config;

PyDoc_STRVAR(configure_doc,
"configure(record_type, timestamp_types, no_headers, headers_fn, point_read_address)\n"
"\n"
"Set what point() uses: the Record arguments as for build(), and the address of the cffi\n"
"core's ls_point_read (an int from cffi). Called once, by logstore.pointread at import.");

static PyObject *configure(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 5) {
        PyErr_Format(PyExc_TypeError, "configure() takes 5 arguments (%zd given)", nargs);
        return NULL;
    }
    if (check_record_args(args[0], args[1], args[3]) < 0) {
        return NULL;
    }
    uintptr_t address = arg_address(args[4]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    if (address == 0) {
        PyErr_SetString(PyExc_ValueError, "point_read_address is NULL");
        return NULL;
    }
    Py_INCREF(args[0]);
    Py_INCREF(args[1]);
    Py_INCREF(args[2]);
    Py_INCREF(args[3]);
    Py_XSETREF(point_config.record_type, args[0]);
    Py_XSETREF(point_config.ttypes, args[1]);
    Py_XSETREF(point_config.no_headers, args[2]);
    Py_XSETREF(point_config.headers_fn, args[3]);
    point_config.read = (point_read_fn)address;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(point_doc,
"point(buf, size, index, entries, base_offset, offset, max_offset, state_address)\n"
"\n"
"The Record at or after ``offset`` in a segment, or None when the general read must decide:\n"
"ls_point_read over ``buf[0, size)`` (the segment's bytes; any object with the buffer protocol)\n"
"and ``entries`` offset index entries in ``index`` (a buffer, or None with no entries), with\n"
"the ls_point at ``state_address`` (an int from cffi; its memo and row arrays). Raises\n"
"ValueError when ``size`` or ``entries`` exceed their buffers, or the core refuses the\n"
"arguments. Holds the GIL; the caller serializes calls that share a state.");

/* An int64 argument; once *failed is set (an exception pending), nothing more is converted. */
static int64_t arg_i64(PyObject *arg, int *failed) {
    if (*failed) {
        return 0;
    }
    long long v = PyLong_AsLongLong(arg);
    if (v == -1 && PyErr_Occurred()) {
        *failed = 1;
    }
    return (int64_t)v;
}

static PyObject *point(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 8) {
        PyErr_Format(PyExc_TypeError, "point() takes 8 arguments (%zd given)", nargs);
        return NULL;
    }
    if (point_config.read == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "point() before configure()");
        return NULL;
    }
    int failed = 0;
    int64_t size = arg_i64(args[1], &failed), entries = arg_i64(args[3], &failed);
    int64_t base_offset = arg_i64(args[4], &failed), offset = arg_i64(args[5], &failed);
    int64_t max_offset = arg_i64(args[6], &failed);
    if (failed) {
        return NULL;
    }
    uintptr_t address = arg_address(args[7]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    if (address == 0) {
        PyErr_SetString(PyExc_ValueError, "state_address is NULL");
        return NULL;
    }
    Py_buffer view, index_view = {0};
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    PyObject *result = NULL;
    int have_index = 0;
    if (size < 0 || size > view.len) {
        PyErr_Format(PyExc_ValueError, "size %lld outside the %zd-byte buffer", (long long)size, view.len);
        goto done;
    }
    if (entries > 0) {
        if (PyObject_GetBuffer(args[2], &index_view, PyBUF_SIMPLE) < 0) {
            goto done;
        }
        have_index = 1;
        if (entries > index_view.len / LS_INDEX_ENTRY_SIZE) {
            PyErr_Format(PyExc_ValueError, "%lld index entries do not fit the %zd-byte index", (long long)entries,
                         index_view.len);
            goto done;
        }
    } else if (entries < 0) {
        PyErr_SetString(PyExc_ValueError, "entries is negative");
        goto done;
    }
    ls_point *state = (ls_point *)address;
    int rc = point_config.read((const char *)view.buf, size, have_index ? (const char *)index_view.buf : NULL,
                               entries, base_offset, offset, max_offset, state);
    if (rc < 0) {
        PyErr_Format(PyExc_ValueError, "ls_point_read refused its arguments (%d)", rc);
        goto done;
    }
    if (rc == 0) {
        result = Py_None;
        Py_INCREF(result);
        goto done;
    }
    result = build_one((PyTypeObject *)point_config.record_type, &state->out, 0, args[0], (const char *)view.buf,
                       size, point_config.ttypes, point_config.no_headers, point_config.headers_fn);
done:
    if (have_index) {
        PyBuffer_Release(&index_view);
    }
    PyBuffer_Release(&view);
    return result;
}

PyDoc_STRVAR(point_active_doc,
"point_active(appender_address, state_address, offset, max_offset, buf)\n"
"\n"
"point() for the active segment, whose bytes and offset index entries the ls_appender at\n"
"``appender_address`` describes (its log, position, index and index_entries, read at the\n"
"call). ``buf`` is the segment's map, handed to headers_fn for a record with headers. The\n"
"caller holds the appender alive and serializes this call with appends.");

static PyObject *point_active(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 5) {
        PyErr_Format(PyExc_TypeError, "point_active() takes 5 arguments (%zd given)", nargs);
        return NULL;
    }
    if (point_config.read == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "point_active() before configure()");
        return NULL;
    }
    uintptr_t appender_address = arg_address(args[0]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    uintptr_t state_address = arg_address(args[1]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    int failed = 0;
    int64_t offset = arg_i64(args[2], &failed), max_offset = arg_i64(args[3], &failed);
    if (failed) {
        return NULL;
    }
    if (appender_address == 0 || state_address == 0) {
        PyErr_SetString(PyExc_ValueError, "appender_address and state_address must not be NULL");
        return NULL;
    }
    const ls_appender *a = (const ls_appender *)appender_address;
    ls_point *state = (ls_point *)state_address;
    if (a->position < 0 || a->position > a->log_capacity || a->index_entries < 0 ||
        a->index_entries > a->index_capacity) {
        PyErr_SetString(PyExc_ValueError, "the appender's position or index entries are outside its maps");
        return NULL;
    }
    int rc = point_config.read(a->log, a->position, a->index, a->index_entries, a->base_offset, offset,
                               max_offset, state);
    if (rc < 0) {
        PyErr_Format(PyExc_ValueError, "ls_point_read refused its arguments (%d)", rc);
        return NULL;
    }
    if (rc == 0) {
        Py_RETURN_NONE;
    }
    return build_one((PyTypeObject *)point_config.record_type, &state->out, 0, args[4], a->log,
                     (Py_ssize_t)a->position, point_config.ttypes, point_config.no_headers,
                     point_config.headers_fn);
}


/* ---------------------------------------------------------------------- PointLog */

/* One segment of a PointLog: what describe() said of it (valid while `map` stays open). */
typedef struct {
    PyObject *segment;             /* the segment object, handed to describe() */
    PyObject *keep;                /* describe()'s tuple, NULL until described: keeps the rest alive */
    ls_point *state;
    const ls_appender *appender;   /* the active segment's, else NULL */
    PyObject *map;                 /* the segment's bytes (the buffer protocol) */
    int64_t size;                  /* sealed: bytes of batches in map */
    PyObject *index;               /* sealed: the offset index's bytes (None without entries) */
    int64_t entries;               /* sealed: offset index entries */
    int64_t base_offset;
} point_segment;

typedef struct {
    PyObject_HEAD
    Py_ssize_t n;
    int64_t *bases;                /* ascending: the segments' base offsets */
    point_segment *segments;
    PyObject *describe;
} PointLog;

static void forget(point_segment *s) {
    Py_CLEAR(s->keep);
    s->state = NULL;
    s->appender = NULL;
    s->map = NULL;
    s->index = NULL;
}

/* Ask describe(segment) about s again: 1 when described, 0 when describe() returned None (not
 * readable by this path now), -1 with an exception set. */
static int describe(PointLog *self, point_segment *s) {
    forget(s);
    PyObject *d = PyObject_CallOneArg(self->describe, s->segment);
    if (d == NULL) {
        return -1;
    }
    if (d == Py_None) {
        Py_DECREF(d);
        return 0;
    }
    if (!PyTuple_CheckExact(d) || PyTuple_GET_SIZE(d) != 8) {
        Py_DECREF(d);
        PyErr_SetString(PyExc_TypeError, "describe() must return None or a tuple of 8");
        return -1;
    }
    int failed = 0;
    uintptr_t state = arg_address(PyTuple_GET_ITEM(d, 1));
    uintptr_t appender = PyErr_Occurred() ? 0 : arg_address(PyTuple_GET_ITEM(d, 2));
    if (PyErr_Occurred()) {
        Py_DECREF(d);
        return -1;
    }
    s->size = arg_i64(PyTuple_GET_ITEM(d, 4), &failed);
    s->entries = arg_i64(PyTuple_GET_ITEM(d, 6), &failed);
    s->base_offset = arg_i64(PyTuple_GET_ITEM(d, 7), &failed);
    if (failed) {
        Py_DECREF(d);
        return -1;
    }
    if (state == 0 || s->size < 0 || s->entries < 0) {
        Py_DECREF(d);
        PyErr_SetString(PyExc_ValueError, "describe(): a NULL state, or a negative size or entry count");
        return -1;
    }
    s->keep = d;  /* owns the map, the index and the objects behind both addresses */
    s->state = (ls_point *)state;
    s->appender = (const ls_appender *)appender;
    s->map = PyTuple_GET_ITEM(d, 3);
    s->index = PyTuple_GET_ITEM(d, 5);
    return 1;
}

/* Take s's map (described first when it is not, or when its map was closed since); 1 with
 * *view held, 0 when this path cannot read the segment now, -1 with an exception set. */
static int take_map(PointLog *self, point_segment *s, Py_buffer *view) {
    for (int attempt = 0; attempt < 2; attempt++) {
        if (s->keep == NULL) {
            int rc = describe(self, s);
            if (rc <= 0) {
                return rc;
            }
        }
        if (PyObject_GetBuffer(s->map, view, PyBUF_SIMPLE) == 0) {
            const ls_appender *a = s->appender;
            if (a == NULL ? s->size <= view->len
                          : a->log == (const char *)view->buf && a->log_capacity <= view->len) {
                return 1;
            }
            PyBuffer_Release(view);  /* the appender moved on to another map: describe again */
        } else if (PyErr_ExceptionMatches(PyExc_ValueError)) {
            PyErr_Clear();  /* a closed mmap: the segment was remapped since */
        } else {
            return -1;
        }
        forget(s);
    }
    return 0;
}

PyDoc_STRVAR(pointlog_read_doc,
"read(offset, log_start_offset)\n"
"\n"
"The Record at or after ``offset`` in the segment that would hold it, or None when the general\n"
"read must decide: ``offset`` not an int at or above ``log_start_offset``, the record in a\n"
"later segment, a segment this path cannot read now (describe() returned None), or whatever\n"
"makes ls_point_read decline. Raises what describe() raises, and ValueError when the core\n"
"refuses the arguments. The caller serializes it with every change of the log.");

static PyObject *pointlog_read(PointLog *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "read() takes 2 arguments (%zd given)", nargs);
        return NULL;
    }
    if (point_config.read == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "read() before configure()");
        return NULL;
    }
    if (!PyLong_CheckExact(args[0]) || !PyLong_CheckExact(args[1]) || self->n == 0) {
        Py_RETURN_NONE;
    }
    int overflow = 0;
    long long offset = PyLong_AsLongLongAndOverflow(args[0], &overflow);
    if (overflow || (offset == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    long long start = PyLong_AsLongLongAndOverflow(args[1], &overflow);
    if (overflow || (start == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    if (offset < start || (self->n > 0 && offset < self->bases[0])) {
        Py_RETURN_NONE; /* below the log start, or below the local segments (tiered storage) */
    }
    /* The last segment based at or below offset. */
    Py_ssize_t lo = 0, hi = self->n;
    while (hi - lo > 1) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (self->bases[mid] <= offset) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    point_segment *s = &self->segments[lo];
    Py_buffer view;
    int taken = take_map(self, s, &view);
    if (taken <= 0) {
        return taken < 0 ? NULL : Py_NewRef(Py_None);
    }
    const char *base = (const char *)view.buf;
    int64_t size = s->size;
    int rc;
    const ls_appender *a = s->appender;
    if (a != NULL) {
        if (a->position < 0 || a->position > a->log_capacity || a->index_entries < 0 ||
            a->index_entries > a->index_capacity) {
            PyBuffer_Release(&view);
            PyErr_SetString(PyExc_ValueError, "the appender's position or index entries are outside its maps");
            return NULL;
        }
        size = a->position;
        rc = point_config.read(base, size, a->index, a->index_entries, a->base_offset, offset, -1, s->state);
    } else if (s->entries > 0) {
        Py_buffer index;
        if (PyObject_GetBuffer(s->index, &index, PyBUF_SIMPLE) < 0) {
            PyBuffer_Release(&view);
            return NULL;
        }
        if (s->entries > index.len / LS_INDEX_ENTRY_SIZE) {
            rc = 0;  /* an index trimmed since it was described: the general read, and describe again */
            forget(s);
        } else {
            rc = point_config.read(base, size, (const char *)index.buf, s->entries, s->base_offset, offset, -1,
                                   s->state);
        }
        PyBuffer_Release(&index);
    } else {
        rc = point_config.read(base, size, NULL, 0, s->base_offset, offset, -1, s->state);
    }
    PyObject *result;
    if (rc < 0) {
        PyErr_Format(PyExc_ValueError, "ls_point_read refused its arguments (%d)", rc);
        result = NULL;
    } else if (rc == 0) {
        result = Py_NewRef(Py_None);
    } else {
        /* Held for the call: headers_fn runs Python code, and s is not ours meanwhile. */
        PyObject *keep = Py_NewRef(s->keep);
        result = build_one((PyTypeObject *)point_config.record_type, &s->state->out, 0, s->map, base, size,
                           point_config.ttypes, point_config.no_headers, point_config.headers_fn);
        Py_DECREF(keep);
    }
    PyBuffer_Release(&view);
    return result;
}

static int pointlog_traverse(PointLog *self, visitproc visit, void *arg) {
    Py_VISIT(self->describe);
    for (Py_ssize_t i = 0; i < self->n; i++) {
        Py_VISIT(self->segments[i].segment);
        Py_VISIT(self->segments[i].keep);
    }
    return 0;
}

static int pointlog_clear(PointLog *self) {
    Py_CLEAR(self->describe);
    for (Py_ssize_t i = 0; i < self->n; i++) {
        Py_CLEAR(self->segments[i].segment);
        forget(&self->segments[i]);
    }
    return 0;
}

static void pointlog_dealloc(PointLog *self) {
    PyObject_GC_UnTrack(self);
    pointlog_clear(self);
    PyMem_Free(self->bases);
    PyMem_Free(self->segments);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *pointlog_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *bases, *segments, *describe_fn;
    static char *names[] = {"bases", "segments", "describe", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!O!O:PointLog", names, &PyList_Type, &bases, &PyList_Type,
                                     &segments, &describe_fn)) {
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(bases);
    if (PyList_GET_SIZE(segments) != n) {
        PyErr_SetString(PyExc_ValueError, "bases and segments differ in length");
        return NULL;
    }
    if (!PyCallable_Check(describe_fn)) {
        PyErr_SetString(PyExc_TypeError, "describe must be callable");
        return NULL;
    }
    PointLog *self = (PointLog *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->bases = PyMem_Calloc((size_t)(n > 0 ? n : 1), sizeof *self->bases);
    self->segments = PyMem_Calloc((size_t)(n > 0 ? n : 1), sizeof *self->segments);
    if (self->bases == NULL || self->segments == NULL) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        int overflow = 0;
        long long b = PyLong_AsLongLongAndOverflow(PyList_GET_ITEM(bases, i), &overflow);
        if (overflow || (b == -1 && PyErr_Occurred())) {
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_OverflowError, "a base offset outside int64");
            }
            Py_DECREF(self);
            return NULL;
        }
        if (i > 0 && b <= self->bases[i - 1]) {
            PyErr_SetString(PyExc_ValueError, "base offsets must ascend");
            Py_DECREF(self);
            return NULL;
        }
        self->bases[i] = b;
        self->segments[i].segment = Py_NewRef(PyList_GET_ITEM(segments, i));
        self->n = i + 1;  /* what dealloc clears */
    }
    self->describe = Py_NewRef(describe_fn);
    return (PyObject *)self;
}

static PyMethodDef pointlog_methods[] = {
    {"read", (PyCFunction)(void (*)(void))pointlog_read, METH_FASTCALL, pointlog_read_doc},
    {NULL, NULL, 0, NULL},
};

PyDoc_STRVAR(pointlog_doc,
"PointLog(bases, segments, describe)\n"
"\n"
"Reads of one record by offset over a log's segments (``segments``, a list, in the order of\n"
"``bases``, their ascending base offsets): see read(). ``describe(segment)`` is asked about a\n"
"segment when a read first needs it and again whenever its map was closed since; it returns\n"
"None (not readable by this path now) or ``(keep, state_address, appender_address, map, size,\n"
"index, entries, base_offset)``: the ls_point to use (an int from cffi) and, for the active\n"
"segment, its ls_appender (else 0); the segment's bytes (an mmap); for a sealed segment the\n"
"bytes of batches in it, its offset index's bytes and entries; ``keep`` owns what the addresses\n"
"point into. Drop the PointLog when the set of segments changes. Not thread-safe.");

static PyTypeObject PointLog_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "logstore._native._records.PointLog",
    .tp_basicsize = sizeof(PointLog),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = pointlog_doc,
    .tp_new = pointlog_new,
    .tp_dealloc = (destructor)pointlog_dealloc,
    .tp_traverse = (traverseproc)pointlog_traverse,
    .tp_clear = (inquiry)pointlog_clear,
    .tp_methods = pointlog_methods,
};

PyMethodDef point_methods[] = {
    {"configure", (PyCFunction)(void (*)(void))configure, METH_FASTCALL, configure_doc},
    {"point", (PyCFunction)(void (*)(void))point, METH_FASTCALL, point_doc},
    {"point_active", (PyCFunction)(void (*)(void))point_active, METH_FASTCALL, point_active_doc},
    {NULL, NULL, 0, NULL},
};

int add_point_types(PyObject *module) {
    if (PyType_Ready(&PointLog_Type) < 0) {
        return -1;
    }
    Py_INCREF(&PointLog_Type);
    if (PyModule_AddObject(module, "PointLog", (PyObject *)&PointLog_Type) < 0) {
        Py_DECREF(&PointLog_Type);
        return -1;
    }
    return 0;
}
