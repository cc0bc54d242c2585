/*
 * CPython binding of the Meridian RPC core (store.rpc._native), plus the UDP adapter's batched
 * system calls (recvmmsg / sendmmsg), so that Python sees whole messages only.
 *
 * The binding is deliberately thin: it converts arguments, turns core events into tuples and
 * moves datagrams between the core's queues and a socket or Python bytes. All protocol logic
 * lives in mr_core.c, which has no Python in it.
 */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <limits.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "mr_core.h"
#include "mr_crc32c.h"
#include "mr_hmac.h"

#define MR_UDP_BATCH 64u
/* Bundling (udp_send): the transmit queue is cut into chunks of this many packets; within a
 * chunk, packets for one destination share datagrams (bundles, MR_MAGIC_BUNDLE) up to the MTU,
 * at most MR_BUNDLES_OPEN destinations at a time. */
#define MR_BUNDLE_CHUNK 256u
#define MR_BUNDLES_OPEN 16u
#define MR_BUNDLE_LEN_BYTES 2u

/* One datagram to send: a packet of the core's queue as it is, or a bundle in txbuf. */
typedef struct {
    const uint8_t *data;
    const uint8_t *addr;
    uint32_t len, addr_len, pkts;
} mr_dgram;

/* A bundle being filled: its first packet is only remembered (sent as it is if none joins). */
typedef struct {
    const uint8_t *addr, *first;
    uint32_t addr_len, first_len, pkts;
    uint8_t *buf; /* NULL until a second packet joins */
    uint32_t len;
} mr_open_bundle;

typedef struct {
    PyObject_HEAD mr_core *core;
    /* recvmmsg scratch: MR_UDP_BATCH buffers of mtu_bytes + 1 (to detect oversize). */
    uint8_t *rxbuf;
    struct mmsghdr *rxmsgs;
    struct iovec *rxiov;
    struct sockaddr_storage *rxaddr;
    /* sendmmsg scratch: a chunk's bundles (MR_BUNDLE_CHUNK / 2 of mtu_bytes) and datagrams. */
    uint8_t *txbuf;
    mr_dgram *dgrams;
    /* Datagrams sent and received (a bundle is one), bundles received malformed. */
    uint64_t tx_datagrams, rx_datagrams, rx_bad_bundles;
} CoreObject;

static void Core_dealloc(CoreObject *self) {
    mr_core_free(self->core);
    PyMem_Free(self->rxbuf);
    PyMem_Free(self->rxmsgs);
    PyMem_Free(self->rxiov);
    PyMem_Free(self->rxaddr);
    PyMem_Free(self->txbuf);
    PyMem_Free(self->dgrams);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int Core_init(CoreObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"mtu_bytes",          "session_credits",  "session_req_window",
                             "rto_ns",             "msg_size_max",     "sessions_max",
                             "server_credits_max", "session_timeout_ns", "backlog_max",
                             "tx_queue_max",       "rx_reassembly_bytes_max", "seed",
                             "rto_held_ns",        "hold_ack_ns",      "rto_max_ns",
                             NULL};
    mr_settings s;
    mr_settings_default(&s);
    unsigned long long rto = s.rto_ns, timeout = s.session_timeout_ns, seed = s.seed;
    unsigned long long reassembly = s.rx_reassembly_bytes_max, rto_held = s.rto_held_ns;
    unsigned long long hold_ack = s.hold_ack_ns, rto_max = s.rto_max_ns;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|$IIIKIIIKIIKKKKK", kwlist, &s.mtu_bytes,
                                     &s.session_credits, &s.session_req_window, &rto,
                                     &s.msg_size_max, &s.sessions_max, &s.server_credits_max,
                                     &timeout, &s.backlog_max, &s.tx_queue_max, &reassembly,
                                     &seed, &rto_held, &hold_ack, &rto_max))
        return -1;
    s.rto_max_ns = rto_max;
    s.rto_held_ns = rto_held;
    s.hold_ack_ns = hold_ack;
    s.rx_reassembly_bytes_max = reassembly;
    s.rto_ns = rto;
    s.session_timeout_ns = timeout;
    s.seed = seed;
    const char *bad = mr_settings_check(&s);
    if (bad != NULL) {
        PyErr_SetString(PyExc_ValueError, bad);
        return -1;
    }
    if (self->core != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Core already initialised");
        return -1;
    }
    self->core = mr_core_new(&s);
    if (self->core == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static int ready(CoreObject *self) {
    if (self->core == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Core not initialised");
        return 0;
    }
    return 1;
}

/* Drain the core's events into a list of tuples. */
static PyObject *take_events(mr_core *c) {
    uint32_t n = mr_core_event_count(c);
    PyObject *list = PyList_New(n);
    if (list == NULL) return NULL;
    mr_event *ev = mr_core_events(c);
    uint32_t i = 0;
    for (; i < n; i++) {
        mr_event *e = &ev[i];
        PyObject *t = NULL;
        switch (e->kind) {
        case MR_EV_REQUEST:
            t = Py_BuildValue("(iiKiy#I)", MR_EV_REQUEST, (int)e->session,
                              (unsigned long long)e->id, (int)e->req_type,
                              e->data ? (const char *)e->data : "", (Py_ssize_t)e->size,
                              (unsigned int)e->code);
            break;
        case MR_EV_RESPONSE:
            t = Py_BuildValue("(iKiy#)", MR_EV_RESPONSE, (unsigned long long)e->id,
                              (int)e->req_type, e->data ? (const char *)e->data : "",
                              (Py_ssize_t)e->size);
            break;
        case MR_EV_FAILED:
            t = Py_BuildValue("(iKi)", MR_EV_FAILED, (unsigned long long)e->id, (int)e->code);
            break;
        default:
            t = Py_BuildValue("(iii)", MR_EV_SESSION, (int)e->session, (int)e->code);
            break;
        }
        free(e->data);
        e->data = NULL;
        if (t == NULL) {
            i++;
            break;
        }
        PyList_SET_ITEM(list, i, t);
    }
    if (i < n || PyErr_Occurred()) {
        /* Conversion failed (out of memory): free what is left and report the error. */
        for (uint32_t k = i; k < n; k++) free(ev[k].data);
        mr_core_events_consume(c, n);
        Py_DECREF(list);
        return NULL;
    }
    mr_core_events_consume(c, n);
    return list;
}

static PyObject *Core_take_events(CoreObject *self, PyObject *Py_UNUSED(ignored)) {
    if (!ready(self)) return NULL;
    return take_events(self->core);
}

static PyObject *Core_create_session(CoreObject *self, PyObject *args) {
    Py_buffer addr;
    unsigned long long now;
    if (!ready(self) || !PyArg_ParseTuple(args, "y*K", &addr, &now)) return NULL;
    int r = (addr.len > 0 && addr.len <= MR_ADDR_MAX)
                ? mr_core_create_session(self->core, addr.buf, (uint32_t)addr.len, now)
                : -MR_ERR_BAD_ARGUMENT;
    PyBuffer_Release(&addr);
    return PyLong_FromLong(r);
}

static PyObject *Core_destroy_session(CoreObject *self, PyObject *args) {
    int session;
    unsigned long long now;
    if (!ready(self) || !PyArg_ParseTuple(args, "iK", &session, &now)) return NULL;
    return PyLong_FromLong(mr_core_destroy_session(self->core, session, now));
}

static PyObject *Core_enqueue_request(CoreObject *self, PyObject *const *args, Py_ssize_t nargs) {
    /* (session, req_type, payload, tag, now_ns): vectorcall-style for the hot path. */
    if (!ready(self)) return NULL;
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "enqueue_request(session, req_type, payload, tag, now_ns)");
        return NULL;
    }
    long session = PyLong_AsLong(args[0]);
    long req_type = PyLong_AsLong(args[1]);
    unsigned long long tag = PyLong_AsUnsignedLongLong(args[3]);
    unsigned long long now = PyLong_AsUnsignedLongLong(args[4]);
    if (PyErr_Occurred()) return NULL;
    if (req_type < 0 || req_type > 255) {
        PyErr_SetString(PyExc_ValueError, "req_type must be in [0, 255]");
        return NULL;
    }
    Py_buffer buf;
    if (PyObject_GetBuffer(args[2], &buf, PyBUF_SIMPLE) != 0) return NULL;
    int r;
    if ((unsigned long long)buf.len > 0xFFFFFFFFull)
        r = -MR_ERR_TOO_LARGE;
    else
        r = mr_core_enqueue_request(self->core, (int)session, (uint8_t)req_type, buf.buf,
                                    (uint32_t)buf.len, tag, now);
    PyBuffer_Release(&buf);
    return PyLong_FromLong(r);
}

static PyObject *Core_respond(CoreObject *self, PyObject *const *args, Py_ssize_t nargs) {
    /* (session, generation, req_num, status, payload, now_ns) */
    if (!ready(self)) return NULL;
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError,
                        "respond(session, generation, req_num, status, payload, now_ns)");
        return NULL;
    }
    long session = PyLong_AsLong(args[0]);
    unsigned long generation = PyLong_AsUnsignedLong(args[1]);
    unsigned long long req_num = PyLong_AsUnsignedLongLong(args[2]);
    long status = PyLong_AsLong(args[3]);
    unsigned long long now = PyLong_AsUnsignedLongLong(args[5]);
    if (PyErr_Occurred()) return NULL;
    if (status < 0 || status > 255) {
        PyErr_SetString(PyExc_ValueError, "status must be in [0, 255]");
        return NULL;
    }
    Py_buffer buf;
    if (PyObject_GetBuffer(args[4], &buf, PyBUF_SIMPLE) != 0) return NULL;
    int r;
    if ((unsigned long long)buf.len > 0xFFFFFFFFull)
        r = -MR_ERR_TOO_LARGE;
    else
        r = mr_core_respond(self->core, (int)session, (uint32_t)generation, req_num,
                            (uint8_t)status, buf.buf, (uint32_t)buf.len, now);
    PyBuffer_Release(&buf);
    return PyLong_FromLong(r);
}

static PyObject *Core_feed(CoreObject *self, PyObject *args) {
    Py_buffer addr, pkt;
    unsigned long long now;
    if (!ready(self) || !PyArg_ParseTuple(args, "y*y*K", &addr, &pkt, &now)) return NULL;
    mr_core_rx(self->core, addr.buf, (uint32_t)(addr.len > MR_ADDR_MAX ? MR_ADDR_MAX + 1 : addr.len),
               pkt.buf, (size_t)pkt.len, now);
    PyBuffer_Release(&addr);
    PyBuffer_Release(&pkt);
    Py_RETURN_NONE;
}

static PyObject *Core_tick(CoreObject *self, PyObject *arg) {
    if (!ready(self)) return NULL;
    unsigned long long now = PyLong_AsUnsignedLongLong(arg);
    if (PyErr_Occurred()) return NULL;
    mr_core_tick(self->core, now);
    Py_RETURN_NONE;
}

static PyObject *Core_next_deadline(CoreObject *self, PyObject *Py_UNUSED(ignored)) {
    if (!ready(self)) return NULL;
    uint64_t d = mr_core_deadline(self->core);
    if (d == UINT64_MAX) return PyLong_FromLong(-1);
    return PyLong_FromUnsignedLongLong(d);
}

static PyObject *Core_pending_packets(CoreObject *self, PyObject *Py_UNUSED(ignored)) {
    if (!ready(self)) return NULL;
    return PyLong_FromUnsignedLong(mr_core_tx_count(self->core));
}

static PyObject *Core_take_packets(CoreObject *self, PyObject *Py_UNUSED(ignored)) {
    if (!ready(self)) return NULL;
    uint32_t n = mr_core_tx_count(self->core);
    PyObject *list = PyList_New(n);
    if (list == NULL) return NULL;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t len, alen;
        const uint8_t *addr;
        const uint8_t *p = mr_core_tx_packet(self->core, i, &len, &addr, &alen);
        PyObject *t = Py_BuildValue("(y#y#)", (const char *)addr, (Py_ssize_t)alen,
                                    (const char *)p, (Py_ssize_t)len);
        if (t == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, t);
    }
    mr_core_tx_consume(self->core, n);
    return list;
}

/* Whether a datagram's first 16 bytes are a bundle's: all zero but the magic. */
static int is_bundle(const uint8_t *d, uint32_t len) {
    if (len < MR_HDR_BYTES) return 0;
    for (uint32_t i = 0; i < MR_HDR_BYTES; i++)
        if (d[i] != (i == 13 ? (uint8_t)(MR_MAGIC_BUNDLE << 4) : 0)) return 0;
    return 1;
}

/* Feeds a received datagram to the core: a bundle packet by packet (each length checked
 * against what is left: a bundle that does not add up is counted and its rest dropped, the
 * packets before the fault having been fed), anything else as one packet. */
static void rx_datagram(CoreObject *self, const uint8_t *addr, uint32_t addr_len,
                        const uint8_t *d, uint32_t len, uint64_t now) {
    if (!is_bundle(d, len)) {
        mr_core_rx(self->core, addr, addr_len, d, len, now);
        return;
    }
    uint32_t pos = MR_HDR_BYTES;
    if (pos == len) {
        self->rx_bad_bundles++; /* an empty bundle: no sender makes one */
        return;
    }
    while (pos < len) {
        if (len - pos < MR_BUNDLE_LEN_BYTES) {
            self->rx_bad_bundles++;
            return;
        }
        uint32_t plen = (uint32_t)d[pos] | ((uint32_t)d[pos + 1] << 8);
        pos += MR_BUNDLE_LEN_BYTES;
        if (plen < MR_HDR_BYTES || plen > len - pos) {
            self->rx_bad_bundles++;
            return;
        }
        mr_core_rx(self->core, addr, addr_len, d + pos, plen, now);
        pos += plen;
    }
}

static int rx_scratch(CoreObject *self) {
    if (self->rxbuf != NULL) return 0;
    size_t slot = mr_core_settings(self->core)->mtu_bytes + 1u;
    self->rxbuf = PyMem_Malloc(slot * MR_UDP_BATCH);
    self->rxmsgs = PyMem_Calloc(MR_UDP_BATCH, sizeof(struct mmsghdr));
    self->rxiov = PyMem_Calloc(MR_UDP_BATCH, sizeof(struct iovec));
    self->rxaddr = PyMem_Calloc(MR_UDP_BATCH, sizeof(struct sockaddr_storage));
    if (!self->rxbuf || !self->rxmsgs || !self->rxiov || !self->rxaddr) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* udp_recv(fd, now_ns, batches_max=16, datagrams_max=0) -> events. Reads datagrams with
 * recvmmsg until the socket is empty (or batches_max batches, or datagrams_max datagrams when
 * that is not 0), feeds them to the core, runs due timers and returns the resulting events.
 * A read that datagrams_max stopped with more perhaps waiting runs only the "held" notices:
 * no timeout is judged before what waits is read (the caller's timer path reads it all). */
static PyObject *Core_udp_recv(CoreObject *self, PyObject *args) {
    int fd;
    unsigned long long now;
    unsigned int batches_max = 16, datagrams_max = 0;
    if (!ready(self) || !PyArg_ParseTuple(args, "iK|II", &fd, &now, &batches_max, &datagrams_max))
        return NULL;
    unsigned int left = datagrams_max ? datagrams_max : UINT_MAX;
    int drained = 0;
    if (rx_scratch(self) != 0) return NULL;
    size_t slot = mr_core_settings(self->core)->mtu_bytes + 1u;
    for (unsigned int b = 0; b < batches_max; b++) {
        for (unsigned int i = 0; i < MR_UDP_BATCH; i++) {
            self->rxiov[i].iov_base = self->rxbuf + i * slot;
            self->rxiov[i].iov_len = slot;
            memset(&self->rxmsgs[i].msg_hdr, 0, sizeof(struct msghdr));
            self->rxmsgs[i].msg_hdr.msg_iov = &self->rxiov[i];
            self->rxmsgs[i].msg_hdr.msg_iovlen = 1;
            self->rxmsgs[i].msg_hdr.msg_name = &self->rxaddr[i];
            self->rxmsgs[i].msg_hdr.msg_namelen = sizeof(struct sockaddr_storage);
        }
        unsigned int vlen = left < MR_UDP_BATCH ? left : MR_UDP_BATCH;
        int n = recvmmsg(fd, self->rxmsgs, vlen, MSG_DONTWAIT, NULL);
        if (n < 0) {
            if (errno == EINTR) continue;
            drained = 1;
            break; /* EAGAIN: drained; other errors: nothing to read now */
        }
        for (int i = 0; i < n; i++) {
            struct msghdr *h = &self->rxmsgs[i].msg_hdr;
            if ((h->msg_flags & MSG_TRUNC) || self->rxmsgs[i].msg_len >= slot) {
                mr_core_rx_oversized(self->core);
                continue;
            }
            uint32_t alen = h->msg_namelen > MR_ADDR_MAX ? MR_ADDR_MAX : h->msg_namelen;
            self->rx_datagrams++;
            rx_datagram(self, (const uint8_t *)h->msg_name, alen,
                        (const uint8_t *)self->rxiov[i].iov_base, self->rxmsgs[i].msg_len, now);
        }
        left -= (unsigned int)n;
        if ((unsigned int)n < vlen) {
            drained = 1;
            break;
        }
        if (left == 0) break;
    }
    if (drained || datagrams_max == 0)
        mr_core_tick(self->core, now);
    else
        mr_core_tick_holds(self->core, now);
    return take_events(self->core);
}

static int tx_scratch(CoreObject *self) {
    if (self->txbuf != NULL) return 0;
    size_t mtu = mr_core_settings(self->core)->mtu_bytes;
    self->txbuf = PyMem_Malloc(mtu * (MR_BUNDLE_CHUNK / 2));
    self->dgrams = PyMem_Calloc(MR_BUNDLE_CHUNK, sizeof(mr_dgram));
    if (!self->txbuf || !self->dgrams) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* Ends an open bundle: a datagram of its packets (or its one packet as it is). */
static void bundle_close(mr_open_bundle *b, mr_dgram *out, uint32_t *count) {
    mr_dgram *g = &out[(*count)++];
    g->addr = b->addr;
    g->addr_len = b->addr_len;
    g->pkts = b->pkts;
    if (b->buf == NULL) {
        g->data = b->first;
        g->len = b->first_len;
    } else {
        g->data = b->buf;
        g->len = b->len;
    }
    b->pkts = 0;
}

static void bundle_put(uint8_t *buf, uint32_t *len, const uint8_t *pkt, uint32_t plen) {
    buf[*len] = (uint8_t)(plen & 0xFF);
    buf[*len + 1] = (uint8_t)(plen >> 8);
    memcpy(buf + *len + MR_BUNDLE_LEN_BYTES, pkt, plen);
    *len += MR_BUNDLE_LEN_BYTES + plen;
}

/* Packets [first, first + n) of the transmit queue as datagrams: per destination, in queue
 * order, as many packets per datagram as fit in the MTU. Returns the number of datagrams. */
static uint32_t bundle_chunk(CoreObject *self, uint32_t first, uint32_t n) {
    mr_core *c = self->core;
    uint32_t mtu = mr_core_settings(c)->mtu_bytes;
    mr_open_bundle open[MR_BUNDLES_OPEN];
    uint32_t opened = 0, evict = 0, count = 0, regions = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t len, alen;
        const uint8_t *addr;
        const uint8_t *p = mr_core_tx_packet(c, first + i, &len, &addr, &alen);
        mr_open_bundle *b = NULL;
        for (uint32_t k = 0; k < opened; k++) {
            if (open[k].pkts && open[k].addr_len == alen && memcmp(open[k].addr, addr, alen) == 0) {
                b = &open[k];
                break;
            }
        }
        if (b != NULL) {
            uint32_t room = b->buf == NULL ? MR_HDR_BYTES + MR_BUNDLE_LEN_BYTES + b->first_len : b->len;
            if (room + MR_BUNDLE_LEN_BYTES + len <= mtu) {
                if (b->buf == NULL) {
                    /* Regions: at most one per two packets of the chunk, so n / 2 suffice. */
                    b->buf = self->txbuf + (size_t)(regions++) * mtu;
                    memset(b->buf, 0, MR_HDR_BYTES);
                    b->buf[13] = (uint8_t)(MR_MAGIC_BUNDLE << 4);
                    b->len = MR_HDR_BYTES;
                    bundle_put(b->buf, &b->len, b->first, b->first_len);
                }
                bundle_put(b->buf, &b->len, p, len);
                b->pkts++;
                continue;
            }
            bundle_close(b, self->dgrams, &count); /* full: this packet starts the next */
        } else if (opened < MR_BUNDLES_OPEN) {
            b = &open[opened++];
        } else {
            for (uint32_t k = 0; k < opened && b == NULL; k++)
                if (open[k].pkts == 0) b = &open[k];
            if (b == NULL) {
                b = &open[evict];
                evict = (evict + 1) % MR_BUNDLES_OPEN;
                bundle_close(b, self->dgrams, &count);
            }
        }
        b->addr = addr;
        b->addr_len = alen;
        b->first = p;
        b->first_len = len;
        b->pkts = 1;
        b->buf = NULL;
    }
    for (uint32_t k = 0; k < opened; k++)
        if (open[k].pkts) bundle_close(&open[k], self->dgrams, &count);
    return count;
}

/* udp_send(fd) -> packets sent. Sends the whole transmit queue with sendmmsg, packets for one
 * destination bundled into shared datagrams (MR_MAGIC_BUNDLE): the kernel's cost of a
 * loopback or LAN datagram is nearly all per datagram (measured here: about 4 us to send and
 * 1 us to receive one, 80 bytes or 1,200), so a server answering many requests of one client
 * in a step pays for one datagram, not for each answer. Datagrams the kernel refuses (full
 * buffer, unreachable) are dropped and their packets counted: the protocol's retransmission
 * recovers, as it would from a loss on the wire. */
static PyObject *Core_udp_send(CoreObject *self, PyObject *arg) {
    if (!ready(self)) return NULL;
    int fd = PyLong_AsLong(arg);
    if (PyErr_Occurred()) return NULL;
    if (tx_scratch(self) != 0) return NULL;
    mr_core *c = self->core;
    uint32_t total = mr_core_tx_count(c), sent = 0;
    int stopped = 0;
    struct mmsghdr msgs[MR_UDP_BATCH];
    struct iovec iov[MR_UDP_BATCH];
    for (uint32_t first = 0; first < total && !stopped; first += MR_BUNDLE_CHUNK) {
        uint32_t n = total - first < MR_BUNDLE_CHUNK ? total - first : MR_BUNDLE_CHUNK;
        uint32_t count = bundle_chunk(self, first, n), done = 0;
        while (done < count) {
            uint32_t m = count - done < MR_UDP_BATCH ? count - done : MR_UDP_BATCH;
            for (uint32_t i = 0; i < m; i++) {
                const mr_dgram *g = &self->dgrams[done + i];
                iov[i].iov_base = (void *)g->data;
                iov[i].iov_len = g->len;
                memset(&msgs[i], 0, sizeof(msgs[i]));
                msgs[i].msg_hdr.msg_iov = &iov[i];
                msgs[i].msg_hdr.msg_iovlen = 1;
                msgs[i].msg_hdr.msg_name = (void *)g->addr;
                msgs[i].msg_hdr.msg_namelen = g->addr_len;
            }
            int r = sendmmsg(fd, msgs, m, MSG_DONTWAIT);
            if (r < 0) {
                if (errno == EINTR) continue;
                if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS) {
                    stopped = 1; /* everything not sent yet is dropped, counted below */
                    break;
                }
                r = 1; /* this datagram refused (bad address): skip it */
            } else {
                for (int i = 0; i < r; i++) sent += self->dgrams[done + (uint32_t)i].pkts;
                self->tx_datagrams += (uint32_t)r;
            }
            done += (uint32_t)r;
        }
    }
    if (sent < total) mr_core_stats_tx_failed(c, total - sent); /* refused, or not sent */
    mr_core_tx_consume(c, total);
    return PyLong_FromUnsignedLong(sent);
}

static PyObject *Core_stats(CoreObject *self, PyObject *Py_UNUSED(ignored)) {
    if (!ready(self)) return NULL;
    mr_stats *s = mr_core_stats(self->core);
#define F(name) #name, (unsigned long long)s->name
    PyObject *stats = Py_BuildValue(
        "{sKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsK}",
        F(rx_pkts), F(rx_bytes), F(tx_pkts), F(tx_bytes), F(rx_short), F(rx_oversized), F(rx_bad_magic), F(rx_malformed), F(rx_no_buffer), F(rx_unknown_session), F(rx_stale), F(rx_out_of_order), F(rx_dup_answered), F(rx_dup_in_handler), F(rx_held), F(held_sent), F(retransmits), F(requests_handled), F(responses_received), F(sessions_refused), F(sm_unauthenticated), F(sessions_failed), F(tx_queue_dropped), F(tx_send_failed), F(fault_dropped), F(fault_duplicated), F(fault_delayed), F(in_flight_max));
#undef F
    if (stats == NULL) return NULL;
    /* The UDP adapter's own: datagrams (a bundle is one) and malformed bundles. */
    const char *names[] = {"tx_datagrams", "rx_datagrams", "rx_bad_bundles"};
    uint64_t values[] = {self->tx_datagrams, self->rx_datagrams, self->rx_bad_bundles};
    for (int i = 0; i < 3; i++) {
        PyObject *v = PyLong_FromUnsignedLongLong(values[i]);
        if (v == NULL || PyDict_SetItemString(stats, names[i], v) != 0) {
            Py_XDECREF(v);
            Py_DECREF(stats);
            return NULL;
        }
        Py_DECREF(v);
    }
    return stats;
}

static PyObject *Core_session_info(CoreObject *self, PyObject *arg) {
    if (!ready(self)) return NULL;
    long n = PyLong_AsLong(arg);
    if (PyErr_Occurred()) return NULL;
    mr_session_info i;
    if (n < 0 || n > 0xFFFF || mr_core_session_info(self->core, (int)n, &i) != 0) {
        PyErr_SetString(PyExc_ValueError, "no such session number");
        return NULL;
    }
    static const char *roles[] = {"free", "client", "server"};
    static const char *states[] = {"free", "connecting", "connected", "disconnecting", "failed"};
    return Py_BuildValue("{sssssIsIsIsIsIsisisisKsKsK}", "role", roles[i.role % 3], "state",
                         states[i.state % 5], "credits", i.credits, "credits_max", i.credits_max,
                         "in_flight_max", i.in_flight_max, "busy_slots", i.busy_slots, "backlog",
                         i.backlog, "remote_session", (int)i.remote_session, "local_tag",
                         (int)i.local_tag, "remote_tag", (int)i.remote_tag, "srtt_ns",
                         (unsigned long long)i.srtt_ns, "rttvar_ns",
                         (unsigned long long)i.rttvar_ns, "rto_ns", (unsigned long long)i.rto_ns);
}

static PyObject *Core_set_fault(CoreObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"addr",    "drop",           "duplicate",        "reorder",
                             "delay_ns", "reorder_delay_ns", "partitioned", NULL};
    PyObject *addr_obj = Py_None;
    double drop = 0, dup = 0, reorder = 0;
    unsigned long long delay = 0, reorder_delay = 0;
    int partitioned = 0;
    if (!ready(self) ||
        !PyArg_ParseTupleAndKeywords(args, kwds, "O|$dddKKp", kwlist, &addr_obj, &drop, &dup,
                                     &reorder, &delay, &reorder_delay, &partitioned))
        return NULL;
    const uint8_t *a = NULL;
    Py_ssize_t alen = 0;
    if (addr_obj != Py_None) {
        if (!PyBytes_Check(addr_obj)) {
            PyErr_SetString(PyExc_TypeError, "addr must be bytes or None");
            return NULL;
        }
        a = (const uint8_t *)PyBytes_AS_STRING(addr_obj);
        alen = PyBytes_GET_SIZE(addr_obj);
        if (alen == 0 || alen > MR_ADDR_MAX) {
            PyErr_SetString(PyExc_ValueError, "addr length must be in [1, 32]");
            return NULL;
        }
    }
    if (mr_core_set_fault(self->core, a, (uint32_t)alen, drop, dup, reorder, delay,
                          reorder_delay, partitioned) != 0) {
        PyErr_SetString(PyExc_ValueError, "bad fault rule (probabilities in [0,1], <= 16 rules)");
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *Core_set_secret(CoreObject *self, PyObject *arg) {
    if (!ready(self)) return NULL;
    Py_buffer key;
    if (PyObject_GetBuffer(arg, &key, PyBUF_SIMPLE) < 0) return NULL;
    int r = key.len > 64 ? -MR_ERR_BAD_ARGUMENT
                         : mr_core_set_secret(self->core, key.buf, (uint32_t)key.len);
    PyBuffer_Release(&key);
    if (r) {
        PyErr_SetString(PyExc_ValueError, "a cluster secret is 16 to 64 bytes (or empty: none)");
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *Core_clear_faults(CoreObject *self, PyObject *Py_UNUSED(ignored)) {
    if (!ready(self)) return NULL;
    mr_core_clear_faults(self->core);
    Py_RETURN_NONE;
}

static PyObject *Core_get_incarnation(CoreObject *self, void *Py_UNUSED(closure)) {
    if (!ready(self)) return NULL;
    return PyLong_FromUnsignedLongLong(mr_core_incarnation(self->core));
}

static PyObject *Core_get_settings(CoreObject *self, void *Py_UNUSED(closure)) {
    if (!ready(self)) return NULL;
    const mr_settings *s = mr_core_settings(self->core);
    return Py_BuildValue("{sIsIsIsKsKsKsKsIsIsIsKsIsIsKsK}", "mtu_bytes", s->mtu_bytes, "session_credits",
                         s->session_credits, "session_req_window", s->session_req_window,
                         "rto_ns", (unsigned long long)s->rto_ns, "rto_max_ns",
                         (unsigned long long)s->rto_max_ns, "rto_held_ns",
                         (unsigned long long)s->rto_held_ns, "hold_ack_ns",
                         (unsigned long long)s->hold_ack_ns, "msg_size_max", s->msg_size_max,
                         "sessions_max", s->sessions_max, "server_credits_max",
                         s->server_credits_max, "session_timeout_ns",
                         (unsigned long long)s->session_timeout_ns, "backlog_max", s->backlog_max,
                         "tx_queue_max", s->tx_queue_max, "rx_reassembly_bytes_max",
                         (unsigned long long)s->rx_reassembly_bytes_max, "seed",
                         (unsigned long long)s->seed);
}

static PyMethodDef Core_methods[] = {
    {"create_session", (PyCFunction)Core_create_session, METH_VARARGS, NULL},
    {"destroy_session", (PyCFunction)Core_destroy_session, METH_VARARGS, NULL},
    {"enqueue_request", (PyCFunction)(void (*)(void))Core_enqueue_request, METH_FASTCALL, NULL},
    {"respond", (PyCFunction)(void (*)(void))Core_respond, METH_FASTCALL, NULL},
    {"feed", (PyCFunction)Core_feed, METH_VARARGS, NULL},
    {"tick", (PyCFunction)Core_tick, METH_O, NULL},
    {"next_deadline", (PyCFunction)Core_next_deadline, METH_NOARGS, NULL},
    {"take_events", (PyCFunction)Core_take_events, METH_NOARGS, NULL},
    {"take_packets", (PyCFunction)Core_take_packets, METH_NOARGS, NULL},
    {"pending_packets", (PyCFunction)Core_pending_packets, METH_NOARGS, NULL},
    {"udp_recv", (PyCFunction)Core_udp_recv, METH_VARARGS, NULL},
    {"udp_send", (PyCFunction)Core_udp_send, METH_O, NULL},
    {"stats", (PyCFunction)Core_stats, METH_NOARGS, NULL},
    {"session_info", (PyCFunction)Core_session_info, METH_O, NULL},
    {"set_fault", (PyCFunction)(void (*)(void))Core_set_fault, METH_VARARGS | METH_KEYWORDS, NULL},
    {"clear_faults", (PyCFunction)Core_clear_faults, METH_NOARGS, NULL},
    {"set_secret", (PyCFunction)Core_set_secret, METH_O, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Core_getset[] = {
    {"incarnation", (getter)Core_get_incarnation, NULL, NULL, NULL},
    {"settings", (getter)Core_get_settings, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject CoreType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "store.rpc._native.Core",
    .tp_basicsize = sizeof(CoreObject),
    .tp_dealloc = (destructor)Core_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Sans-I/O eRPC-style protocol core (see docs/rpc.md).",
    .tp_methods = Core_methods,
    .tp_getset = Core_getset,
    .tp_init = (initproc)Core_init,
    .tp_new = PyType_GenericNew,
};

static PyObject *mod_decode_header(PyObject *Py_UNUSED(m), PyObject *arg) {
    Py_buffer b;
    if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) != 0) return NULL;
    mr_hdr h;
    int r = mr_hdr_decode(b.buf, (size_t)b.len, &h);
    PyBuffer_Release(&b);
    if (r != 0) Py_RETURN_NONE;
    return Py_BuildValue("(iIiiiKii)", (int)h.req_type, h.msg_size, (int)h.dest_session,
                         (int)h.pkt_type, (int)h.pkt_num, (unsigned long long)h.req_num,
                         (int)h.magic, (int)h.session_tag);
}

static PyObject *mod_encode_header(PyObject *Py_UNUSED(m), PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"req_type", "msg_size", "dest_session", "pkt_type", "pkt_num",
                             "req_num",  "magic",    "session_tag",  NULL};
    unsigned int req_type, msg_size, dest, pkt_type, pkt_num, magic = MR_MAGIC_DATA, tag = 0;
    unsigned long long req_num;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "IIIIIK|II", kwlist, &req_type, &msg_size, &dest,
                                     &pkt_type, &pkt_num, &req_num, &magic, &tag))
        return NULL;
    if (req_type > 255 || msg_size > MR_MSG_SIZE_LIMIT || dest > 0xFFFF || pkt_type > 3 ||
        pkt_num >= MR_PKT_NUM_LIMIT || req_num > MR_REQ_NUM_MASK || magic > 0xF || tag > 0xFFFF) {
        PyErr_SetString(PyExc_ValueError, "header field out of range");
        return NULL;
    }
    mr_hdr h = {(uint8_t)req_type, msg_size, (uint16_t)dest, (uint8_t)pkt_type,
                (uint16_t)pkt_num, req_num, (uint8_t)magic, (uint16_t)tag};
    uint8_t out[MR_HDR_BYTES];
    mr_hdr_encode(out, &h);
    return PyBytes_FromStringAndSize((const char *)out, MR_HDR_BYTES);
}

static PyObject *mod_hmac_sha256(PyObject *Py_UNUSED(m), PyObject *args) {
    Py_buffer key, msg;
    if (!PyArg_ParseTuple(args, "y*y*", &key, &msg)) return NULL;
    uint8_t out[MR_HMAC_BYTES];
    mr_hmac_sha256(key.buf, (size_t)key.len, msg.buf, (size_t)msg.len, NULL, 0, out);
    PyBuffer_Release(&key);
    PyBuffer_Release(&msg);
    return PyBytes_FromStringAndSize((const char *)out, MR_HMAC_BYTES);
}

static PyObject *mod_crc32c(PyObject *Py_UNUSED(m), PyObject *args) {
    Py_buffer data;
    unsigned int crc = 0;
    if (!PyArg_ParseTuple(args, "y*|I", &data, &crc)) return NULL;
    uint32_t out;
    Py_BEGIN_ALLOW_THREADS
    out = mr_crc32c((uint32_t)crc, data.buf, (size_t)data.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    return PyLong_FromUnsignedLong(out);
}

static PyMethodDef module_methods[] = {
    {"crc32c", (PyCFunction)mod_crc32c, METH_VARARGS, NULL},
    {"hmac_sha256", (PyCFunction)mod_hmac_sha256, METH_VARARGS, NULL},
    {"decode_header", (PyCFunction)mod_decode_header, METH_O, NULL},
    {"encode_header", (PyCFunction)(void (*)(void))mod_encode_header, METH_VARARGS | METH_KEYWORDS,
     NULL},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "store.rpc._native", "Meridian RPC protocol core (C).", -1,
    module_methods,
};

int mr_sync_add_type(PyObject *module); /* the Syncer type, native/mr_sync.c */
int mr_counter_add_type(PyObject *module); /* the SharedCounter type, native/mr_counter.c */
int mr_vwshare_add_type(PyObject *module); /* the SharedWatermarks type, native/mr_vwshare.c */
int mr_timer_add_type(PyObject *module); /* the TimerFd type, native/mr_timer.c */

PyMODINIT_FUNC PyInit__native(void) {
    if (PyType_Ready(&CoreType) < 0) return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (m == NULL) return NULL;
    Py_INCREF(&CoreType);
    if (PyModule_AddObject(m, "Core", (PyObject *)&CoreType) < 0) {
        Py_DECREF(&CoreType);
        Py_DECREF(m);
        return NULL;
    }
    if (mr_sync_add_type(m) < 0 || mr_counter_add_type(m) < 0 || mr_vwshare_add_type(m) < 0 ||
        mr_timer_add_type(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    PyModule_AddIntConstant(m, "HEADER_BYTES", MR_HDR_BYTES);
    PyModule_AddIntConstant(m, "ADDR_MAX", MR_ADDR_MAX);
    PyModule_AddIntConstant(m, "MAGIC_DATA", MR_MAGIC_DATA);
    PyModule_AddIntConstant(m, "MAGIC_SM", MR_MAGIC_SM);
    PyModule_AddIntConstant(m, "MAGIC_BUNDLE", MR_MAGIC_BUNDLE);
    PyModule_AddIntConstant(m, "MSG_SIZE_LIMIT", MR_MSG_SIZE_LIMIT);
    PyModule_AddIntConstant(m, "SM_BODY_BYTES", MR_SM_BODY_BYTES);
    return m;
}
