/*
 * SharedWatermarks (store.rpc._native.SharedWatermarks): what the worker processes of one
 * shard know of every shard's watermark, in a shared memory file, so that each worker
 * knows what any of its fellows has heard.
 *
 * Why: a shard leader of W workers hears of other shards' watermarks (in replies to its own
 * transactions, in gossip) W times less often per worker than a single leader would, and a
 * worker that does not know a shard's entry is durable keeps it in the vector clocks it
 * certifies (DESIGN.md's sparse clocks): bigger clocks, and commits that wait. The workers of
 * a shard run on one machine; here each publishes its vector watermark after every step that
 * moved it, and reads its fellows' at the start of every step: what one heard, all know, at
 * no message's cost. (Before this, fellows told each other by gossip over the RPC core.)
 *
 * The file: a 64-byte header (the magic "MRVWMK01", the number of shards, the number of
 * slots, zeros), then one block per slot (one per worker), each 64-byte aligned: a sequence
 * number, the epoch of the writer, and one entry per shard (0: nothing known). Each slot has
 * ONE writer, its worker, which publishes under a sequence lock: the sequence number is odd
 * while it writes, and a reader that sees it odd, or changed across its read, reads again.
 * A writer that died mid-write leaves it odd: the next writer of the slot (a restarted
 * worker) moves it on to a new odd value first, so no reader mistakes the torn block for a
 * whole one; a reader gives up on a slot after a few tries and takes it next time.
 *
 * Epochs (docs/recovery.md): an entry of a worker already in a later epoch can rest on that
 * epoch's claims, which a worker still in an earlier one must not count (it would take as
 * durable what the new epoch rolled back). So a reader passes its epoch and learns nothing
 * from a slot whose writer's epoch is later: the same rule as for gossip
 * (VectorWatermark.learn_entries). Entries only grow; a reader passes the list of what it has
 * already learned and is told only the entries above it.
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

static const char MR_VW_MAGIC[8] = {'M', 'R', 'V', 'W', 'M', 'K', '0', '1'};
#define MR_VW_HEADER_BYTES 64
#define MR_VW_SHARDS_MAX 65536
#define MR_VW_SLOTS_MAX 256
#define MR_VW_READ_TRIES 8

#define MR_VW_INVARIANT(condition)                                                             \
    do {                                                                                       \
        if (!(condition)) {                                                                    \
            fprintf(stderr, "mr_vwshare.c:%d: invariant failed: %s\n", __LINE__, #condition); \
            abort();                                                                           \
        }                                                                                      \
    } while (0)

typedef struct {
    char magic[8];
    int64_t shards;
    int64_t slots;
    char zeros[MR_VW_HEADER_BYTES - 24];
} mr_vw_header;

_Static_assert(sizeof(mr_vw_header) == MR_VW_HEADER_BYTES, "a 64-byte header");

typedef struct {
    _Atomic uint64_t seq; /* odd while its writer writes */
    _Atomic int64_t epoch;
    _Atomic int64_t entries[]; /* one per shard */
} mr_vw_slot;

typedef struct {
    PyObject_HEAD
    char *map; /* NULL once closed */
    size_t bytes;
    int64_t shards;
    int64_t slots;
    size_t slot_bytes;
    int64_t *scratch; /* a reader's copy of one slot's entries */
} SharedWatermarksObject;

static size_t slot_bytes_for(int64_t shards) {
    size_t bytes = sizeof(mr_vw_slot) + (size_t)shards * sizeof(int64_t);
    return (bytes + 63) / 64 * 64;
}

static mr_vw_slot *slot_at(SharedWatermarksObject *self, int64_t slot) {
    return (mr_vw_slot *)(self->map + MR_VW_HEADER_BYTES + (size_t)slot * self->slot_bytes);
}

static void vw_unmap(SharedWatermarksObject *self) {
    if (self->map != NULL) {
        munmap(self->map, self->bytes);
        self->map = NULL;
    }
    PyMem_Free(self->scratch);
    self->scratch = NULL;
}

static void SharedWatermarks_dealloc(SharedWatermarksObject *self) {
    vw_unmap(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Opens the file (creating and sizing it with create, under an exclusive flock so that two
 * workers starting at once cannot both write its header); returns the fd or -1 with a Python
 * error set. */
static int vw_open(const char *path, bool create, int64_t shards, int64_t slots, size_t bytes) {
    off_t size;
    int fd = mr_shm_open_locked(path, create, &size);
    if (fd < 0) return -1;
    if (size == 0 && create) {
        mr_vw_header header;
        memset(&header, 0, sizeof(header));
        memcpy(header.magic, MR_VW_MAGIC, sizeof(header.magic));
        header.shards = shards;
        header.slots = slots;
        if (ftruncate(fd, (off_t)bytes) < 0 ||
            pwrite(fd, &header, sizeof(header), 0) != (ssize_t)sizeof(header)) {
            PyErr_SetFromErrnoWithFilename(PyExc_OSError, path);
            close(fd);
            return -1;
        }
        return fd;
    }
    mr_vw_header header;
    if (size != (off_t)bytes || pread(fd, &header, sizeof(header), 0) != sizeof(header) ||
        memcmp(header.magic, MR_VW_MAGIC, sizeof(header.magic)) != 0 || header.shards != shards ||
        header.slots != slots) {
        PyErr_Format(PyExc_ValueError,
                     "SharedWatermarks: %s is not a Meridian watermark file of %lld shards and "
                     "%lld slots (%lld bytes; such a file is %zu bytes starting with MRVWMK01)",
                     path, (long long)shards, (long long)slots, (long long)size, bytes);
        close(fd);
        return -1;
    }
    return fd;
}

static PyObject *SharedWatermarks_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"path", "shards", "slots", "create", NULL};
    PyObject *path_obj = NULL;
    long long shards = 0, slots = 0;
    int create = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O&LL|p", kwlist, PyUnicode_FSConverter,
                                     &path_obj, &shards, &slots, &create))
        return NULL;
    if (shards < 1 || shards > MR_VW_SHARDS_MAX || slots < 1 || slots > MR_VW_SLOTS_MAX) {
        PyErr_Format(PyExc_ValueError,
                     "SharedWatermarks: %lld shards and %lld slots (1 to %d shards, 1 to %d slots)",
                     shards, slots, MR_VW_SHARDS_MAX, MR_VW_SLOTS_MAX);
        Py_DECREF(path_obj);
        return NULL;
    }
    const char *path = PyBytes_AS_STRING(path_obj);
    size_t slot_bytes = slot_bytes_for(shards);
    size_t bytes = MR_VW_HEADER_BYTES + (size_t)slots * slot_bytes;
    int fd = vw_open(path, create != 0, shards, slots, bytes);
    if (fd < 0) {
        Py_DECREF(path_obj);
        return NULL;
    }
    void *map = mr_shm_map(fd, bytes, path);
    Py_DECREF(path_obj);
    if (map == NULL) return NULL;
    SharedWatermarksObject *self = (SharedWatermarksObject *)type->tp_alloc(type, 0);
    int64_t *scratch = PyMem_Malloc((size_t)shards * sizeof(int64_t));
    if (self == NULL || scratch == NULL) {
        munmap(map, bytes);
        PyMem_Free(scratch);
        Py_XDECREF(self);
        return PyErr_NoMemory();
    }
    self->map = map;
    self->bytes = bytes;
    self->shards = shards;
    self->slots = slots;
    self->slot_bytes = slot_bytes;
    self->scratch = scratch;
    mr_vw_slot *first = slot_at(self, 0);
    MR_VW_INVARIANT(atomic_is_lock_free(&first->seq) && atomic_is_lock_free(&first->epoch));
    MR_VW_INVARIANT(((uintptr_t)first) % 64 == 0);
    return (PyObject *)self;
}

static bool vw_slot_arg(SharedWatermarksObject *self, PyObject *arg, int64_t *slot) {
    if (self->map == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "SharedWatermarks used after close");
        return false;
    }
    long long value = PyLong_AsLongLong(arg);
    if (value == -1 && PyErr_Occurred()) return false;
    if (value < 0 || value >= self->slots) {
        PyErr_Format(PyExc_ValueError, "SharedWatermarks: slot %lld is not in [0, %lld)", value,
                     (long long)self->slots);
        return false;
    }
    *slot = value;
    return true;
}

/* The (slot, epoch, ...) that publish and pull begin with: `nargs` must be `want`
 * (`usage` names the call in the error). */
static bool vw_slot_and_epoch(SharedWatermarksObject *self, PyObject *const *args,
                              Py_ssize_t nargs, Py_ssize_t want, const char *usage,
                              int64_t *slot, long long *epoch) {
    if (nargs != want) {
        PyErr_Format(PyExc_TypeError, "%s takes %zd arguments", usage, want);
        return false;
    }
    if (!vw_slot_arg(self, args[0], slot)) return false;
    *epoch = PyLong_AsLongLong(args[1]);
    return !(*epoch == -1 && PyErr_Occurred());
}

/* publish(slot, epoch, entries, /): entries a mapping {shard: watermark}. */
static PyObject *SharedWatermarks_publish(SharedWatermarksObject *self, PyObject *const *args,
                                          Py_ssize_t nargs) {
    int64_t slot;
    long long epoch;
    if (!vw_slot_and_epoch(self, args, nargs, 3, "publish(slot, epoch, entries)", &slot, &epoch))
        return NULL;
    if (epoch < 0 || !PyDict_Check(args[2])) {
        PyErr_SetString(PyExc_ValueError, "publish: the epoch is >= 0 and entries a dict");
        return NULL;
    }
    /* Check every pair before writing any: a bad one must leave the slot as it was. */
    int64_t *values = self->scratch;
    memset(values, 0, (size_t)self->shards * sizeof(int64_t));
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(args[2], &pos, &key, &value)) {
        long long shard = PyLong_AsLongLong(key);
        if (shard == -1 && PyErr_Occurred()) return NULL;
        long long mark = PyLong_AsLongLong(value);
        if (mark == -1 && PyErr_Occurred()) return NULL;
        if (shard < 0 || shard >= self->shards || mark < 0) {
            PyErr_Format(PyExc_ValueError,
                         "publish: entry %lld: %lld (shards are in [0, %lld), watermarks >= 0)",
                         shard, mark, (long long)self->shards);
            return NULL;
        }
        values[shard] = mark;
    }
    mr_vw_slot *block = slot_at(self, slot);
    uint64_t seq = atomic_load_explicit(&block->seq, memory_order_relaxed);
    seq = (seq | 1) + ((seq & 1) ? 2 : 0); /* odd, and new even after a torn write */
    atomic_store_explicit(&block->seq, seq, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    atomic_store_explicit(&block->epoch, epoch, memory_order_relaxed);
    for (int64_t shard = 0; shard < self->shards; shard++) {
        atomic_store_explicit(&block->entries[shard], values[shard], memory_order_relaxed);
    }
    atomic_store_explicit(&block->seq, seq + 1, memory_order_release);
    Py_RETURN_NONE;
}

/* pull(slot, epoch, known, seen, /) -> (seq, [(shard, watermark), ...]) | None. */
static PyObject *SharedWatermarks_pull(SharedWatermarksObject *self, PyObject *const *args,
                                       Py_ssize_t nargs) {
    int64_t slot;
    long long epoch;
    if (!vw_slot_and_epoch(self, args, nargs, 4, "pull(slot, epoch, known, seen)", &slot, &epoch))
        return NULL;
    PyObject *known = args[2];
    if (!PyList_CheckExact(known) || PyList_GET_SIZE(known) != self->shards) {
        PyErr_Format(PyExc_ValueError, "pull: known is a list of %lld ints", (long long)self->shards);
        return NULL;
    }
    unsigned long long seen = PyLong_AsUnsignedLongLong(args[3]);
    if (seen == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    mr_vw_slot *block = slot_at(self, slot);
    int64_t *values = self->scratch;
    for (int tries = 0; tries < MR_VW_READ_TRIES; tries++) {
        uint64_t before = atomic_load_explicit(&block->seq, memory_order_acquire);
        if (before == seen) Py_RETURN_NONE;
        if (before & 1) continue;
        int64_t written = atomic_load_explicit(&block->epoch, memory_order_relaxed);
        for (int64_t shard = 0; shard < self->shards; shard++) {
            values[shard] = atomic_load_explicit(&block->entries[shard], memory_order_relaxed);
        }
        atomic_thread_fence(memory_order_acquire);
        if (atomic_load_explicit(&block->seq, memory_order_relaxed) != before) continue;
        if (written > epoch) Py_RETURN_NONE; /* a later epoch's: not for this reader yet */
        PyObject *raised = PyList_New(0);
        if (raised == NULL) return NULL;
        for (int64_t shard = 0; shard < self->shards; shard++) {
            long long have = PyLong_AsLongLong(PyList_GET_ITEM(known, shard));
            if (have == -1 && PyErr_Occurred()) {
                Py_DECREF(raised);
                return NULL;
            }
            if (values[shard] <= have) continue;
            PyObject *mark = PyLong_FromLongLong(values[shard]);
            PyObject *pair = mark == NULL ? NULL : Py_BuildValue("(LO)", (long long)shard, mark);
            if (pair == NULL || PyList_Append(raised, pair) < 0) {
                Py_XDECREF(pair);
                Py_XDECREF(mark);
                Py_DECREF(raised);
                return NULL;
            }
            Py_DECREF(pair);
            PyList_SetItem(known, shard, mark); /* steals mark; in range, cannot fail */
        }
        return Py_BuildValue("(KN)", (unsigned long long)before, raised);
    }
    Py_RETURN_NONE; /* its writer is writing (or died writing): next time */
}

static PyObject *SharedWatermarks_close(SharedWatermarksObject *self, PyObject *Py_UNUSED(ignored)) {
    vw_unmap(self);
    Py_RETURN_NONE;
}

static PyMethodDef SharedWatermarks_methods[] = {
    {"publish", (PyCFunction)(void (*)(void))SharedWatermarks_publish, METH_FASTCALL,
     "publish(slot, epoch, entries, /): slot `slot`'s writer, in `epoch`, knows the shard "
     "watermarks `entries` ({shard: watermark})."},
    {"pull", (PyCFunction)(void (*)(void))SharedWatermarks_pull, METH_FASTCALL,
     "pull(slot, epoch, known, seen, /): what slot `slot` publishes above `known` (updated), "
     "as (sequence number, [(shard, watermark)]); None if its sequence number is `seen`, it "
     "is of a later epoch than `epoch`, or it is being written."},
    {"close", (PyCFunction)SharedWatermarks_close, METH_NOARGS,
     "Unmaps the file; later calls raise RuntimeError."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject SharedWatermarksType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "store.rpc._native.SharedWatermarks",
    .tp_basicsize = sizeof(SharedWatermarksObject),
    .tp_dealloc = (destructor)SharedWatermarks_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The vector watermarks of a shard's workers, in a shared memory file "
              "(see store/rpc/_native.pyi).",
    .tp_methods = SharedWatermarks_methods,
    .tp_new = SharedWatermarks_new,
};

/* Called by the module's init (mr_module.c). */
int mr_vwshare_add_type(PyObject *module) {
    return PyModule_AddType(module, &SharedWatermarksType);
}
