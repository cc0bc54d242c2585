/* Shared memory files of the C extension: see native/mr_shm.h. */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mr_shm.h"

int mr_shm_open_locked(const char *path, bool create, off_t *size) {
    int fd = open(path, O_RDWR | O_CLOEXEC | (create ? O_CREAT : 0), 0600);
    if (fd < 0) {
        PyErr_SetFromErrnoWithFilename(PyExc_OSError, path);
        return -1;
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    do {
        rc = flock(fd, LOCK_EX);
    } while (rc < 0 && errno == EINTR);
    Py_END_ALLOW_THREADS
    struct stat st;
    if (rc < 0 || fstat(fd, &st) < 0) {
        PyErr_SetFromErrnoWithFilename(PyExc_OSError, path);
        close(fd);
        return -1;
    }
    *size = st.st_size;
    return fd;
}

void *mr_shm_map(int fd, size_t bytes, const char *path) {
    void *map = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int map_errno = errno;
    flock(fd, LOCK_UN);
    close(fd);
    if (map == MAP_FAILED) {
        errno = map_errno;
        PyErr_SetFromErrnoWithFilename(PyExc_OSError, path);
        return NULL;
    }
    return map;
}
