/*
 * Meridian RPC protocol core. Theory of operation: mr_core.h and docs/rpc.md.
 *
 * File layout, by concern (as eRPC splits rpc_rx / rpc_tx / rpc_pkt_loss):
 *   codec        header encode/decode, session-management bodies
 *   queues       transmit queue, fault injection, events
 *   sessions     allocation, handshake (slow path)
 *   client       enqueue_request, transmit, receive CR/RESP, retransmission
 *   server       receive REQ/RFR, respond
 *   dispatch     mr_core_rx, mr_core_tick
 */
#include "mr_core.h"
#include "mr_hmac.h"

#include <stdlib.h>
#include <string.h>

enum { MR_ROLE_FREE = 0, MR_ROLE_CLIENT = 1, MR_ROLE_SERVER = 2 };
enum {
    MR_SS_FREE = 0,
    MR_SS_CONNECTING = 1,
    MR_SS_CONNECTED = 2,
    MR_SS_DISCONNECTING = 3,
    MR_SS_FAILED = 4,
};
/* Server slot states. */
enum { MR_SLOT_EMPTY = 0, MR_SLOT_RECEIVING = 1, MR_SLOT_IN_HANDLER = 2, MR_SLOT_RESPONDED = 3 };
/* Client slot states. */
enum { MR_SLOT_FREE = 0, MR_SLOT_BUSY = 1 };

typedef struct mr_slot {
    uint64_t req_num;
    uint8_t state;
    uint8_t req_type;
    uint8_t status; /* server: response status byte */
    uint32_t req_size, req_pkts;
    uint8_t *req_buf;
    uint32_t resp_size, resp_pkts;
    uint8_t *resp_buf;
    uint32_t num_tx, num_rx; /* client: wire-order packet counts; server: num_rx only */
    uint64_t tag;
    uint64_t progress_at;
    uint8_t held; /* client: the server said its handler holds the whole request */
    uint64_t sample_at; /* client: last request packet's first send (0: not yet; MAX: no sample) */
} mr_slot;

typedef struct mr_backlog {
    struct mr_backlog *next;
    uint64_t tag;
    uint8_t req_type;
    uint32_t size;
    uint8_t *data;
} mr_backlog;

typedef struct mr_session {
    uint8_t role, state;
    uint16_t local_num, remote_num;
    uint8_t addr[MR_ADDR_MAX];
    uint32_t addr_len;
    uint64_t token;
    uint64_t client_incarnation; /* server role: the client's, to spot a restarted client */
    uint64_t peer_incarnation;   /* client role: the server's */
    uint32_t credits_max, credits, in_flight_max;
    uint32_t busy_slots;
    uint64_t alive_at;     /* last evidence the peer is alive, or when work began */
    uint64_t sm_started_at, sm_sent_at, ping_sent_at;
    mr_slot *slots;
    mr_backlog *backlog_head, *backlog_tail;
    uint32_t backlog_len;
    uint32_t kick_cursor;
    /* client: a bit per slot of the window that may have packets to send (set where a slot
     * can become sendable: started, a packet received, rolled back; cleared by client_kick
     * when it finds the slot has none), so that a kick visits only those. */
    uint64_t kick_bits[1024 / 64];
    uint32_t generation; /* distinguishes successive sessions with the same number */
    uint64_t srtt_ns, rttvar_ns, rto_cur_ns; /* client: RFC 6298 estimate (0: no sample) */
    uint16_t local_tag;  /* carried by data packets to this end */
    uint16_t remote_tag; /* put on data packets to the peer */
} mr_session;

typedef struct mr_txent {
    uint32_t len;
    uint32_t addr_len;
    uint8_t addr[MR_ADDR_MAX];
} mr_txent;

typedef struct mr_delayed {
    uint64_t release_at;
    uint32_t len, addr_len;
    uint8_t addr[MR_ADDR_MAX];
    uint8_t *data;
} mr_delayed;

/* A request handed to its handler, to be said "held" at due_at if still there. */
typedef struct mr_holdent {
    uint64_t due_at, req_num;
    uint32_t session, generation;
} mr_holdent;

typedef struct mr_fault {
    uint32_t addr_len; /* 0: default rule */
    uint8_t addr[MR_ADDR_MAX];
    double drop, duplicate, reorder;
    uint64_t delay_ns, reorder_delay_ns;
    int partitioned;
} mr_fault;

struct mr_core {
    mr_settings s;
    uint32_t payload_max;
    uint64_t rng;
    uint64_t incarnation;
    uint64_t deadline_at;

    mr_session *sessions;
    uint32_t server_credits_used;
    uint32_t next_generation;
    uint32_t alloc_cursor; /* round-robin session numbers: slow reuse of a number */
    uint64_t rx_reassembly_bytes; /* server: bytes of requests still being received */

    mr_txent *tx;
    uint8_t *txbuf;
    uint32_t tx_len, tx_cap;

    mr_delayed *delayed;
    uint32_t delayed_len, delayed_cap;

    mr_holdent *hold; /* ring, oldest first: due_at grows with delivery time */
    uint32_t hold_head, hold_len, hold_cap;
    /* How long after delivery "held" is said: hold_ack_ns, at most half the client's timeout
     * (so that "held" arrives before its retransmission). */
    uint64_t hold_wait_ns;

    mr_event *ev;
    uint32_t ev_len, ev_cap;

    mr_fault faults[MR_FAULT_RULES_MAX];
    uint32_t faults_len;

    mr_stats stats;

    uint8_t secret[64];
    uint32_t secret_len; /* 0: session packets are neither signed nor checked */
};

/* ------------------------------------------------------------------ codec */

static uint64_t rd64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}
static void wr64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) {
        p[i] = (uint8_t)(v & 0xFF);
        v >>= 8;
    }
}
static uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
           ((uint32_t)p[3] << 24);
}
static void wr32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) {
        p[i] = (uint8_t)(v & 0xFF);
        v >>= 8;
    }
}
static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static void wr16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)(v & 0xFF);
    p[1] = (uint8_t)(v >> 8);
}

/* Word 0: req_type:8 | msg_size:24 | dest_session:16 | pkt_type:2 | pkt_num:14 (LSB first).
 * Word 1: req_num:44 | magic:4 | session_tag:16. Both little-endian. */
void mr_hdr_encode(uint8_t *out, const mr_hdr *h) {
    uint64_t w0 = (uint64_t)h->req_type | ((uint64_t)(h->msg_size & 0xFFFFFFu) << 8) |
                  ((uint64_t)h->dest_session << 32) | ((uint64_t)(h->pkt_type & 3u) << 48) |
                  ((uint64_t)(h->pkt_num & 0x3FFFu) << 50);
    uint64_t w1 = (h->req_num & MR_REQ_NUM_MASK) | ((uint64_t)(h->magic & 0xFu) << 44) |
                  ((uint64_t)h->session_tag << 48);
    wr64(out, w0);
    wr64(out + 8, w1);
}

int mr_hdr_decode(const uint8_t *pkt, size_t len, mr_hdr *h) {
    if (pkt == NULL || len < MR_HDR_BYTES) return -1;
    uint64_t w0 = rd64(pkt), w1 = rd64(pkt + 8);
    h->req_type = (uint8_t)(w0 & 0xFF);
    h->msg_size = (uint32_t)((w0 >> 8) & 0xFFFFFFu);
    h->dest_session = (uint16_t)((w0 >> 32) & 0xFFFFu);
    h->pkt_type = (uint8_t)((w0 >> 48) & 3u);
    h->pkt_num = (uint16_t)((w0 >> 50) & 0x3FFFu);
    h->req_num = w1 & MR_REQ_NUM_MASK;
    h->magic = (uint8_t)((w1 >> 44) & 0xFu);
    h->session_tag = (uint16_t)(w1 >> 48);
    if (h->magic != MR_MAGIC_DATA && h->magic != MR_MAGIC_SM) return -1;
    return 0;
}

typedef struct mr_sm_body {
    uint64_t token, client_incarnation, server_incarnation;
    uint16_t client_session, server_session;
    uint32_t credits;
    uint16_t client_tag, server_tag;
} mr_sm_body;

static void sm_body_encode(uint8_t *out, const mr_sm_body *b) {
    wr64(out, b->token);
    wr64(out + 8, b->client_incarnation);
    wr64(out + 16, b->server_incarnation);
    wr16(out + 24, b->client_session);
    wr16(out + 26, b->server_session);
    wr32(out + 28, b->credits);
    wr16(out + 32, b->client_tag);
    wr16(out + 34, b->server_tag);
    wr32(out + 36, 0);
}
static void sm_body_decode(const uint8_t *in, mr_sm_body *b) {
    b->token = rd64(in);
    b->client_incarnation = rd64(in + 8);
    b->server_incarnation = rd64(in + 16);
    b->client_session = rd16(in + 24);
    b->server_session = rd16(in + 26);
    b->credits = rd32(in + 28);
    b->client_tag = rd16(in + 32);
    b->server_tag = rd16(in + 34);
}

/* ------------------------------------------------------------- utilities */

static uint64_t rng_next(mr_core *c) {
    /* splitmix64: small, seedable, good enough for tokens and fault injection. */
    uint64_t z = (c->rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double rng_unit(mr_core *c) { return (double)(rng_next(c) >> 11) * (1.0 / 9007199254740992.0); }

static uint32_t pkts_for(const mr_core *c, uint32_t size) {
    return size == 0 ? 1u : (size + c->payload_max - 1) / c->payload_max;
}
static uint32_t pkt_len_for(const mr_core *c, uint32_t size, uint32_t index) {
    uint64_t off = (uint64_t)index * c->payload_max;
    if (off >= size) return 0;
    uint64_t rest = size - off;
    return rest < c->payload_max ? (uint32_t)rest : c->payload_max;
}
/* Time since `then`; 0 if the caller's clock went backwards (time is an argument here, and a
 * caller's mistake must not look like an expired timer). */
static uint64_t elapsed(uint64_t now, uint64_t then) { return now > then ? now - then : 0; }

static void lower_deadline(mr_core *c, uint64_t at) {
    if (at < c->deadline_at) c->deadline_at = at;
}
static int addr_eq(const uint8_t *a, uint32_t alen, const uint8_t *b, uint32_t blen) {
    return alen == blen && memcmp(a, b, alen) == 0;
}

/* --------------------------------------------------------------- settings */

void mr_settings_default(mr_settings *s) {
    memset(s, 0, sizeof(*s));
    s->mtu_bytes = 1472; /* an Ethernet frame's UDP payload */
    s->session_credits = 32;
    s->session_req_window = 8;
    s->rto_ns = 5000000ull;
    s->rto_held_ns = 50000000ull;
    s->rto_max_ns = 20000000ull;
    s->hold_ack_ns = 2500000ull;
    s->msg_size_max = 8u << 20;
    s->sessions_max = 256;
    s->server_credits_max = 256u * 32u;
    s->session_timeout_ns = 1000000000ull;
    s->backlog_max = 4096;
    s->tx_queue_max = 65536;
    s->rx_reassembly_bytes_max = 256ull << 20;
    s->seed = 1;
}

const char *mr_settings_check(const mr_settings *s) {
    if (s->mtu_bytes < 64 || s->mtu_bytes > 65507) return "mtu_bytes must be in [64, 65507]";
    if (s->session_credits < 1 || s->session_credits > 1024)
        return "session_credits must be in [1, 1024]";
    if (s->session_req_window < 1 || s->session_req_window > 1024)
        return "session_req_window must be in [1, 1024]";
    if (s->rto_ns < 1000) return "rto_ns must be >= 1000";
    if (s->rto_held_ns < s->rto_ns) return "rto_held_ns must be >= rto_ns";
    if (s->msg_size_max > MR_MSG_SIZE_LIMIT) return "msg_size_max must be < 2**24";
    uint32_t payload = s->mtu_bytes - MR_HDR_BYTES;
    uint64_t pkts = ((uint64_t)s->msg_size_max + payload - 1) / payload;
    if (pkts > MR_PKT_NUM_LIMIT) return "msg_size_max needs more than 2**14 packets at this mtu";
    if (s->sessions_max < 1 || s->sessions_max > 0xFFFF) return "sessions_max must be in [1, 65535]";
    if (s->session_timeout_ns < s->rto_ns) return "session_timeout_ns must be >= rto_ns";
    if (s->tx_queue_max < 16) return "tx_queue_max must be >= 16";
    if (s->rx_reassembly_bytes_max < s->msg_size_max)
        return "rx_reassembly_bytes_max must be >= msg_size_max";
    return NULL;
}

mr_core *mr_core_new(const mr_settings *s) {
    if (mr_settings_check(s) != NULL) return NULL;
    mr_core *c = calloc(1, sizeof(*c));
    if (c == NULL) return NULL;
    c->s = *s;
    c->payload_max = s->mtu_bytes - MR_HDR_BYTES;
    c->hold_wait_ns = s->hold_ack_ns < s->rto_ns / 2 ? s->hold_ack_ns : s->rto_ns / 2;
    c->rng = s->seed;
    c->incarnation = rng_next(c) | 1u; /* never 0, so 0 can mean "unknown" */
    c->deadline_at = UINT64_MAX;
    c->sessions = calloc(s->sessions_max, sizeof(mr_session));
    c->tx_cap = 64;
    c->tx = calloc(c->tx_cap, sizeof(mr_txent));
    c->txbuf = malloc((size_t)c->tx_cap * s->mtu_bytes);
    if (c->sessions == NULL || c->tx == NULL || c->txbuf == NULL) {
        mr_core_free(c);
        return NULL;
    }
    return c;
}

static void slot_clear(mr_slot *sl) {
    free(sl->req_buf);
    free(sl->resp_buf);
    memset(sl, 0, sizeof(*sl));
}

static void server_slot_reset(mr_core *c, mr_slot *sl);

static void session_release(mr_core *c, mr_session *s) {
    if (s->slots != NULL) {
        for (uint32_t i = 0; i < c->s.session_req_window; i++) {
            if (s->role == MR_ROLE_SERVER) server_slot_reset(c, &s->slots[i]);
            slot_clear(&s->slots[i]);
        }
        free(s->slots);
    }
    mr_backlog *b = s->backlog_head;
    while (b != NULL) {
        mr_backlog *n = b->next;
        free(b->data);
        free(b);
        b = n;
    }
    if (s->role == MR_ROLE_SERVER) c->server_credits_used -= s->credits_max;
    uint16_t num = s->local_num;
    memset(s, 0, sizeof(*s));
    s->local_num = num;
}

void mr_core_free(mr_core *c) {
    if (c == NULL) return;
    if (c->sessions != NULL) {
        for (uint32_t i = 0; i < c->s.sessions_max; i++) session_release(c, &c->sessions[i]);
        free(c->sessions);
    }
    for (uint32_t i = 0; i < c->delayed_len; i++) free(c->delayed[i].data);
    free(c->delayed);
    free(c->hold);
    for (uint32_t i = 0; i < c->ev_len; i++) free(c->ev[i].data);
    free(c->ev);
    free(c->tx);
    free(c->txbuf);
    free(c);
}

const mr_settings *mr_core_settings(const mr_core *c) { return &c->s; }
uint64_t mr_core_incarnation(const mr_core *c) { return c->incarnation; }
mr_stats *mr_core_stats(mr_core *c) { return &c->stats; }

int mr_core_set_secret(mr_core *c, const uint8_t *key, uint32_t len) {
    if (len != 0 && (len < 16u || len > sizeof c->secret)) return -MR_ERR_BAD_ARGUMENT;
    memset(c->secret, 0, sizeof c->secret);
    if (len) memcpy(c->secret, key, len);
    c->secret_len = len;
    return 0;
}
void mr_core_stats_tx_failed(mr_core *c, uint64_t n) { c->stats.tx_send_failed += n; }
void mr_core_rx_oversized(mr_core *c) {
    c->stats.rx_pkts++;
    c->stats.rx_oversized++;
}

/* ----------------------------------------------------------------- queues */

static int tx_reserve(mr_core *c) {
    if (c->tx_len < c->tx_cap) return 0;
    if (c->tx_cap >= c->s.tx_queue_max) return -1;
    uint32_t cap = c->tx_cap * 2;
    if (cap > c->s.tx_queue_max) cap = c->s.tx_queue_max;
    mr_txent *t = realloc(c->tx, (size_t)cap * sizeof(mr_txent));
    if (t == NULL) return -1;
    c->tx = t;
    uint8_t *b = realloc(c->txbuf, (size_t)cap * c->s.mtu_bytes);
    if (b == NULL) return -1;
    c->txbuf = b;
    c->tx_cap = cap;
    return 0;
}

/* Append a finished datagram to the transmit queue (after fault injection). */
static void tx_push(mr_core *c, const uint8_t *addr, uint32_t addr_len, const uint8_t *pkt,
                    uint32_t len) {
    if (tx_reserve(c) != 0) {
        c->stats.tx_queue_dropped++;
        return;
    }
    mr_txent *e = &c->tx[c->tx_len];
    e->len = len;
    e->addr_len = addr_len;
    memcpy(e->addr, addr, addr_len);
    memcpy(c->txbuf + (size_t)c->tx_len * c->s.mtu_bytes, pkt, len);
    c->tx_len++;
    c->stats.tx_pkts++;
    c->stats.tx_bytes += len;
}

static const mr_fault *fault_for(const mr_core *c, const uint8_t *addr, uint32_t addr_len) {
    const mr_fault *deflt = NULL;
    for (uint32_t i = 0; i < c->faults_len; i++) {
        const mr_fault *f = &c->faults[i];
        if (f->addr_len == 0)
            deflt = f;
        else if (addr_eq(f->addr, f->addr_len, addr, addr_len))
            return f;
    }
    return deflt;
}

static void delay_push(mr_core *c, const uint8_t *addr, uint32_t addr_len, const uint8_t *pkt,
                       uint32_t len, uint64_t at) {
    if (c->delayed_len == c->delayed_cap) {
        uint32_t cap = c->delayed_cap ? c->delayed_cap * 2 : 64;
        if (cap > c->s.tx_queue_max) cap = c->s.tx_queue_max;
        if (cap <= c->delayed_len) {
            c->stats.tx_queue_dropped++;
            return;
        }
        mr_delayed *d = realloc(c->delayed, (size_t)cap * sizeof(mr_delayed));
        if (d == NULL) {
            c->stats.tx_queue_dropped++;
            return;
        }
        c->delayed = d;
        c->delayed_cap = cap;
    }
    uint8_t *copy = malloc(len ? len : 1);
    if (copy == NULL) {
        c->stats.tx_queue_dropped++;
        return;
    }
    memcpy(copy, pkt, len);
    mr_delayed *d = &c->delayed[c->delayed_len++];
    d->release_at = at;
    d->len = len;
    d->addr_len = addr_len;
    memcpy(d->addr, addr, addr_len);
    d->data = copy;
    c->stats.fault_delayed++;
    lower_deadline(c, at);
}

/* Every packet the protocol sends goes through here: fault injection, then the queue. */
static void emit(mr_core *c, const uint8_t *addr, uint32_t addr_len, const mr_hdr *h,
                 const uint8_t *payload, uint32_t plen, uint64_t now) {
    uint8_t pkt[MR_HDR_BYTES + MR_SM_BODY_BYTES];
    uint8_t *buf = pkt;
    uint8_t *big = NULL;
    uint32_t len = MR_HDR_BYTES + plen;
    if (len > sizeof(pkt)) {
        /* Build in place in the transmit queue when there is no fault rule (fast path). */
        if (c->faults_len == 0) {
            if (tx_reserve(c) != 0) {
                c->stats.tx_queue_dropped++;
                return;
            }
            mr_txent *e = &c->tx[c->tx_len];
            uint8_t *dst = c->txbuf + (size_t)c->tx_len * c->s.mtu_bytes;
            mr_hdr_encode(dst, h);
            memcpy(dst + MR_HDR_BYTES, payload, plen);
            e->len = len;
            e->addr_len = addr_len;
            memcpy(e->addr, addr, addr_len);
            c->tx_len++;
            c->stats.tx_pkts++;
            c->stats.tx_bytes += len;
            return;
        }
        big = malloc(len);
        if (big == NULL) {
            c->stats.tx_queue_dropped++;
            return;
        }
        buf = big;
    }
    mr_hdr_encode(buf, h);
    if (plen) memcpy(buf + MR_HDR_BYTES, payload, plen);
    const mr_fault *f = c->faults_len ? fault_for(c, addr, addr_len) : NULL;
    if (f == NULL) {
        tx_push(c, addr, addr_len, buf, len);
    } else if (f->partitioned || (f->drop > 0 && rng_unit(c) < f->drop)) {
        c->stats.fault_dropped++;
    } else {
        int copies = 1;
        if (f->duplicate > 0 && rng_unit(c) < f->duplicate) {
            copies = 2;
            c->stats.fault_duplicated++;
        }
        for (int k = 0; k < copies; k++) {
            uint64_t delay = f->delay_ns;
            if (f->reorder > 0 && rng_unit(c) < f->reorder) {
                uint64_t span = f->reorder_delay_ns ? f->reorder_delay_ns : c->s.rto_ns / 10;
                delay += 1 + rng_next(c) % (span ? span : 1);
            }
            if (delay == 0)
                tx_push(c, addr, addr_len, buf, len);
            else
                delay_push(c, addr, addr_len, buf, len, now + delay);
        }
    }
    free(big);
}

static void release_delayed(mr_core *c, uint64_t now) {
    uint32_t w = 0;
    for (uint32_t i = 0; i < c->delayed_len; i++) {
        mr_delayed *d = &c->delayed[i];
        if (d->release_at <= now) {
            tx_push(c, d->addr, d->addr_len, d->data, d->len);
            free(d->data);
        } else {
            lower_deadline(c, d->release_at);
            c->delayed[w++] = *d;
        }
    }
    c->delayed_len = w;
}

uint32_t mr_core_tx_count(const mr_core *c) { return c->tx_len; }

const uint8_t *mr_core_tx_packet(const mr_core *c, uint32_t i, uint32_t *len,
                                 const uint8_t **addr, uint32_t *addr_len) {
    if (i >= c->tx_len) return NULL;
    *len = c->tx[i].len;
    *addr = c->tx[i].addr;
    *addr_len = c->tx[i].addr_len;
    return c->txbuf + (size_t)i * c->s.mtu_bytes;
}

void mr_core_tx_consume(mr_core *c, uint32_t n) {
    if (n >= c->tx_len) {
        c->tx_len = 0;
        return;
    }
    memmove(c->tx, c->tx + n, (size_t)(c->tx_len - n) * sizeof(mr_txent));
    memmove(c->txbuf, c->txbuf + (size_t)n * c->s.mtu_bytes,
            (size_t)(c->tx_len - n) * c->s.mtu_bytes);
    c->tx_len -= n;
}

/* Returns 0, or -1 (and frees data) if out of memory. */
static int event_push(mr_core *c, uint8_t kind, uint8_t req_type, uint16_t session,
                      int32_t code, uint64_t id, uint8_t *data, uint32_t size) {
    if (c->ev_len == c->ev_cap) {
        uint32_t cap = c->ev_cap ? c->ev_cap * 2 : 64;
        mr_event *e = realloc(c->ev, (size_t)cap * sizeof(mr_event));
        if (e == NULL) {
            free(data);
            return -1;
        }
        c->ev = e;
        c->ev_cap = cap;
    }
    mr_event *e = &c->ev[c->ev_len++];
    e->kind = kind;
    e->req_type = req_type;
    e->session = session;
    e->code = code;
    e->id = id;
    e->data = data;
    e->size = size;
    return 0;
}

uint32_t mr_core_event_count(const mr_core *c) { return c->ev_len; }
mr_event *mr_core_events(mr_core *c) { return c->ev; }
void mr_core_events_consume(mr_core *c, uint32_t n) {
    if (n >= c->ev_len) {
        c->ev_len = 0;
        return;
    }
    memmove(c->ev, c->ev + n, (size_t)(c->ev_len - n) * sizeof(mr_event));
    c->ev_len -= n;
}

/* --------------------------------------------------------------- sessions */

static mr_session *session_get(mr_core *c, int num) {
    if (num < 0 || (uint32_t)num >= c->s.sessions_max) return NULL;
    mr_session *s = &c->sessions[num];
    return s->role == MR_ROLE_FREE ? NULL : s;
}

static mr_session *session_alloc(mr_core *c, uint8_t role, const uint8_t *addr,
                                 uint32_t addr_len) {
    for (uint32_t k = 0; k < c->s.sessions_max; k++) {
        uint32_t i = (c->alloc_cursor + k) % c->s.sessions_max;
        mr_session *s = &c->sessions[i];
        if (s->role != MR_ROLE_FREE) continue;
        mr_slot *slots = calloc(c->s.session_req_window, sizeof(mr_slot));
        if (slots == NULL) return NULL;
        c->alloc_cursor = i + 1;
        memset(s, 0, sizeof(*s));
        s->slots = slots;
        s->role = role;
        s->generation = ++c->next_generation;
        do {
            s->local_tag = (uint16_t)rng_next(c);
        } while (s->local_tag == 0);
        s->local_num = (uint16_t)i;
        s->remote_num = MR_SESSION_NUM_INVALID;
        memcpy(s->addr, addr, addr_len);
        s->addr_len = addr_len;
        return s;
    }
    return NULL;
}

/* The MAC of a session packet: HMAC-SHA-256 under the secret of its encoded header, then
 * its body (the header carries the packet type and the error code). */
static void sm_mac(const mr_core *c, const mr_hdr *h, const uint8_t *body, uint8_t *out) {
    uint8_t hdr[MR_HDR_BYTES];
    mr_hdr_encode(hdr, h);
    mr_hmac_sha256(c->secret, c->secret_len, hdr, MR_HDR_BYTES, body, MR_SM_BODY_BYTES, out);
}

static void sm_send_signed(mr_core *c, const uint8_t *addr, uint32_t addr_len, uint8_t type,
                           int32_t err, const mr_sm_body *b, int sign, uint64_t now) {
    mr_hdr h = {0};
    h.req_type = type;
    h.msg_size = (uint32_t)err;
    h.dest_session = MR_SESSION_NUM_INVALID;
    h.magic = MR_MAGIC_SM;
    uint8_t body[MR_SM_BODY_BYTES + MR_HMAC_BYTES];
    sm_body_encode(body, b);
    uint32_t len = MR_SM_BODY_BYTES;
    if (sign && c->secret_len) {
        sm_mac(c, &h, body, body + MR_SM_BODY_BYTES);
        len += MR_HMAC_BYTES;
    }
    emit(c, addr, addr_len, &h, body, len, now);
}

static void sm_send(mr_core *c, const uint8_t *addr, uint32_t addr_len, uint8_t type,
                    int32_t err, const mr_sm_body *b, uint64_t now) {
    sm_send_signed(c, addr, addr_len, type, err, b, 1, now);
}

static void client_sm_send(mr_core *c, mr_session *s, uint8_t type, uint64_t now) {
    mr_sm_body b = {0};
    b.token = s->token;
    b.client_incarnation = c->incarnation;
    b.server_incarnation = s->peer_incarnation;
    b.client_session = s->local_num;
    b.server_session = s->remote_num;
    b.credits = s->credits_max;
    b.client_tag = s->local_tag;
    b.server_tag = s->remote_tag;
    sm_send(c, s->addr, s->addr_len, type, MR_OK, &b, now);
    if (type == MR_SM_PING_REQ)
        s->ping_sent_at = now;
    else
        s->sm_sent_at = now;
    lower_deadline(c, now + c->s.rto_ns);
}

/* Fail every request of a client session and report the session failure. */
static void client_fail_all(mr_core *c, mr_session *s, int32_t code, int report) {
    for (uint32_t i = 0; i < c->s.session_req_window; i++) {
        mr_slot *sl = &s->slots[i];
        if (sl->state == MR_SLOT_BUSY) {
            event_push(c, MR_EV_FAILED, sl->req_type, s->local_num, code, sl->tag, NULL, 0);
            uint64_t req_num = sl->req_num;
            slot_clear(sl);
            sl->req_num = req_num;
        }
    }
    s->busy_slots = 0;
    mr_backlog *b = s->backlog_head;
    while (b != NULL) {
        mr_backlog *n = b->next;
        event_push(c, MR_EV_FAILED, b->req_type, s->local_num, code, b->tag, NULL, 0);
        free(b->data);
        free(b);
        b = n;
    }
    s->backlog_head = s->backlog_tail = NULL;
    s->backlog_len = 0;
    if (report) event_push(c, MR_EV_SESSION, 0, s->local_num, code, 0, NULL, 0);
}

static void client_session_fail(mr_core *c, mr_session *s, int32_t code) {
    if (s->state == MR_SS_FAILED) return;
    c->stats.sessions_failed++;
    if (code == MR_ERR_RING_EXHAUSTED) c->stats.sessions_refused++;
    s->state = MR_SS_FAILED;
    client_fail_all(c, s, code, 1);
}

int mr_core_create_session(mr_core *c, const uint8_t *addr, uint32_t addr_len, uint64_t now) {
    if (addr_len == 0 || addr_len > MR_ADDR_MAX) return -MR_ERR_BAD_ARGUMENT;
    mr_session *s = session_alloc(c, MR_ROLE_CLIENT, addr, addr_len);
    if (s == NULL) return -MR_ERR_NO_MEMORY;
    s->state = MR_SS_CONNECTING;
    s->token = rng_next(c);
    s->credits_max = s->credits = c->s.session_credits;
    for (uint32_t i = 0; i < c->s.session_req_window; i++) s->slots[i].req_num = i;
    s->sm_started_at = now;
    client_sm_send(c, s, MR_SM_CONNECT_REQ, now);
    return s->local_num;
}

int mr_core_destroy_session(mr_core *c, int session, uint64_t now) {
    mr_session *s = session_get(c, session);
    if (s == NULL || s->role != MR_ROLE_CLIENT) return -MR_ERR_NO_SESSION;
    if (s->state == MR_SS_DISCONNECTING) return 0;
    if (s->state == MR_SS_FAILED) {
        session_release(c, s);
        return 0;
    }
    client_fail_all(c, s, MR_ERR_CLOSED, 0);
    if (s->state == MR_SS_CONNECTED) {
        s->state = MR_SS_DISCONNECTING;
        s->sm_started_at = now;
        client_sm_send(c, s, MR_SM_DISCONNECT_REQ, now);
    } else {
        session_release(c, s);
    }
    return 0;
}

static uint64_t session_rto(const mr_core *c, const mr_session *s);

int mr_core_session_info(const mr_core *c, int session, mr_session_info *out) {
    if (session < 0 || (uint32_t)session >= c->s.sessions_max) return -1;
    const mr_session *s = &c->sessions[session];
    out->role = s->role;
    out->state = s->state;
    out->credits = s->credits;
    out->credits_max = s->credits_max;
    out->in_flight_max = s->in_flight_max;
    out->busy_slots = s->busy_slots;
    out->backlog = s->backlog_len;
    out->remote_session = s->remote_num;
    out->local_tag = s->local_tag;
    out->remote_tag = s->remote_tag;
    out->srtt_ns = s->srtt_ns;
    out->rttvar_ns = s->rttvar_ns;
    out->rto_ns = s->role == MR_ROLE_CLIENT ? session_rto(c, s) : 0;
    return 0;
}

/* ----------------------------------------------------------------- client */

/* The retransmission timeout of a client session: rto_ns until a round trip is measured. */
static uint64_t session_rto(const mr_core *c, const mr_session *s) {
    return s->rto_cur_ns ? s->rto_cur_ns : c->s.rto_ns;
}

/* One round trip of a request sent once and answered without "held" (RFC 6298, 2.2-2.3;
 * no clock granularity term: the clock is in nanoseconds). */
static void rtt_sample(mr_core *c, mr_session *s, uint64_t r) {
    if (r == 0) r = 1;
    if (s->srtt_ns == 0) {
        s->srtt_ns = r;
        s->rttvar_ns = r / 2;
    } else {
        uint64_t d = s->srtt_ns > r ? s->srtt_ns - r : r - s->srtt_ns;
        s->rttvar_ns = (3 * s->rttvar_ns + d) / 4;
        s->srtt_ns = (7 * s->srtt_ns + r) / 8;
    }
    uint64_t rto = s->srtt_ns + 4 * s->rttvar_ns;
    if (rto > c->s.rto_max_ns) rto = c->s.rto_max_ns;
    if (rto < c->s.rto_ns) rto = c->s.rto_ns;
    s->rto_cur_ns = rto;
}

static void client_send_pkt(mr_core *c, mr_session *s, mr_slot *sl, uint64_t now) {
    /* Wire index num_tx: a request packet, or an RFR for response packet
     * (num_tx - req_pkts + 1). */
    uint32_t i = sl->num_tx;
    mr_hdr h = {0};
    h.req_type = sl->req_type;
    h.dest_session = s->remote_num;
    h.req_num = sl->req_num;
    h.magic = MR_MAGIC_DATA;
    h.session_tag = s->remote_tag;
    if (i < sl->req_pkts) {
        h.pkt_type = MR_PKT_REQ;
        h.msg_size = sl->req_size;
        h.pkt_num = (uint16_t)i;
        uint32_t plen = pkt_len_for(c, sl->req_size, i);
        const uint8_t *p = plen ? sl->req_buf + (size_t)i * c->payload_max : NULL;
        emit(c, s->addr, s->addr_len, &h, p, plen, now);
    } else {
        h.pkt_type = MR_PKT_RFR;
        h.msg_size = 0;
        h.pkt_num = (uint16_t)(i - sl->req_pkts + 1);
        emit(c, s->addr, s->addr_len, &h, NULL, 0, now);
    }
    sl->num_tx++;
    if (sl->num_tx == sl->req_pkts && sl->sample_at == 0) sl->sample_at = now;
    s->credits--;
    uint32_t in_flight = s->credits_max - s->credits;
    if (in_flight > s->in_flight_max) s->in_flight_max = in_flight;
    if (in_flight > c->stats.in_flight_max) c->stats.in_flight_max = in_flight;
    sl->progress_at = now;
    lower_deadline(c, now + session_rto(c, s));
}

/* How many packets of this slot may be sent now, ignoring credits. */
static uint32_t client_sendable(const mr_slot *sl) {
    if (sl->num_tx < sl->req_pkts) return sl->req_pkts - sl->num_tx;
    /* RFRs need the response size, learnt from the first response packet. */
    if (sl->num_rx < sl->req_pkts) return 0;
    uint32_t total = sl->req_pkts + sl->resp_pkts - 1;
    return total > sl->num_tx ? total - sl->num_tx : 0;
}

static void client_start_backlog(mr_core *c, mr_session *s, uint64_t now);

static void kick_mark(mr_session *s, uint32_t i) { s->kick_bits[i >> 6] |= 1ull << (i & 63); }

static void kick_unmark(mr_session *s, uint32_t i) { s->kick_bits[i >> 6] &= ~(1ull << (i & 63)); }

/* The first slot in [from, end) whose kick bit is set, or end. */
static uint32_t kick_next(const mr_session *s, uint32_t from, uint32_t end) {
    while (from < end) {
        uint64_t word = s->kick_bits[from >> 6] >> (from & 63);
        if (word != 0) {
            uint32_t i = from + (uint32_t)__builtin_ctzll(word);
            return i < end ? i : end;
        }
        from = (from | 63) + 1;
    }
    return end;
}

static void client_kick(mr_core *c, mr_session *s, uint64_t now) {
    if (s->state != MR_SS_CONNECTED) return;
    client_start_backlog(c, s, now);
    uint32_t w = c->s.session_req_window;
    /* Round-robin over slots so one long message does not starve the others: a packet of
     * each slot per pass, from kick_cursor round the window, and another pass only while a
     * slot has more to send. A pass visits only the slots whose kick bit is set (every
     * slot with packets to send has it): scanning the whole window of 64 slots on every
     * request was 3.6% of a client's CPU in bench/micro.py. The order is the full scan's. */
    int more = 1;
    while (s->credits > 0 && more) {
        more = 0;
        uint32_t cursor = s->kick_cursor;
        for (int half = 0; half < 2 && s->credits > 0; half++) {
            uint32_t end = half == 0 ? w : cursor;
            uint32_t i = kick_next(s, half == 0 ? cursor : 0, end);
            while (i < end && s->credits > 0) {
                mr_slot *sl = &s->slots[i];
                if (sl->state == MR_SLOT_BUSY && client_sendable(sl) > 0) {
                    client_send_pkt(c, s, sl, now);
                    if (client_sendable(sl) > 0)
                        more = 1;
                    else
                        kick_unmark(s, i);
                } else {
                    kick_unmark(s, i);
                }
                i = kick_next(s, i + 1, end);
            }
        }
        s->kick_cursor = (s->kick_cursor + 1) % w;
    }
}

static void client_slot_start(mr_core *c, mr_session *s, mr_slot *sl, uint8_t req_type,
                              uint8_t *data, uint32_t size, uint64_t tag, uint64_t now) {
    uint64_t next = sl->req_num + c->s.session_req_window;
    slot_clear(sl);
    sl->req_num = next & MR_REQ_NUM_MASK;
    sl->state = MR_SLOT_BUSY;
    sl->req_type = req_type;
    sl->req_buf = data;
    sl->req_size = size;
    sl->req_pkts = pkts_for(c, size);
    sl->tag = tag;
    sl->progress_at = now;
    if (s->busy_slots == 0 && s->alive_at < now) s->alive_at = now;
    s->busy_slots++;
    kick_mark(s, (uint32_t)(sl - s->slots));
}

static void client_start_backlog(mr_core *c, mr_session *s, uint64_t now) {
    for (uint32_t i = 0; i < c->s.session_req_window && s->backlog_head != NULL; i++) {
        mr_slot *sl = &s->slots[i];
        if (sl->state != MR_SLOT_FREE) continue;
        mr_backlog *b = s->backlog_head;
        s->backlog_head = b->next;
        if (s->backlog_head == NULL) s->backlog_tail = NULL;
        s->backlog_len--;
        client_slot_start(c, s, sl, b->req_type, b->data, b->size, b->tag, now);
        free(b);
    }
}

int mr_core_enqueue_request(mr_core *c, int session, uint8_t req_type, const uint8_t *data,
                            uint32_t size, uint64_t tag, uint64_t now) {
    mr_session *s = session_get(c, session);
    if (s == NULL || s->role != MR_ROLE_CLIENT) return -MR_ERR_NO_SESSION;
    if (s->state != MR_SS_CONNECTED && s->state != MR_SS_CONNECTING) return -MR_ERR_NO_SESSION;
    if (size > c->s.msg_size_max) return -MR_ERR_TOO_LARGE;
    if (s->backlog_len >= c->s.backlog_max) return -MR_ERR_BACKLOG_FULL;
    uint8_t *copy = NULL;
    if (size > 0) {
        copy = malloc(size);
        if (copy == NULL) return -MR_ERR_NO_MEMORY;
        memcpy(copy, data, size);
    }
    mr_backlog *b = malloc(sizeof(*b));
    if (b == NULL) {
        free(copy);
        return -MR_ERR_NO_MEMORY;
    }
    b->next = NULL;
    b->tag = tag;
    b->req_type = req_type;
    b->size = size;
    b->data = copy;
    if (s->backlog_tail)
        s->backlog_tail->next = b;
    else
        s->backlog_head = b;
    s->backlog_tail = b;
    s->backlog_len++;
    client_kick(c, s, now);
    return 0;
}

static void client_rx_data(mr_core *c, mr_session *s, const mr_hdr *h, const uint8_t *payload,
                           uint32_t plen, uint64_t now) {
    if (s->state != MR_SS_CONNECTED) {
        c->stats.rx_stale++;
        return;
    }
    mr_slot *sl = &s->slots[h->req_num % c->s.session_req_window];
    if (sl->state != MR_SLOT_BUSY || sl->req_num != h->req_num) {
        c->stats.rx_stale++;
        return;
    }
    uint32_t wire;
    if (h->pkt_type == MR_PKT_CR) {
        if (plen == 0 && (uint32_t)h->pkt_num + 1 == sl->req_pkts) {
            /* "Held": the whole request is at the server, in its handler. Only a lost
             * response is left to recover, so the slot waits rto_held_ns from now. */
            if (sl->num_rx + 1 == sl->req_pkts && sl->num_tx >= sl->req_pkts) {
                c->stats.rx_held++;
                sl->held = 1;
                sl->sample_at = UINT64_MAX; /* its time is the handler's, not the path's */
                sl->progress_at = now;
                s->alive_at = now;
            } else {
                c->stats.rx_stale++;
            }
            return;
        }
        if (plen != 0 || (uint32_t)h->pkt_num + 1 >= sl->req_pkts) {
            c->stats.rx_malformed++;
            return;
        }
        wire = h->pkt_num;
    } else { /* MR_PKT_RESP */
        wire = sl->req_pkts - 1 + h->pkt_num;
    }
    if (wire < sl->num_rx) {
        c->stats.rx_stale++; /* duplicate */
        return;
    }
    if (wire != sl->num_rx || wire >= sl->num_tx) {
        c->stats.rx_out_of_order++;
        return;
    }
    if (h->pkt_type == MR_PKT_RESP) {
        if (h->pkt_num == 0) {
            if (h->msg_size > c->s.msg_size_max) {
                c->stats.rx_malformed++;
                return;
            }
            if (plen != pkt_len_for(c, h->msg_size, 0)) {
                c->stats.rx_malformed++;
                return;
            }
            uint32_t pkts = pkts_for(c, h->msg_size);
            uint8_t *buf = NULL;
            if (h->msg_size > 0) {
                buf = malloc(h->msg_size);
                if (buf == NULL) return; /* treated as a loss; retransmission retries */
                memcpy(buf, payload, plen);
            }
            if (sl->sample_at != 0 && sl->sample_at != UINT64_MAX)
                rtt_sample(c, s, elapsed(now, sl->sample_at));
            sl->sample_at = UINT64_MAX;
            sl->resp_size = h->msg_size;
            sl->resp_pkts = pkts;
            sl->resp_buf = buf;
            sl->status = h->req_type;
        } else {
            if (h->pkt_num >= sl->resp_pkts || h->msg_size != sl->resp_size ||
                plen != pkt_len_for(c, sl->resp_size, h->pkt_num)) {
                c->stats.rx_malformed++;
                return;
            }
            memcpy(sl->resp_buf + (size_t)h->pkt_num * c->payload_max, payload, plen);
        }
    }
    sl->num_rx++;
    s->credits++;
    sl->progress_at = now;
    sl->held = 0; /* a response is coming: its RFRs retry every rto_ns */
    kick_mark(s, (uint32_t)(sl - s->slots)); /* its response's size may allow RFRs now */
    s->alive_at = now;
    if (sl->num_rx >= sl->req_pkts && sl->num_rx == sl->req_pkts + sl->resp_pkts - 1) {
        c->stats.responses_received++;
        event_push(c, MR_EV_RESPONSE, sl->status, s->local_num, 0, sl->tag, sl->resp_buf,
                   sl->resp_size);
        sl->resp_buf = NULL;
        free(sl->req_buf);
        sl->req_buf = NULL;
        sl->state = MR_SLOT_FREE;
        s->busy_slots--;
    }
    client_kick(c, s, now);
}

/* Go-back-N: forget packets in flight past the last in-order one and send them again. */
static void client_retransmit_scan(mr_core *c, mr_session *s, uint64_t now) {
    int rolled = 0, unheld = 0;
    for (uint32_t i = 0; i < c->s.session_req_window; i++) {
        mr_slot *sl = &s->slots[i];
        if (sl->state != MR_SLOT_BUSY || sl->num_tx == sl->num_rx) continue;
        uint64_t rto = sl->held ? c->s.rto_held_ns : session_rto(c, s);
        if (elapsed(now, sl->progress_at) >= rto) {
            s->credits += sl->num_tx - sl->num_rx;
            sl->num_tx = sl->num_rx;
            kick_mark(s, i);
            sl->sample_at = UINT64_MAX; /* Karn: a retransmitted request's answer is ambiguous */
            sl->progress_at = now;
            c->stats.retransmits++;
            rolled = 1;
            unheld |= !sl->held;
        } else {
            lower_deadline(c, sl->progress_at + rto);
        }
    }
    if (rolled) {
        /* A ping tells a slow handler that has not said it holds the request from a dead
         * peer (a held slot's retransmission is answered by the server itself). */
        if (unheld && elapsed(now, s->ping_sent_at) >= c->s.rto_ns)
            client_sm_send(c, s, MR_SM_PING_REQ, now);
        client_kick(c, s, now);
    }
}

/* ----------------------------------------------------------------- server */

/* Return the reassembly bytes a slot holds, before it is cleared or reused. */
static void server_slot_reset(mr_core *c, mr_slot *sl) {
    if (sl->state == MR_SLOT_RECEIVING) {
        c->rx_reassembly_bytes -= sl->req_size;
        sl->state = MR_SLOT_EMPTY;
    }
}

static void server_send_resp(mr_core *c, mr_session *s, mr_slot *sl, uint32_t index,
                             uint64_t now) {
    mr_hdr h = {0};
    h.req_type = sl->status;
    h.msg_size = sl->resp_size;
    h.dest_session = s->remote_num;
    h.pkt_type = MR_PKT_RESP;
    h.pkt_num = (uint16_t)index;
    h.req_num = sl->req_num;
    h.magic = MR_MAGIC_DATA;
    h.session_tag = s->remote_tag;
    uint32_t plen = pkt_len_for(c, sl->resp_size, index);
    const uint8_t *p = plen ? sl->resp_buf + (size_t)index * c->payload_max : NULL;
    emit(c, s->addr, s->addr_len, &h, p, plen, now);
}

static void server_send_cr(mr_core *c, mr_session *s, mr_slot *sl, uint32_t index,
                           uint64_t now) {
    mr_hdr h = {0};
    h.req_type = sl->req_type;
    h.dest_session = s->remote_num;
    h.pkt_type = MR_PKT_CR;
    h.pkt_num = (uint16_t)index;
    h.req_num = sl->req_num;
    h.magic = MR_MAGIC_DATA;
    h.session_tag = s->remote_tag;
    emit(c, s->addr, s->addr_len, &h, NULL, 0, now);
}

/* Remember a request just handed to its handler (hold_ack_ns). Out of memory it is not
 * remembered: a duplicate still draws "held". */
static void hold_push(mr_core *c, mr_session *s, mr_slot *sl, uint64_t now) {
    if (c->hold_len == c->hold_cap) {
        uint32_t cap = c->hold_cap ? c->hold_cap * 2 : 64;
        mr_holdent *ring = malloc((size_t)cap * sizeof(*ring));
        if (ring == NULL) return;
        for (uint32_t i = 0; i < c->hold_len; i++)
            ring[i] = c->hold[(c->hold_head + i) % c->hold_cap];
        free(c->hold);
        c->hold = ring;
        c->hold_cap = cap;
        c->hold_head = 0;
    }
    mr_holdent *e = &c->hold[(c->hold_head + c->hold_len) % c->hold_cap];
    e->due_at = now + c->hold_wait_ns;
    e->req_num = sl->req_num;
    e->session = (uint32_t)(s - c->sessions);
    e->generation = s->generation;
    c->hold_len++;
}

/* Say "held" for every remembered request that is due and still in its handler. */
static void hold_scan(mr_core *c, uint64_t now) {
    while (c->hold_len > 0) {
        mr_holdent *e = &c->hold[c->hold_head];
        if (e->due_at > now) return;
        mr_session *s = &c->sessions[e->session];
        if (s->role == MR_ROLE_SERVER && s->generation == e->generation && s->slots != NULL) {
            mr_slot *sl = &s->slots[e->req_num % c->s.session_req_window];
            if (sl->state == MR_SLOT_IN_HANDLER && sl->req_num == e->req_num) {
                c->stats.held_sent++;
                server_send_cr(c, s, sl, sl->req_pkts - 1, now);
            }
        }
        c->hold_head = (c->hold_head + 1) % c->hold_cap;
        c->hold_len--;
    }
}

static void server_deliver(mr_core *c, mr_session *s, mr_slot *sl, uint8_t *data, uint64_t now) {
    if (event_push(c, MR_EV_REQUEST, sl->req_type, s->local_num, (int32_t)s->generation,
                   sl->req_num, data, sl->req_size) != 0) {
        /* Out of memory: forget the request, as if lost; the client's retransmission brings
         * it back as a fresh one (the handler has not run). */
        c->stats.rx_no_buffer++;
        uint64_t req_num = sl->req_num;
        slot_clear(sl);
        sl->req_num = req_num; /* older numbers stay stale */
        return;
    }
    sl->state = MR_SLOT_IN_HANDLER;
    c->stats.requests_handled++;
    if (c->s.hold_ack_ns) hold_push(c, s, sl, now);
}

static void server_rx_req(mr_core *c, mr_session *s, const mr_hdr *h, const uint8_t *payload,
                          uint32_t plen, uint64_t now) {
    mr_slot *sl = &s->slots[h->req_num % c->s.session_req_window];
    int fresh = (sl->state == MR_SLOT_EMPTY && h->req_num >= sl->req_num) ||
                h->req_num > sl->req_num;
    if (!fresh && h->req_num < sl->req_num) {
        c->stats.rx_stale++;
        return;
    }
    if (h->msg_size > c->s.msg_size_max) {
        c->stats.rx_malformed++;
        return;
    }
    uint32_t pkts = pkts_for(c, h->msg_size);
    if (h->pkt_num >= pkts || plen != pkt_len_for(c, h->msg_size, h->pkt_num)) {
        c->stats.rx_malformed++;
        return;
    }
    if (fresh) {
        if (h->pkt_num != 0) {
            c->stats.rx_out_of_order++;
            return;
        }
        if (pkts > 1 &&
            c->rx_reassembly_bytes + h->msg_size > c->s.rx_reassembly_bytes_max) {
            c->stats.rx_no_buffer++; /* a loss: the client retransmits later */
            return;
        }
        uint8_t *buf = NULL;
        if (h->msg_size > 0) {
            buf = malloc(h->msg_size);
            if (buf == NULL) {
                c->stats.rx_no_buffer++;
                return;
            }
            memcpy(buf, payload, plen);
        }
        server_slot_reset(c, sl);
        slot_clear(sl);
        sl->req_num = h->req_num;
        sl->req_type = h->req_type;
        sl->req_size = h->msg_size;
        sl->req_pkts = pkts;
        sl->num_rx = 1;
        if (pkts == 1) {
            server_deliver(c, s, sl, buf, now);
        } else {
            sl->req_buf = buf;
            sl->state = MR_SLOT_RECEIVING;
            c->rx_reassembly_bytes += sl->req_size;
            server_send_cr(c, s, sl, 0, now);
        }
        return;
    }
    /* Same request number as the slot holds. */
    if (h->msg_size != sl->req_size || h->req_type != sl->req_type) {
        c->stats.rx_malformed++;
        return;
    }
    if (h->pkt_num < sl->num_rx) {
        /* A duplicate: answer from what we have, never run the handler again. */
        if ((uint32_t)h->pkt_num + 1 < sl->req_pkts) {
            c->stats.rx_dup_answered++;
            server_send_cr(c, s, sl, h->pkt_num, now);
        } else if (sl->state == MR_SLOT_RESPONDED) {
            c->stats.rx_dup_answered++;
            server_send_resp(c, s, sl, 0, now);
        } else {
            /* Still in its handler: say so ("held", see mr_core.h), so the client stops
             * retransmitting every rto_ns. */
            c->stats.rx_dup_in_handler++;
            server_send_cr(c, s, sl, sl->req_pkts - 1, now);
        }
        return;
    }
    if (h->pkt_num > sl->num_rx || sl->state != MR_SLOT_RECEIVING) {
        c->stats.rx_out_of_order++;
        return;
    }
    memcpy(sl->req_buf + (size_t)h->pkt_num * c->payload_max, payload, plen);
    sl->num_rx++;
    if (sl->num_rx < sl->req_pkts) {
        server_send_cr(c, s, sl, h->pkt_num, now);
    } else {
        uint8_t *buf = sl->req_buf;
        sl->req_buf = NULL;
        c->rx_reassembly_bytes -= sl->req_size;
        server_deliver(c, s, sl, buf, now);
    }
}

static void server_rx_rfr(mr_core *c, mr_session *s, const mr_hdr *h, uint32_t plen,
                          uint64_t now) {
    mr_slot *sl = &s->slots[h->req_num % c->s.session_req_window];
    if (plen != 0) {
        c->stats.rx_malformed++;
        return;
    }
    if (sl->state != MR_SLOT_RESPONDED || sl->req_num != h->req_num) {
        c->stats.rx_stale++;
        return;
    }
    if (h->pkt_num == 0 || h->pkt_num >= sl->resp_pkts) {
        c->stats.rx_malformed++;
        return;
    }
    server_send_resp(c, s, sl, h->pkt_num, now);
}

int mr_core_respond(mr_core *c, int session, uint32_t generation, uint64_t req_num,
                    uint8_t status, const uint8_t *data, uint32_t size, uint64_t now) {
    if (size > c->s.msg_size_max) return -MR_ERR_TOO_LARGE;
    mr_session *s = session_get(c, session);
    if (s == NULL || s->role != MR_ROLE_SERVER || s->generation != generation)
        return -MR_ERR_STALE;
    mr_slot *sl = &s->slots[req_num % c->s.session_req_window];
    if (sl->state != MR_SLOT_IN_HANDLER || sl->req_num != req_num) return -MR_ERR_STALE;
    uint8_t *copy = NULL;
    if (size > 0) {
        copy = malloc(size);
        if (copy == NULL) return -MR_ERR_NO_MEMORY;
        memcpy(copy, data, size);
    }
    sl->resp_buf = copy;
    sl->resp_size = size;
    sl->resp_pkts = pkts_for(c, size);
    sl->status = status;
    sl->state = MR_SLOT_RESPONDED;
    server_send_resp(c, s, sl, 0, now);
    return 0;
}

/* ------------------------------------------------------ session management */

static void server_sm_reply(mr_core *c, const uint8_t *addr, uint32_t addr_len, uint8_t type,
                            int32_t err, const mr_sm_body *req, const mr_session *s,
                            uint64_t now) {
    mr_sm_body b = *req;
    b.server_incarnation = c->incarnation;
    b.server_session = s ? s->local_num : MR_SESSION_NUM_INVALID;
    b.server_tag = s ? s->local_tag : 0;
    sm_send(c, addr, addr_len, type, err, &b, now);
}

static void sm_rx(mr_core *c, const uint8_t *addr, uint32_t addr_len, const mr_hdr *h,
                  const uint8_t *body_raw, uint32_t plen, uint64_t now) {
    if ((plen != MR_SM_BODY_BYTES && plen != MR_SM_BODY_BYTES + MR_HMAC_BYTES) ||
        h->pkt_type != 0 || h->pkt_num != 0 || h->req_num != 0) {
        c->stats.rx_malformed++;
        return;
    }
    mr_sm_body b;
    sm_body_decode(body_raw, &b);
    int32_t err = (int32_t)h->msg_size;
    if (c->secret_len) {
        int valid = 0;
        if (plen == MR_SM_BODY_BYTES + MR_HMAC_BYTES) {
            uint8_t mac[MR_HMAC_BYTES];
            sm_mac(c, h, body_raw, mac);
            valid = mr_mac_equal(mac, body_raw + MR_SM_BODY_BYTES, MR_HMAC_BYTES);
        }
        if (!valid) {
            c->stats.sm_unauthenticated++;
            if (h->req_type == MR_SM_CONNECT_REQ) {
                /* Refused, and told so without a MAC: a peer without the secret (or with
                 * another one) could not check one, and learns only that it was refused. */
                mr_sm_body r = b;
                r.server_incarnation = c->incarnation;
                r.server_session = MR_SESSION_NUM_INVALID;
                r.server_tag = 0;
                sm_send_signed(c, addr, addr_len, MR_SM_CONNECT_RESP, MR_ERR_UNAUTHENTICATED, &r,
                               0, now);
                return;
            }
            /* A refusal of our own connect request comes unsigned (above); nothing else may. */
            if (!(h->req_type == MR_SM_CONNECT_RESP && err == MR_ERR_UNAUTHENTICATED)) return;
        }
    }
    switch (h->req_type) {
    case MR_SM_CONNECT_REQ: {
        if (b.credits < 1 || b.credits > 1024) {
            c->stats.rx_malformed++;
            return;
        }
        mr_session *found = NULL;
        int have_free = 0;
        for (uint32_t i = 0; i < c->s.sessions_max; i++) {
            mr_session *s = &c->sessions[i];
            if (s->role != MR_ROLE_SERVER || !addr_eq(s->addr, s->addr_len, addr, addr_len))
                continue;
            if (s->token == b.token && s->client_incarnation == b.client_incarnation) {
                found = s;
            } else if (s->client_incarnation != b.client_incarnation) {
                /* The client restarted: its old sessions will never be used again. */
                session_release(c, s);
            }
        }
        for (uint32_t i = 0; i < c->s.sessions_max && !have_free; i++)
            have_free = c->sessions[i].role == MR_ROLE_FREE;
        if (found == NULL && (!have_free ||
                              c->server_credits_used + b.credits > c->s.server_credits_max)) {
            /* Under pressure, reclaim the server session idle the longest, if it has been
             * silent for a whole session timeout. Its client, should it come back, is told
             * by a reset and sees its session fail; it never sees a request run twice. */
            mr_session *idle = NULL;
            for (uint32_t i = 0; i < c->s.sessions_max; i++) {
                mr_session *s = &c->sessions[i];
                if (s->role == MR_ROLE_SERVER && elapsed(now, s->alive_at) >= c->s.session_timeout_ns &&
                    (idle == NULL || s->alive_at < idle->alive_at))
                    idle = s;
            }
            if (idle != NULL) session_release(c, idle);
        }
        if (found == NULL) {
            if (c->server_credits_used + b.credits > c->s.server_credits_max) {
                c->stats.sessions_refused++;
                server_sm_reply(c, addr, addr_len, MR_SM_CONNECT_RESP, MR_ERR_RING_EXHAUSTED, &b,
                                NULL, now);
                return;
            }
            found = session_alloc(c, MR_ROLE_SERVER, addr, addr_len);
            if (found == NULL) {
                c->stats.sessions_refused++;
                server_sm_reply(c, addr, addr_len, MR_SM_CONNECT_RESP, MR_ERR_RING_EXHAUSTED, &b,
                                NULL, now);
                return;
            }
            found->state = MR_SS_CONNECTED;
            found->token = b.token;
            found->client_incarnation = b.client_incarnation;
            found->remote_num = b.client_session;
            found->remote_tag = b.client_tag;
            found->credits_max = b.credits;
            c->server_credits_used += b.credits;
        }
        found->alive_at = now;
        server_sm_reply(c, addr, addr_len, MR_SM_CONNECT_RESP, MR_OK, &b, found, now);
        return;
    }
    case MR_SM_DISCONNECT_REQ:
    case MR_SM_PING_REQ: {
        mr_session *s = NULL;
        if (b.server_session < c->s.sessions_max) {
            s = &c->sessions[b.server_session];
            if (s->role != MR_ROLE_SERVER || s->token != b.token ||
                !addr_eq(s->addr, s->addr_len, addr, addr_len))
                s = NULL;
        }
        if (h->req_type == MR_SM_DISCONNECT_REQ) {
            if (s != NULL) session_release(c, s);
            server_sm_reply(c, addr, addr_len, MR_SM_DISCONNECT_RESP, MR_OK, &b, NULL, now);
        } else {
            server_sm_reply(c, addr, addr_len, MR_SM_PING_RESP,
                            s ? MR_OK : MR_ERR_INVALID_SESSION, &b, s, now);
        }
        return;
    }
    case MR_SM_CONNECT_RESP:
    case MR_SM_DISCONNECT_RESP:
    case MR_SM_PING_RESP: {
        mr_session *s = session_get(c, b.client_session);
        if (s == NULL || s->role != MR_ROLE_CLIENT || s->token != b.token ||
            !addr_eq(s->addr, s->addr_len, addr, addr_len)) {
            c->stats.rx_unknown_session++;
            return;
        }
        if (h->req_type == MR_SM_CONNECT_RESP) {
            if (s->state != MR_SS_CONNECTING) {
                c->stats.rx_stale++;
                return;
            }
            if (err != MR_OK) {
                client_session_fail(c, s, err == MR_ERR_RING_EXHAUSTED || err == MR_ERR_UNAUTHENTICATED
                                              ? err : MR_ERR_INVALID_SESSION);
                return;
            }
            if (b.server_session >= MR_SESSION_NUM_INVALID) {
                c->stats.rx_malformed++;
                return;
            }
            s->state = MR_SS_CONNECTED;
            s->remote_num = b.server_session;
            s->remote_tag = b.server_tag;
            s->peer_incarnation = b.server_incarnation;
            s->alive_at = now;
            event_push(c, MR_EV_SESSION, 0, s->local_num, MR_OK, 0, NULL, 0);
            client_kick(c, s, now);
        } else if (h->req_type == MR_SM_DISCONNECT_RESP) {
            if (s->state == MR_SS_DISCONNECTING) session_release(c, s);
        } else {
            if (s->state != MR_SS_CONNECTED) return;
            if (err != MR_OK || b.server_incarnation != s->peer_incarnation)
                client_session_fail(c, s, MR_ERR_INVALID_SESSION);
            else
                s->alive_at = now;
        }
        return;
    }
    case MR_SM_RESET: {
        /* A server that does not know the session we used. Confirm with a ping (a reset may
         * be a stale packet from an earlier server) unless it is the very server we
         * connected to, which has then certainly forgotten us. */
        for (uint32_t i = 0; i < c->s.sessions_max; i++) {
            mr_session *s = &c->sessions[i];
            if (s->role != MR_ROLE_CLIENT || s->state != MR_SS_CONNECTED ||
                s->remote_num != b.server_session || s->remote_tag != b.server_tag ||
                !addr_eq(s->addr, s->addr_len, addr, addr_len))
                continue;
            if (b.server_incarnation == s->peer_incarnation)
                client_session_fail(c, s, MR_ERR_INVALID_SESSION);
            else if (elapsed(now, s->ping_sent_at) >= c->s.rto_ns / 10 || s->ping_sent_at == 0)
                client_sm_send(c, s, MR_SM_PING_REQ, now);
        }
        return;
    }
    default:
        c->stats.rx_malformed++;
        return;
    }
}

/* --------------------------------------------------------------- dispatch */

void mr_core_rx(mr_core *c, const uint8_t *addr, uint32_t addr_len, const uint8_t *pkt,
                size_t len, uint64_t now) {
    c->stats.rx_pkts++;
    c->stats.rx_bytes += len;
    if (addr_len == 0 || addr_len > MR_ADDR_MAX || addr == NULL) {
        c->stats.rx_malformed++;
        return;
    }
    if (pkt == NULL || len < MR_HDR_BYTES) {
        c->stats.rx_short++;
        return;
    }
    if (len > c->s.mtu_bytes) {
        c->stats.rx_oversized++;
        return;
    }
    if (c->faults_len) {
        const mr_fault *f = fault_for(c, addr, addr_len);
        if (f != NULL && f->partitioned) {
            c->stats.fault_dropped++;
            return;
        }
    }
    mr_hdr h;
    if (mr_hdr_decode(pkt, len, &h) != 0) {
        c->stats.rx_bad_magic++;
        return;
    }
    const uint8_t *payload = pkt + MR_HDR_BYTES;
    uint32_t plen = (uint32_t)(len - MR_HDR_BYTES);
    if (h.magic == MR_MAGIC_SM) {
        sm_rx(c, addr, addr_len, &h, payload, plen, now);
        return;
    }
    mr_session *s = h.dest_session < c->s.sessions_max ? &c->sessions[h.dest_session] : NULL;
    int from_client = h.pkt_type == MR_PKT_REQ || h.pkt_type == MR_PKT_RFR;
    uint8_t want_role = from_client ? MR_ROLE_SERVER : MR_ROLE_CLIENT;
    if (s == NULL || s->role != want_role || h.session_tag != s->local_tag ||
        !addr_eq(s->addr, s->addr_len, addr, addr_len)) {
        c->stats.rx_unknown_session++;
        if (from_client) {
            /* Tell the client we do not know this session (we may have restarted). */
            mr_sm_body b = {0};
            b.server_incarnation = c->incarnation;
            b.server_session = h.dest_session;
            b.server_tag = h.session_tag; /* names the client session the packet came from */
            sm_send(c, addr, addr_len, MR_SM_RESET, MR_ERR_INVALID_SESSION, &b, now);
        }
        return;
    }
    if (from_client) s->alive_at = now;
    if (h.pkt_type == MR_PKT_REQ)
        server_rx_req(c, s, &h, payload, plen, now);
    else if (h.pkt_type == MR_PKT_RFR)
        server_rx_rfr(c, s, &h, plen, now);
    else
        client_rx_data(c, s, &h, payload, plen, now);
}

void mr_core_tick_holds(mr_core *c, uint64_t now) { hold_scan(c, now); }

void mr_core_tick(mr_core *c, uint64_t now) {
    hold_scan(c, now);
    if (now < c->deadline_at) return;
    c->deadline_at = UINT64_MAX;
    release_delayed(c, now);
    for (uint32_t i = 0; i < c->s.sessions_max; i++) {
        mr_session *s = &c->sessions[i];
        if (s->role != MR_ROLE_CLIENT) continue;
        switch (s->state) {
        case MR_SS_CONNECTING:
        case MR_SS_DISCONNECTING:
            if (elapsed(now, s->sm_started_at) >= c->s.session_timeout_ns) {
                if (s->state == MR_SS_CONNECTING)
                    client_session_fail(c, s, MR_ERR_TIMEOUT);
                else
                    session_release(c, s);
            } else if (elapsed(now, s->sm_sent_at) >= c->s.rto_ns) {
                client_sm_send(c, s, s->state == MR_SS_CONNECTING ? MR_SM_CONNECT_REQ
                                                                  : MR_SM_DISCONNECT_REQ,
                               now);
            } else {
                lower_deadline(c, s->sm_sent_at + c->s.rto_ns);
            }
            break;
        case MR_SS_CONNECTED:
            if (s->busy_slots == 0) break;
            if (elapsed(now, s->alive_at) >= c->s.session_timeout_ns) {
                client_session_fail(c, s, MR_ERR_TIMEOUT);
                break;
            }
            client_retransmit_scan(c, s, now);
            lower_deadline(c, s->alive_at + c->s.session_timeout_ns);
            break;
        default:
            break;
        }
    }
}

uint64_t mr_core_deadline(const mr_core *c) { return c->deadline_at; }

/* --------------------------------------------------------- fault injection */

int mr_core_set_fault(mr_core *c, const uint8_t *addr, uint32_t addr_len, double drop,
                      double duplicate, double reorder, uint64_t delay_ns,
                      uint64_t reorder_delay_ns, int partitioned) {
    if (addr_len > MR_ADDR_MAX || !(drop >= 0 && drop <= 1) || !(duplicate >= 0 && duplicate <= 1) ||
        !(reorder >= 0 && reorder <= 1))
        return -MR_ERR_BAD_ARGUMENT;
    mr_fault *f = NULL;
    for (uint32_t i = 0; i < c->faults_len; i++)
        if (addr_eq(c->faults[i].addr, c->faults[i].addr_len, addr, addr_len)) f = &c->faults[i];
    if (f == NULL) {
        if (c->faults_len == MR_FAULT_RULES_MAX) return -MR_ERR_BAD_ARGUMENT;
        f = &c->faults[c->faults_len++];
    }
    memset(f, 0, sizeof(*f));
    f->addr_len = addr_len;
    if (addr_len) memcpy(f->addr, addr, addr_len);
    f->drop = drop;
    f->duplicate = duplicate;
    f->reorder = reorder;
    f->delay_ns = delay_ns;
    f->reorder_delay_ns = reorder_delay_ns;
    f->partitioned = partitioned;
    return 0;
}

void mr_core_clear_faults(mr_core *c) { c->faults_len = 0; }
