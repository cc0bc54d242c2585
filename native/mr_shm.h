/*
 * Shared memory files of the C extension (native/mr_counter.c, native/mr_vwshare.c): the
 * files a shard's worker processes map together. Opening one takes an exclusive flock, so
 * that two processes creating it at once cannot both write its header; the caller checks
 * or writes the header under it, then maps the file, which drops the lock.
 */
#ifndef MR_SHM_H
#define MR_SHM_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* Opens `path` read-write (with create, creating it if missing), waits for an exclusive
 * flock on it and reads its size into *size. Returns the fd, or -1 with a Python OSError
 * set (and nothing left open). */
int mr_shm_open_locked(const char *path, bool create, off_t *size);

/* Maps `bytes` of the file shared, then unlocks and closes the fd (the mapping keeps the
 * file, and so a flock on it, alive: hence the explicit unlock). Returns the mapping, or
 * NULL with a Python OSError set. */
void *mr_shm_map(int fd, size_t bytes, const char *path);

#endif
