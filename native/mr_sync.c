/*
 * Syncer (store.rpc._native.Syncer): fsync and close file descriptors on one POSIX thread
 * that never takes the GIL, and tell the event loop through an eventfd.
 *
 * Why C: store/node/durable.py makes its write-ahead logs durable once per group commit. On a
 * ThreadPoolExecutor each sync cost an executor hand-off, a worker thread that needed the GIL
 * for the Python around its fsync (and could wait out the 5 ms switch interval while the loop
 * thread was busy, delaying every commit) and a call_soon_threadsafe back: about 9% of a shard
 * leader's CPU and 17% of a follower's. Here the worker is plain C, and the loop watches the
 * eventfd (loop.add_reader) and collects what finished with take().
 *
 * Theory of operation. submit() queues a job (a token and its fds) under the mutex and
 * signals the condition variable. The thread runs jobs in submission order: it fsyncs every
 * fd of a job, then closes every one of them whatever failed (once submitted, the fds are the
 * Syncer's), appends (token, errno of the first failure or 0) to the completed list under the
 * mutex, and only then adds 1 to the eventfd. That order matters: a reader woken by the
 * eventfd always finds the job listed, whereas waking it first could let take() run before
 * the job is listed and then never wake it again. take() drains the eventfd first and the
 * list second, so a job listed between the two is returned now and leaves a spurious wake-up
 * whose take() returns an empty list. close() lets the thread finish the jobs already queued,
 * joins it and closes the eventfd.
 *
 * The thread only touches this struct's C fields, under the mutex, and the fds; it never
 * touches a Python object and never takes the GIL. The object outlives the thread: close()
 * and dealloc join it before anything is freed.
 */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

/* Jobs submitted and not yet returned by take() (queued, running or completed). WalDurable
 * has one sync in flight at a time; the bound also fixes the completed list's size. */
#define MR_SYNC_JOBS_MAX 64u
/* File descriptors in one job: a process has a log per Paxos stream, one or a few. */
#define MR_SYNC_JOB_FDS_MAX 1024u

/* Python builds with NDEBUG, which turns assert() off; an invariant must hold in every build. */
#define MR_SYNC_INVARIANT(condition)                                                        \
    do {                                                                                    \
        if (!(condition)) {                                                                 \
            fprintf(stderr, "mr_sync.c:%d: invariant failed: %s\n", __LINE__, #condition); \
            abort();                                                                        \
        }                                                                                   \
    } while (0)

typedef struct {
    long long token;
    int *fds; /* malloc'd by submit, freed by the thread (which may not use Python's allocator) */
    uint32_t fd_count;
} mr_sync_job;

typedef struct {
    long long token;
    int error; /* errno of the job's first failed fsync or close; 0: every fd synced */
} mr_sync_done;

typedef struct {
    PyObject_HEAD
    pthread_mutex_t lock;
    pthread_cond_t wake; /* signalled by submit and close */
    pthread_t thread;
    bool lock_ready;     /* the mutex and condition variable exist (dealloc destroys them) */
    bool thread_running; /* a thread to join */
    bool closed;         /* close() ran or is running (read and written with the GIL) */
    int event_fd;        /* -1 once closed */
    /* Under the lock: */
    bool stopping; /* no more jobs; the thread exits once the queue is empty */
    mr_sync_job queue[MR_SYNC_JOBS_MAX]; /* a ring: queue_count jobs from queue_head */
    uint32_t queue_head;
    uint32_t queue_count;
    mr_sync_done completed[MR_SYNC_JOBS_MAX];
    uint32_t completed_count;
    uint32_t outstanding; /* submitted and not yet taken */
} SyncerObject;

/* Fsyncs every fd, then closes every fd (also after a failure: the caller handed them over).
 * A failure does not stop the other fsyncs: the process stops on it, and what the other logs
 * hold is then on disk. Returns the errno of the first failure, or 0. */
static int sync_and_close(const int *fds, uint32_t fd_count) {
    int error = 0;
    for (uint32_t i = 0; i < fd_count; i++) {
        int r;
        do {
            r = fsync(fds[i]);
        } while (r != 0 && errno == EINTR);
        if (r != 0 && error == 0) error = errno;
    }
    for (uint32_t i = 0; i < fd_count; i++) {
        /* Linux closes the fd even when close() says EINTR, so it is not retried (a retry
         * could close an fd another thread has just been given); nor is it a failure. */
        if (close(fds[i]) != 0 && errno != EINTR && error == 0) error = errno;
    }
    return error;
}

static void notify_loop(int event_fd) {
    uint64_t one = 1;
    /* The counter cannot reach its maximum (2^64 - 2) between two reads, so this write
     * neither blocks nor fails with EAGAIN; signals are blocked in this thread. */
    while (write(event_fd, &one, sizeof(one)) < 0 && errno == EINTR) {
    }
}

static void *syncer_thread(void *arg) {
    SyncerObject *self = arg;
    pthread_mutex_lock(&self->lock);
    for (;;) {
        while (self->queue_count == 0 && !self->stopping)
            pthread_cond_wait(&self->wake, &self->lock);
        if (self->queue_count == 0) break; /* stopping, and every queued job has run */
        mr_sync_job job = self->queue[self->queue_head];
        self->queue_head = (self->queue_head + 1) % MR_SYNC_JOBS_MAX;
        self->queue_count--;
        pthread_mutex_unlock(&self->lock);

        int error = sync_and_close(job.fds, job.fd_count);
        free(job.fds);

        pthread_mutex_lock(&self->lock);
        /* outstanding counts this job until take(), and submit keeps it <= the maximum. */
        MR_SYNC_INVARIANT(self->completed_count < MR_SYNC_JOBS_MAX);
        self->completed[self->completed_count++] = (mr_sync_done){job.token, error};
        pthread_mutex_unlock(&self->lock);
        notify_loop(self->event_fd); /* after the job is listed: see the file's comment */
        pthread_mutex_lock(&self->lock);
    }
    pthread_mutex_unlock(&self->lock);
    return NULL;
}

/* Stops the thread once the queued jobs have run, joins it and closes the eventfd. The GIL is
 * released around the join when release_gil (a job may be an fsync of many megabytes); the
 * thread never takes the GIL, so holding it (as dealloc does) only delays other threads. */
static void syncer_stop(SyncerObject *self, bool release_gil) {
    if (self->closed) return;
    self->closed = true;
    if (self->thread_running) {
        pthread_mutex_lock(&self->lock);
        self->stopping = true;
        pthread_cond_signal(&self->wake);
        pthread_mutex_unlock(&self->lock);
        if (release_gil) {
            Py_BEGIN_ALLOW_THREADS
            pthread_join(self->thread, NULL);
            Py_END_ALLOW_THREADS
        } else {
            pthread_join(self->thread, NULL);
        }
        self->thread_running = false;
    }
    if (self->event_fd >= 0) {
        close(self->event_fd);
        self->event_fd = -1;
    }
}

static void Syncer_dealloc(SyncerObject *self) {
    /* Not releasing the GIL here: the object is half gone, and this may run at exit. */
    syncer_stop(self, false);
    /* The thread ran every queued job before it exited, so no job holds fds any more. */
    MR_SYNC_INVARIANT(self->queue_count == 0);
    if (self->lock_ready) {
        pthread_cond_destroy(&self->wake);
        pthread_mutex_destroy(&self->lock);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Syncer_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, ":Syncer", kwlist)) return NULL;
    SyncerObject *self = (SyncerObject *)type->tp_alloc(type, 0); /* zeroed */
    if (self == NULL) return NULL;
    self->event_fd = -1;
    int error = pthread_mutex_init(&self->lock, NULL);
    if (error == 0) {
        error = pthread_cond_init(&self->wake, NULL);
        if (error != 0) pthread_mutex_destroy(&self->lock);
    }
    if (error != 0) {
        errno = error;
        PyErr_SetFromErrno(PyExc_OSError);
        Py_DECREF(self);
        return NULL;
    }
    self->lock_ready = true;
    self->event_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (self->event_fd < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        Py_DECREF(self);
        return NULL;
    }
    /* Every signal blocked in the thread, so that the kernel delivers them to a thread
     * that runs Python's handlers rather than to one that only fsyncs. */
    sigset_t all, previous;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &previous);
    error = pthread_create(&self->thread, NULL, syncer_thread, self);
    pthread_sigmask(SIG_SETMASK, &previous, NULL);
    if (error != 0) {
        errno = error;
        PyErr_SetFromErrno(PyExc_OSError);
        Py_DECREF(self);
        return NULL;
    }
    self->thread_running = true;
    return (PyObject *)self;
}

static PyObject *Syncer_submit(SyncerObject *self, PyObject *args) {
    long long token;
    PyObject *fd_tuple;
    if (!PyArg_ParseTuple(args, "LO!:submit", &token, &PyTuple_Type, &fd_tuple)) return NULL;
    if (self->closed) {
        PyErr_SetString(PyExc_RuntimeError, "Syncer.submit after close");
        return NULL;
    }
    Py_ssize_t fd_count = PyTuple_GET_SIZE(fd_tuple);
    if (fd_count > (Py_ssize_t)MR_SYNC_JOB_FDS_MAX) {
        PyErr_Format(PyExc_ValueError, "a Syncer job holds at most %u fds, not %zd",
                     MR_SYNC_JOB_FDS_MAX, fd_count);
        return NULL;
    }
    /* malloc (not PyMem_Malloc): the thread frees it without the GIL. At least one byte, so
     * that NULL always means out of memory. */
    int *fds = malloc(fd_count > 0 ? (size_t)fd_count * sizeof(int) : 1);
    if (fds == NULL) return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < fd_count; i++) {
        long fd = PyLong_AsLong(PyTuple_GET_ITEM(fd_tuple, i));
        if (fd == -1 && PyErr_Occurred()) {
            free(fds);
            return NULL;
        }
        if (fd < 0 || fd > INT_MAX) {
            PyErr_Format(PyExc_ValueError, "not a file descriptor: %ld", fd);
            free(fds);
            return NULL;
        }
        fds[i] = (int)fd;
    }
    pthread_mutex_lock(&self->lock);
    if (self->outstanding >= MR_SYNC_JOBS_MAX) {
        pthread_mutex_unlock(&self->lock);
        free(fds);
        PyErr_Format(PyExc_RuntimeError,
                     "Syncer: %u jobs submitted and not yet taken (the most it holds)",
                     MR_SYNC_JOBS_MAX);
        return NULL;
    }
    uint32_t tail = (self->queue_head + self->queue_count) % MR_SYNC_JOBS_MAX;
    self->queue[tail] = (mr_sync_job){token, fds, (uint32_t)fd_count};
    self->queue_count++;
    self->outstanding++;
    pthread_cond_signal(&self->wake);
    pthread_mutex_unlock(&self->lock);
    Py_RETURN_NONE;
}

static PyObject *Syncer_fileno(SyncerObject *self, PyObject *Py_UNUSED(ignored)) {
    if (self->event_fd < 0) {
        PyErr_SetString(PyExc_RuntimeError, "Syncer.fileno after close");
        return NULL;
    }
    return PyLong_FromLong(self->event_fd);
}

static PyObject *Syncer_take(SyncerObject *self, PyObject *Py_UNUSED(ignored)) {
    if (self->event_fd >= 0) {
        uint64_t count;
        /* EAGAIN: no wake-up pending (the list may still hold a job; see the file's comment). */
        while (read(self->event_fd, &count, sizeof(count)) < 0 && errno == EINTR) {
        }
    }
    mr_sync_done done[MR_SYNC_JOBS_MAX];
    pthread_mutex_lock(&self->lock);
    uint32_t done_count = self->completed_count;
    memcpy(done, self->completed, done_count * sizeof(done[0]));
    self->completed_count = 0;
    MR_SYNC_INVARIANT(self->outstanding >= done_count);
    self->outstanding -= done_count;
    pthread_mutex_unlock(&self->lock);

    PyObject *list = PyList_New(done_count);
    if (list == NULL) return NULL;
    for (uint32_t i = 0; i < done_count; i++) {
        PyObject *item = Py_BuildValue("(Li)", done[i].token, done[i].error);
        if (item == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, item);
    }
    return list;
}

static PyObject *Syncer_close(SyncerObject *self, PyObject *Py_UNUSED(ignored)) {
    syncer_stop(self, true);
    Py_RETURN_NONE;
}

static PyMethodDef Syncer_methods[] = {
    {"submit", (PyCFunction)Syncer_submit, METH_VARARGS,
     "submit(token, fds, /): fsync then close the fds on the thread (see the stub)."},
    {"fileno", (PyCFunction)Syncer_fileno, METH_NOARGS,
     "The eventfd that becomes readable when a job completes."},
    {"take", (PyCFunction)Syncer_take, METH_NOARGS,
     "The completed jobs, [(token, errno or 0)], in completion order."},
    {"close", (PyCFunction)Syncer_close, METH_NOARGS,
     "Runs the queued jobs, stops and joins the thread, closes the eventfd."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject SyncerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "store.rpc._native.Syncer",
    .tp_basicsize = sizeof(SyncerObject),
    .tp_dealloc = (destructor)Syncer_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "fsync and close file descriptors on a thread of its own; an eventfd says when "
              "(see store/rpc/_native.pyi).",
    .tp_methods = Syncer_methods,
    .tp_new = Syncer_new,
};

/* Called by the module's init (mr_module.c). */
int mr_sync_add_type(PyObject *module) { return PyModule_AddType(module, &SyncerType); }
