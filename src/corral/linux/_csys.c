/* corral.linux._csys: the libc calls the standard library lacks (mount, umount2, prctl,
 * prlimit) and raw syscall(2), for corral/linux/_sys.py.
 *
 * The same calls as _sys.py's ctypes functions (its fallback, corral/linux/_sys_ctypes.py),
 * without ctypes: loading `_ctypes` (and libffi), the C types made from it and each
 * function's first call cost `corral run` 0.5 to 3 ms of CPU; this module loads in about
 * 0.15 ms. Built by scripts/setup.sh (gcc, Python's headers); _sys.py uses ctypes when it
 * is not there.
 *
 * Each function returns the call's own result (0 or -1, or prctl's value) and, as ctypes
 * does with use_errno, keeps errno of this thread right after the call for get_errno().
 * The GIL is released around the call, as ctypes releases it.
 *
 * Arguments, checked before the call:
 *   strings: bytes without a NUL inside (ValueError otherwise; ctypes would cut them there)
 *   words:   int (as C would convert it: masked to the unsigned long or long), None for a
 *            NULL pointer, or a writable buffer (a bytearray) for a pointer to its bytes,
 *            held (not resizable) until the call returns
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <limits.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

static _Thread_local int saved_errno;

#define MAX_WORDS 6

/* r = the call `call`, made with the GIL released; errno right after it kept for
 * get_errno() (this thread's). */
#define CALL(r, call)                   \
    do {                                \
        int e_;                         \
        Py_BEGIN_ALLOW_THREADS          \
        (r) = (call);                   \
        e_ = errno;                     \
        Py_END_ALLOW_THREADS            \
        saved_errno = e_;               \
    } while (0)

/* An int argument that fits a C int (OverflowError otherwise). */
static int
as_int(PyObject *o, int *out)
{
    long v = PyLong_AsLong(o);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (v < INT_MIN || v > INT_MAX) {
        PyErr_SetString(PyExc_OverflowError, "does not fit a C int");
        return -1;
    }
    *out = (int)v;
    return 0;
}

/* A string argument: bytes, no NUL inside. */
static const char *
cstring(PyObject *o, const char *what)
{
    if (!PyBytes_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s: bytes expected, not %.80s", what,
                     Py_TYPE(o)->tp_name);
        return NULL;
    }
    if ((size_t)PyBytes_GET_SIZE(o) != strlen(PyBytes_AS_STRING(o))) {
        PyErr_Format(PyExc_ValueError, "%s: embedded NUL byte", what);
        return NULL;
    }
    return PyBytes_AS_STRING(o);
}

/* A word argument into *out; a buffer it takes goes into *view (view->obj set) and must be
 * released by the caller. 0 on success, -1 with an exception set. */
static int
word(PyObject *o, unsigned long *out, Py_buffer *view)
{
    view->obj = NULL;
    if (o == Py_None) {
        *out = 0;
        return 0;
    }
    if (PyLong_Check(o)) {
        unsigned long v = PyLong_AsUnsignedLongMask(o);
        if (v == (unsigned long)-1 && PyErr_Occurred())
            return -1;
        *out = v;
        return 0;
    }
    if (PyObject_CheckBuffer(o)) {
        if (PyObject_GetBuffer(o, view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
            return -1;
        *out = (unsigned long)view->buf;
        return 0;
    }
    PyErr_Format(PyExc_TypeError, "an int, None or a writable buffer expected, not %.80s",
                 Py_TYPE(o)->tp_name);
    return -1;
}

static void
release(Py_buffer *views, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++)
        if (views[i].obj != NULL)
            PyBuffer_Release(&views[i]);
}

/* Up to `max` word arguments (missing ones 0); the number taken, or -1. */
static Py_ssize_t
words(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t max, unsigned long *w,
      Py_buffer *views)
{
    if (nargs > max) {
        PyErr_Format(PyExc_TypeError, "at most %zd arguments, got %zd", max, nargs);
        return -1;
    }
    for (Py_ssize_t i = 0; i < max; i++) {
        w[i] = 0;
        views[i].obj = NULL;
    }
    for (Py_ssize_t i = 0; i < nargs; i++) {
        if (word(args[i], &w[i], &views[i]) < 0) {
            release(views, i);
            return -1;
        }
    }
    return nargs;
}

static PyObject *
csys_mount(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "mount(source, target, fstype, flags, data)");
        return NULL;
    }
    const char *source = cstring(args[0], "source");
    const char *target = source ? cstring(args[1], "target") : NULL;
    const char *fstype = target ? cstring(args[2], "fstype") : NULL;
    if (fstype == NULL)
        return NULL;
    unsigned long flags = PyLong_AsUnsignedLongMask(args[3]);
    if (flags == (unsigned long)-1 && PyErr_Occurred())
        return NULL;
    const char *data = cstring(args[4], "data");
    if (data == NULL)
        return NULL;
    int r;
    CALL(r, mount(source, target, fstype, flags, data));
    return PyLong_FromLong(r);
}

static PyObject *
csys_umount2(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "umount2(target, flags)");
        return NULL;
    }
    const char *target = cstring(args[0], "target");
    if (target == NULL)
        return NULL;
    int flags;
    if (as_int(args[1], &flags) < 0)
        return NULL;
    int r;
    CALL(r, umount2(target, flags));
    return PyLong_FromLong(r);
}

static PyObject *
csys_prctl(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1) {
        PyErr_SetString(PyExc_TypeError, "prctl(option, [arg2, arg3, arg4, arg5])");
        return NULL;
    }
    int option;
    if (as_int(args[0], &option) < 0)
        return NULL;
    unsigned long w[4];
    Py_buffer views[4];
    Py_ssize_t n = words(args + 1, nargs - 1, 4, w, views);
    if (n < 0)
        return NULL;
    int r;
    CALL(r, prctl(option, w[0], w[1], w[2], w[3]));
    release(views, n);
    return PyLong_FromLong(r);
}

static PyObject *
csys_prlimit(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "prlimit(pid, resource, soft, hard)");
        return NULL;
    }
    int pid, resource;
    if (as_int(args[0], &pid) < 0 || as_int(args[1], &resource) < 0)
        return NULL;
    struct rlimit64 lim;
    lim.rlim_cur = PyLong_AsUnsignedLongLong(args[2]);   /* OverflowError: negative, > 2**64 */
    if (lim.rlim_cur == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    lim.rlim_max = PyLong_AsUnsignedLongLong(args[3]);
    if (lim.rlim_max == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    int r;
    CALL(r, prlimit64(pid, resource, &lim, NULL));
    return PyLong_FromLong(r);
}

static PyObject *
csys_syscall(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1) {
        PyErr_SetString(PyExc_TypeError, "syscall(number, [up to 6 arguments])");
        return NULL;
    }
    long nr = PyLong_AsLong(args[0]);
    if (nr == -1 && PyErr_Occurred())
        return NULL;
    unsigned long w[MAX_WORDS];
    Py_buffer views[MAX_WORDS];
    Py_ssize_t n = words(args + 1, nargs - 1, MAX_WORDS, w, views);
    if (n < 0)
        return NULL;
    long r;
    CALL(r, syscall(nr, w[0], w[1], w[2], w[3], w[4], w[5]));
    release(views, n);
    return PyLong_FromLong(r);
}

static PyObject *
csys_get_errno(PyObject *self, PyObject *unused)
{
    return PyLong_FromLong(saved_errno);
}

static PyMethodDef methods[] = {
    {"mount", (PyCFunction)(void (*)(void))csys_mount, METH_FASTCALL,
     "mount(source, target, fstype, flags, data) -> 0 or -1 (get_errno())"},
    {"umount2", (PyCFunction)(void (*)(void))csys_umount2, METH_FASTCALL,
     "umount2(target, flags) -> 0 or -1 (get_errno())"},
    {"prctl", (PyCFunction)(void (*)(void))csys_prctl, METH_FASTCALL,
     "prctl(option, [arg2, arg3, arg4, arg5]) -> prctl's result"},
    {"prlimit", (PyCFunction)(void (*)(void))csys_prlimit, METH_FASTCALL,
     "prlimit(pid, resource, soft, hard) -> 0 or -1 (get_errno())"},
    {"syscall", (PyCFunction)(void (*)(void))csys_syscall, METH_FASTCALL,
     "syscall(number, [up to 6 arguments]) -> the syscall's result"},
    {"get_errno", csys_get_errno, METH_NOARGS,
     "this thread's errno right after its last call of this module"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "corral.linux._csys",
    .m_doc = "libc calls for corral.linux._sys (see _csys.c)",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC
PyInit__csys(void)
{
    return PyModule_Create(&module);
}
