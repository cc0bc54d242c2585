/*
 * SharedCounter (store.rpc._native.SharedCounter): one 64-bit counter in a shared memory
 * file, drawn from by several processes with an atomic fetch-and-add.
 *
 * Why: a shard leader may run as W worker processes (docs/design.md, "Workers"), and every
 * worker draws its transactions' counters from the one counter of its shard, so that the
 * shard keeps a single vector-clock entry. The workers map the same file (under /dev/shm on
 * Linux) and draw with one lock-free atomic instruction: no system call and no lock on the
 * path of a transaction.
 *
 * The file is one 64-byte block: a magic number ("MRCOUNT1", 8 bytes), the value (an
 * _Atomic int64_t, naturally aligned) and zeros. Opening with create=True makes an empty or
 * missing file a counter at 0, under an exclusive flock(2) so that two processes creating it
 * at once cannot both write its header; any other file (wrong size or magic) is refused with
 * ValueError and left untouched. The value only grows: draw() adds one and returns the new
 * value, raise_to(v) lifts it to at least v (a compare-and-swap loop; how a new epoch's
 * counters start above the old ones), value() reads it. Values stay in [0, 2^63): an
 * increment past the largest stops the process (a counter that wrapped would give two
 * transactions one counter, which nothing downstream could detect).
 *
 * The rest of the block holds six claim slots, one per worker (publish / idle / claim): each
 * worker publishes there the watermark it claims (every value at or below it that it drew is
 * settled), raised with a compare-and-swap loop like the value, and its fellows read it at
 * their next step instead of waiting for the claim's gossip. A shard of more workers than
 * slots goes without (its workers gossip their claims only).
 *
 * Idle claims. A worker with nothing unsettled claims the counter's value itself, whatever
 * its fellows draw meanwhile (what it drew is below, what it draws later above). It says so
 * once (idle(slot, ceiling): the slot holds -ceiling - 1, a negative number, where ceiling is
 * the last value of its epoch) instead of publishing every value the counter passes, and
 * claim(slot) then reads the live value: min(value, ceiling). Before it draws again it
 * publishes a plain claim (publish overwrites the marker). The order makes this right across
 * processes: claim() loads the value BEFORE the slot, the worker stores its plain claim
 * BEFORE its fetch-and-add, all sequentially consistent; so a reader that still sees the
 * marker loaded the value before that draw, and the value it returns is below it.
 *
 * A counter in a shared mapping is only right across processes if the atomic is lock-free
 * (an address-free instruction, not a lock inside one process): checked when the module
 * loads a counter, and the process stops if not.
 */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mr_shm.h"

#define MR_COUNTER_FILE_BYTES 64
static const char MR_COUNTER_MAGIC[8] = {'M', 'R', 'C', 'O', 'U', 'N', 'T', '1'};

/* Python builds with NDEBUG, which turns assert() off; an invariant must hold in every build. */
#define MR_COUNTER_INVARIANT(condition)                                                        \
    do {                                                                                       \
        if (!(condition)) {                                                                    \
            fprintf(stderr, "mr_counter.c:%d: invariant failed: %s\n", __LINE__, #condition); \
            abort();                                                                           \
        }                                                                                      \
    } while (0)

#define MR_COUNTER_CLAIM_SLOTS 6

typedef struct {
    char magic[8];
    _Atomic int64_t value;
    /* One per worker of the shard: the largest watermark claim it has published (>= 0), or
     * -ceiling - 1 while it claims the live value up to ceiling (idle). */
    _Atomic int64_t claims[MR_COUNTER_CLAIM_SLOTS];
} mr_counter_file;

_Static_assert(sizeof(mr_counter_file) == MR_COUNTER_FILE_BYTES, "one 64-byte block");

typedef struct {
    PyObject_HEAD
    mr_counter_file *map; /* NULL once closed (or before a successful init) */
} SharedCounterObject;

static void counter_unmap(SharedCounterObject *self) {
    if (self->map != NULL) {
        munmap(self->map, MR_COUNTER_FILE_BYTES);
        self->map = NULL;
    }
}

static void SharedCounter_dealloc(SharedCounterObject *self) {
    counter_unmap(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Opens (and with create, initialises) the file; returns the fd (flock'ed) or -1 with a
 * Python error set. */
static int counter_open(const char *path, bool create) {
    off_t size;
    int fd = mr_shm_open_locked(path, create, &size);
    if (fd < 0) return -1;
    if (size == 0 && create) {
        mr_counter_file fresh;
        memset(&fresh, 0, sizeof(fresh));
        memcpy(fresh.magic, MR_COUNTER_MAGIC, sizeof(fresh.magic));
        if (pwrite(fd, &fresh, sizeof(fresh), 0) != (ssize_t)sizeof(fresh)) {
            PyErr_SetFromErrnoWithFilename(PyExc_OSError, path);
            close(fd);
            return -1;
        }
        return fd;
    }
    char magic[8];
    if (size != MR_COUNTER_FILE_BYTES || pread(fd, magic, sizeof(magic), 0) != 8 ||
        memcmp(magic, MR_COUNTER_MAGIC, sizeof(magic)) != 0) {
        PyErr_Format(PyExc_ValueError,
                     "SharedCounter: %s is not a Meridian counter file (%lld bytes; a counter "
                     "is %d bytes starting with MRCOUNT1)",
                     path, (long long)size, MR_COUNTER_FILE_BYTES);
        close(fd);
        return -1;
    }
    return fd;
}

static PyObject *SharedCounter_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"path", "create", NULL};
    PyObject *path_obj = NULL;
    int create = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O&|p", kwlist, PyUnicode_FSConverter,
                                     &path_obj, &create))
        return NULL;
    const char *path = PyBytes_AS_STRING(path_obj);
    int fd = counter_open(path, create != 0);
    if (fd < 0) {
        Py_DECREF(path_obj);
        return NULL;
    }
    void *map = mr_shm_map(fd, MR_COUNTER_FILE_BYTES, path);
    Py_DECREF(path_obj);
    if (map == NULL) return NULL;
    mr_counter_file *file = map;
    MR_COUNTER_INVARIANT(atomic_is_lock_free(&file->value));
    MR_COUNTER_INVARIANT(((uintptr_t)&file->value) % sizeof(int64_t) == 0);
    SharedCounterObject *self = (SharedCounterObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        munmap(map, MR_COUNTER_FILE_BYTES);
        return NULL;
    }
    self->map = file;
    return (PyObject *)self;
}

static bool counter_open_or_raise(SharedCounterObject *self) {
    if (self->map == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "SharedCounter used after close");
        return false;
    }
    return true;
}

static PyObject *SharedCounter_draw(SharedCounterObject *self, PyObject *Py_UNUSED(ignored)) {
    if (!counter_open_or_raise(self)) return NULL;
    /* Sequentially consistent: after the plain claim a worker publishes before it draws. */
    int64_t before = atomic_fetch_add_explicit(&self->map->value, 1, memory_order_seq_cst);
    MR_COUNTER_INVARIANT(before >= 0 && before < INT64_MAX);
    return PyLong_FromLongLong(before + 1);
}

static PyObject *SharedCounter_value(SharedCounterObject *self, PyObject *Py_UNUSED(ignored)) {
    if (!counter_open_or_raise(self)) return NULL;
    int64_t now = atomic_load_explicit(&self->map->value, memory_order_acquire);
    MR_COUNTER_INVARIANT(now >= 0);
    return PyLong_FromLongLong(now);
}

static PyObject *SharedCounter_raise_to(SharedCounterObject *self, PyObject *arg) {
    if (!counter_open_or_raise(self)) return NULL;
    long long floor = PyLong_AsLongLong(arg);
    if (floor == -1 && PyErr_Occurred()) return NULL;
    if (floor < 0) {
        PyErr_Format(PyExc_ValueError, "SharedCounter.raise_to(%lld): counters are >= 0", floor);
        return NULL;
    }
    int64_t seen = atomic_load_explicit(&self->map->value, memory_order_acquire);
    while (seen < floor &&
           !atomic_compare_exchange_weak_explicit(&self->map->value, &seen, (int64_t)floor,
                                                  memory_order_acq_rel, memory_order_acquire)) {
    }
    MR_COUNTER_INVARIANT(seen >= 0);
    return PyLong_FromLongLong(seen < floor ? floor : seen);
}

static bool claim_slot_or_raise(long long slot) {
    if (slot < 0 || slot >= MR_COUNTER_CLAIM_SLOTS) {
        PyErr_Format(PyExc_ValueError, "SharedCounter: claim slot %lld is not in [0, %d)", slot,
                     MR_COUNTER_CLAIM_SLOTS);
        return false;
    }
    return true;
}

/* The arguments of publish(slot, claim) and idle(slot, ceiling): an open counter, a slot in
 * range and a value >= 0 (`call` names the method, `what` the value, in the errors). */
static bool slot_and_value(SharedCounterObject *self, PyObject *const *args, Py_ssize_t nargs,
                           const char *call, const char *what, long long *slot,
                           long long *value) {
    if (!counter_open_or_raise(self)) return false;
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "%s(slot, %s) takes two integers", call, what);
        return false;
    }
    *slot = PyLong_AsLongLong(args[0]);
    if (*slot == -1 && PyErr_Occurred()) return false;
    *value = PyLong_AsLongLong(args[1]);
    if (*value == -1 && PyErr_Occurred()) return false;
    if (!claim_slot_or_raise(*slot)) return false;
    if (*value < 0) {
        PyErr_Format(PyExc_ValueError, "SharedCounter.%s: %s %lld is negative", call, what, *value);
        return false;
    }
    return true;
}

static PyObject *SharedCounter_publish(SharedCounterObject *self, PyObject *const *args,
                                       Py_ssize_t nargs) {
    long long slot, claim;
    if (!slot_and_value(self, args, nargs, "publish", "claim", &slot, &claim)) return NULL;
    _Atomic int64_t *cell = &self->map->claims[slot];
    int64_t seen = atomic_load_explicit(cell, memory_order_seq_cst);
    /* An idle marker (negative) is replaced whatever it said; a plain claim only grows. */
    while ((seen < 0 || seen < claim) &&
           !atomic_compare_exchange_weak_explicit(cell, &seen, (int64_t)claim, memory_order_seq_cst,
                                                  memory_order_seq_cst)) {
    }
    return PyLong_FromLongLong(seen < claim ? claim : seen);
}

static PyObject *SharedCounter_idle(SharedCounterObject *self, PyObject *const *args,
                                    Py_ssize_t nargs) {
    long long slot, ceiling;
    if (!slot_and_value(self, args, nargs, "idle", "ceiling", &slot, &ceiling)) return NULL;
    atomic_store_explicit(&self->map->claims[slot], -(int64_t)ceiling - 1, memory_order_seq_cst);
    Py_RETURN_NONE;
}

static PyObject *SharedCounter_claim(SharedCounterObject *self, PyObject *arg) {
    if (!counter_open_or_raise(self)) return NULL;
    long long slot = PyLong_AsLongLong(arg);
    if (slot == -1 && PyErr_Occurred()) return NULL;
    if (!claim_slot_or_raise(slot)) return NULL;
    /* The value first, then the slot (see the file's comment, "Idle claims"). */
    int64_t value = atomic_load_explicit(&self->map->value, memory_order_seq_cst);
    int64_t claim = atomic_load_explicit(&self->map->claims[slot], memory_order_seq_cst);
    if (claim < 0) {
        int64_t ceiling = -(claim + 1);
        claim = value < ceiling ? value : ceiling;
    }
    MR_COUNTER_INVARIANT(claim >= 0);
    return PyLong_FromLongLong(claim);
}

static PyObject *SharedCounter_close(SharedCounterObject *self, PyObject *Py_UNUSED(ignored)) {
    counter_unmap(self);
    Py_RETURN_NONE;
}

static PyMethodDef SharedCounter_methods[] = {
    {"draw", (PyCFunction)SharedCounter_draw, METH_NOARGS,
     "Adds one and returns the new value (atomically across processes)."},
    {"value", (PyCFunction)SharedCounter_value, METH_NOARGS, "The current value."},
    {"raise_to", (PyCFunction)SharedCounter_raise_to, METH_O,
     "raise_to(floor, /): lifts the value to at least floor; returns the value after."},
    {"publish", (PyCFunction)(void (*)(void))SharedCounter_publish, METH_FASTCALL,
     "publish(slot, claim, /): raises claim slot `slot` to at least `claim` (replacing an idle "
     "marker); returns it after."},
    {"idle", (PyCFunction)(void (*)(void))SharedCounter_idle, METH_FASTCALL,
     "idle(slot, ceiling, /): slot `slot` claims the live value, up to `ceiling`."},
    {"claim", (PyCFunction)SharedCounter_claim, METH_O,
     "claim(slot, /): the claim of slot `slot` (0: none; idle: min(value, ceiling))."},
    {"close", (PyCFunction)SharedCounter_close, METH_NOARGS,
     "Unmaps the file (the value stays in it); later calls raise RuntimeError."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject SharedCounterType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "store.rpc._native.SharedCounter",
    .tp_basicsize = sizeof(SharedCounterObject),
    .tp_dealloc = (destructor)SharedCounter_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A 64-bit counter in a shared memory file, drawn from by several processes "
              "(see store/rpc/_native.pyi).",
    .tp_methods = SharedCounter_methods,
    .tp_new = SharedCounter_new,
};

/* Called by the module's init (mr_module.c). */
int mr_counter_add_type(PyObject *module) { return PyModule_AddType(module, &SharedCounterType); }
