/*
 * TimerFd (store.rpc._native.TimerFd): a Linux timerfd on CLOCK_MONOTONIC, armed at an
 * absolute instant in nanoseconds, for an event loop to watch with loop.add_reader.
 *
 * Why: uvloop (libuv) keeps its timers in whole milliseconds against a clock read at the start
 * of a loop iteration, so a deadline fires up to a millisecond late (store/rpc/aio.py,
 * timer_delay_s). A server's replica has deadlines that sit on a transaction's path: a
 * replication batch closes on a 5 ms grid when a client waits for its commit, and every
 * millisecond it closes late is a millisecond on that client's answer (measured on geo3 at
 * 50 ms: the batch closed 0.43 ms after its deadline on average), and the wan-proxy releases
 * each delayed chunk at its instant. A timerfd fires within the kernel's timer slack of the
 * instant asked, and costs one read when it does. store/rpc/timers.py keeps the deadlines (a
 * heap) and arms this at the earliest.
 *
 * The instants are time.monotonic_ns()'s clock (CLOCK_MONOTONIC on Linux). Arming replaces
 * the previous instant; an instant already past fires at once (the fd is readable on the
 * loop's next poll). clear() reads the expiration count (0 if the fd was not readable) so the
 * fd stops being readable until the next expiry.
 */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <stdint.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    PyObject_HEAD
    int fd; /* -1 once closed */
} TimerFdObject;

static int timerfd_settime_abs(int fd, long long when_ns) {
    struct itimerspec spec = {0};
    /* it_value of zero disarms; an instant at or before 0 is "now", so arm it at 1 ns. */
    if (when_ns > 0) {
        spec.it_value.tv_sec = (time_t)(when_ns / 1000000000LL);
        spec.it_value.tv_nsec = (long)(when_ns % 1000000000LL);
    }
    return timerfd_settime(fd, TFD_TIMER_ABSTIME, &spec, NULL);
}

static PyObject *TimerFd_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, ":TimerFd", kwlist)) return NULL;
    TimerFdObject *self = (TimerFdObject *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (self->fd < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static void TimerFd_dealloc(TimerFdObject *self) {
    if (self->fd >= 0) close(self->fd);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int timerfd_open(TimerFdObject *self, const char *what) {
    if (self->fd >= 0) return 1;
    PyErr_Format(PyExc_RuntimeError, "TimerFd.%s after close", what);
    return 0;
}

static PyObject *TimerFd_arm(TimerFdObject *self, PyObject *arg) {
    if (!timerfd_open(self, "arm")) return NULL;
    long long when_ns = PyLong_AsLongLong(arg);
    if (when_ns == -1 && PyErr_Occurred()) return NULL;
    if (when_ns <= 0) when_ns = 1; /* past: at once (zero would disarm) */
    if (timerfd_settime_abs(self->fd, when_ns) < 0) return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_NONE;
}

static PyObject *TimerFd_disarm(TimerFdObject *self, PyObject *Py_UNUSED(ignored)) {
    if (!timerfd_open(self, "disarm")) return NULL;
    if (timerfd_settime_abs(self->fd, 0) < 0) return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_NONE;
}

static PyObject *TimerFd_clear(TimerFdObject *self, PyObject *Py_UNUSED(ignored)) {
    if (!timerfd_open(self, "clear")) return NULL;
    uint64_t count = 0;
    ssize_t got;
    while ((got = read(self->fd, &count, sizeof(count))) < 0 && errno == EINTR) {
    }
    if (got < 0) {
        if (errno == EAGAIN) return PyLong_FromLong(0); /* not expired since the last clear */
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyLong_FromUnsignedLongLong(count);
}

static PyObject *TimerFd_fileno(TimerFdObject *self, PyObject *Py_UNUSED(ignored)) {
    if (!timerfd_open(self, "fileno")) return NULL;
    return PyLong_FromLong(self->fd);
}

static PyObject *TimerFd_close(TimerFdObject *self, PyObject *Py_UNUSED(ignored)) {
    if (self->fd >= 0) {
        close(self->fd);
        self->fd = -1;
    }
    Py_RETURN_NONE;
}

static PyMethodDef TimerFd_methods[] = {
    {"arm", (PyCFunction)TimerFd_arm, METH_O,
     "arm(when_ns, /): fire at this CLOCK_MONOTONIC instant (at once if it is past)."},
    {"disarm", (PyCFunction)TimerFd_disarm, METH_NOARGS, "No expiry until the next arm."},
    {"clear", (PyCFunction)TimerFd_clear, METH_NOARGS,
     "Reads the expirations since the last clear (0: none); the fd is not readable after."},
    {"fileno", (PyCFunction)TimerFd_fileno, METH_NOARGS, "The timerfd, for loop.add_reader."},
    {"close", (PyCFunction)TimerFd_close, METH_NOARGS, "Closes the fd (again: nothing)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject TimerFdType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "store.rpc._native.TimerFd",
    .tp_basicsize = sizeof(TimerFdObject),
    .tp_dealloc = (destructor)TimerFd_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A timerfd on CLOCK_MONOTONIC armed at absolute instants in nanoseconds "
              "(see store/rpc/_native.pyi).",
    .tp_methods = TimerFd_methods,
    .tp_new = TimerFd_new,
};

/* Called by the module's init (mr_module.c). */
int mr_timer_add_type(PyObject *module) { return PyModule_AddType(module, &TimerFdType); }
