/*
 * Meridian RPC protocol core: an eRPC-style (Kalia et al., NSDI '19) two-sided datagram RPC
 * state machine, sans-I/O.
 *
 * Theory of operation (see docs/rpc.md for the long form):
 *
 *  - The core is fed received datagrams (mr_core_rx) and the current time, and is told about
 *    local calls (create a session, enqueue a request, enqueue a response). In return it queues
 *    datagrams to send (mr_core_tx_*), events for the application (completed requests at a
 *    server, completed responses or failures at a client, session state changes), and it
 *    reports its next deadline (mr_core_deadline). It never reads a clock, never sleeps and
 *    never touches a socket; time is always an argument in nanoseconds.
 *  - A session joins a client and a server endpoint. It has a window of request slots
 *    (session_req_window, eRPC's kSessionReqWindow = 8); requests beyond it wait in a bounded
 *    backlog. A request in slot i has req_num = i + k * window, so the server finds the slot
 *    from the number alone.
 *  - Credits (eRPC's kSessionCredits = 32) bound the packets a client has in flight on one
 *    session: every request packet and request-for-response (RFR) packet it sends costs one
 *    credit; every explicit credit return (CR) and response packet it receives returns one.
 *    The server is reactive: it answers each packet with at most one packet and never
 *    retransmits, so the client's credits bound the server's packets too (the one exception,
 *    an unasked "held" per request, is below).
 *  - Only the client retransmits. Per slot it counts packets sent (num_tx) and received
 *    (num_rx) in "wire order" (request packets, then RFRs); it accepts only the packet it
 *    expects next, and when a slot makes no progress for rto_ns it rolls num_tx back to num_rx
 *    (go-back-N to the last in-order packet) and sends again.
 *  - The server keeps the last response of each slot, so a duplicate request is answered from
 *    that cache without running the handler again: at-most-once execution per request.
 *  - A handler may take long (a commit waits for a wide-area round trip). A duplicate of a
 *    request whose handler is still running is answered with a CR for the request's last
 *    packet ("held": not a credit return, and not in wire order); the client then retries
 *    that slot only every rto_held_ns instead of every rto_ns, since only a lost response is
 *    left to recover. Without it a 75 ms handler cost 15 retransmissions and a ping each.
 *  - The client's timeout adapts per session (RFC 6298: srtt + 4 rttvar, between rto_ns and
 *    rto_max_ns), from the round trips of requests sent once and never said "held" (Karn's
 *    rule): a request waiting milliseconds behind a busy Python server's other handlers is
 *    not taken for a loss, while on a fast path a loss is still recovered after rto_ns. No
 *    backoff on a timeout (RFC 6298, 5.5): without fast retransmit, doubling made every
 *    burst of losses on a fast lossy path cost up to rto_max_ns (the simulator's list-append
 *    at 5% loss: 10% fewer commits). So it learns only from the requests answered within
 *    the timeout in use: a path whose every round trip is longer stays at rto_ns.
 *    A server also says "held" unasked, once, for a request whose handler has run for
 *    hold_ack_ns (at most rto_ns / 2), so a busy Python handler does not draw a retransmission and
 *    a ping at all. It is sent when the server next receives or ticks (no timer of its own):
 *    an idle server with a long handler leaves it to the duplicate, as before. This is the
 *    one packet a server sends unprompted; at most one per request.
 *  - Session management (connect, disconnect, ping, reset) runs on a slow path with its own
 *    packet format (same 16-byte header, another magic) and unique tokens, so duplicated or
 *    reordered handshake packets are harmless. Each end of a session draws a random 16-bit
 *    tag that every data packet to it carries (the header's 16 bits beyond eRPC's fields), so
 *    a delayed packet of an earlier session that had the same number is not taken for one of
 *    the current session; session numbers are also handed out round-robin.
 *  - Every field read from the network is bounds-checked; a packet that does not make sense
 *    is dropped and counted, never trusted.
 */
#ifndef MERIDIAN_MR_CORE_H
#define MERIDIAN_MR_CORE_H

#include <stddef.h>
#include <stdint.h>

#define MR_HDR_BYTES 16u
#define MR_ADDR_MAX 32u
#define MR_MAGIC_DATA 11u /* eRPC's kPktHdrMagic */
#define MR_MAGIC_SM 12u
/* A bundle (the UDP adapter's, mr_module.c): one datagram carrying several packets for one
 * destination. Its first 16 bytes are zero but for this magic; then, per packet, its length
 * (2 bytes, little-endian) and the packet. The core itself never sees one: a bundle handed to
 * mr_core_rx is dropped as a bad magic. */
#define MR_MAGIC_BUNDLE 13u
#define MR_MSG_SIZE_LIMIT ((1u << 24) - 1u) /* 24-bit msg_size field */
#define MR_PKT_NUM_LIMIT (1u << 14)         /* 14-bit pkt_num field */
#define MR_REQ_NUM_MASK ((1ull << 44) - 1ull)
#define MR_SESSION_NUM_INVALID 0xFFFFu
#define MR_SM_BODY_BYTES 40u
#define MR_FAULT_RULES_MAX 16u

/* pkt_type values, as in eRPC's PktType. */
enum { MR_PKT_REQ = 0, MR_PKT_RFR = 1, MR_PKT_CR = 2, MR_PKT_RESP = 3 };

/* Session-management packet types (eRPC's SmPktType plus a reset). */
enum {
    MR_SM_CONNECT_REQ = 1,
    MR_SM_CONNECT_RESP = 2,
    MR_SM_DISCONNECT_REQ = 3,
    MR_SM_DISCONNECT_RESP = 4,
    MR_SM_PING_REQ = 5,
    MR_SM_PING_RESP = 6,
    MR_SM_RESET = 7,
};

/* Error codes carried by session-management packets and by failure events. */
enum {
    MR_OK = 0,
    MR_ERR_RING_EXHAUSTED = 1, /* server out of credits / sessions: connect refused */
    MR_ERR_INVALID_SESSION = 2, /* server does not know the session: it restarted */
    MR_ERR_TIMEOUT = 3,         /* no answer from the peer within session_timeout_ns */
    MR_ERR_CLOSED = 4,          /* the session was destroyed locally */
    MR_ERR_TOO_LARGE = 5,       /* message larger than msg_size_max */
    MR_ERR_BACKLOG_FULL = 6,    /* more than backlog_max requests queued on a session */
    MR_ERR_NO_SESSION = 7,      /* unknown or unusable local session number */
    MR_ERR_STALE = 8,           /* response for a request the server no longer holds */
    MR_ERR_NO_MEMORY = 9,
    MR_ERR_BAD_ARGUMENT = 10,
    MR_ERR_UNAUTHENTICATED = 11, /* the server requires the cluster secret: connect refused */
};

/* Event kinds handed to the application. */
enum {
    MR_EV_REQUEST = 0,  /* server: a whole request arrived; respond with mr_core_respond */
    MR_EV_RESPONSE = 1, /* client: a whole response arrived for request `id` (the tag) */
    MR_EV_FAILED = 2,   /* client: request `id` failed with `code` (its session failed) */
    MR_EV_SESSION = 3,  /* client: session `session` connected (code 0) or failed (code) */
};

typedef struct mr_settings {
    uint32_t mtu_bytes;          /* datagram size limit, header included */
    uint32_t session_credits;    /* packets in flight per session (eRPC: 32) */
    uint32_t session_req_window; /* outstanding requests per session (eRPC: 8) */
    uint64_t rto_ns;             /* retransmission timeout (eRPC: 5 ms) */
    uint64_t rto_max_ns;         /* ceiling of the adaptive timeout (floor: rto_ns) */
    uint64_t rto_held_ns;        /* the same for a request the server said it holds */
    uint64_t hold_ack_ns;        /* server: say "held" unasked once a handler has run this
                                  * long, at most rto_ns / 2 (0: only to a duplicate) */
    uint32_t msg_size_max;       /* largest request or response (default 8 MiB) */
    uint32_t sessions_max;       /* local session table size, both roles */
    uint32_t server_credits_max; /* sum of credits granted to server sessions */
    uint64_t session_timeout_ns; /* silence from a peer with work outstanding => failure */
    uint32_t backlog_max;        /* requests queued per session beyond the window */
    uint32_t tx_queue_max;       /* packets queued for sending before drops */
    uint64_t rx_reassembly_bytes_max; /* bytes a server holds for requests being received */
    uint64_t seed;               /* PRNG seed: tokens, incarnation, fault injection */
} mr_settings;

typedef struct mr_stats {
    uint64_t rx_pkts, rx_bytes, tx_pkts, tx_bytes;
    uint64_t rx_short;            /* shorter than a header */
    uint64_t rx_oversized;        /* longer than the MTU (or truncated by the socket) */
    uint64_t rx_bad_magic;        /* wrong magic or reserved bits set */
    uint64_t rx_malformed;        /* fields inconsistent with each other or with settings */
    uint64_t rx_no_buffer;        /* a new request refused: reassembly limit or no memory */
    uint64_t rx_unknown_session;  /* no such session, or wrong role or source address */
    uint64_t rx_stale;            /* old request number, or nothing waiting for it */
    uint64_t rx_out_of_order;     /* ahead of the next expected packet: dropped */
    uint64_t rx_dup_answered;     /* duplicate request packet answered from the cache */
    uint64_t rx_dup_in_handler;   /* duplicate of a request whose handler is still running */
    uint64_t rx_held;             /* client: "held by its handler" acknowledgements */
    uint64_t held_sent;           /* server: "held" said unasked (hold_ack_ns) */
    uint64_t retransmits;         /* go-back-N rollbacks */
    uint64_t requests_handled;    /* request events delivered to handlers */
    uint64_t responses_received;  /* response events delivered to continuations */
    uint64_t sessions_refused;
    uint64_t sm_unauthenticated; /* session packets without a valid MAC, dropped or refused */
    uint64_t sessions_failed;
    uint64_t tx_queue_dropped;
    uint64_t tx_send_failed;      /* counted by the transport adapter */
    uint64_t fault_dropped, fault_duplicated, fault_delayed;
    uint64_t in_flight_max;       /* largest credits-in-use ever seen on one session */
} mr_stats;

typedef struct mr_event {
    uint8_t kind;
    uint8_t req_type; /* REQUEST: request type; RESPONSE: status byte from the server */
    uint16_t session;
    int32_t code;     /* FAILED/SESSION: MR_ERR_*; REQUEST: the session's generation */
    uint64_t id;      /* REQUEST: req_num; RESPONSE/FAILED: the tag given at enqueue */
    uint8_t *data;    /* malloc'd payload owned by the event (NULL when size == 0) */
    uint32_t size;
} mr_event;

typedef struct mr_core mr_core;

void mr_settings_default(mr_settings *s);
/* Returns NULL if the settings are inconsistent (see mr_settings_check) or on ENOMEM. */
mr_core *mr_core_new(const mr_settings *s);
void mr_core_free(mr_core *c);
/* 0 if valid, else a static string naming the bad setting. */
const char *mr_settings_check(const mr_settings *s);
const mr_settings *mr_core_settings(const mr_core *c);
uint64_t mr_core_incarnation(const mr_core *c);

/* Client side. Returns a session number >= 0 or -MR_ERR_*. */
int mr_core_create_session(mr_core *c, const uint8_t *addr, uint32_t addr_len, uint64_t now);
int mr_core_destroy_session(mr_core *c, int session, uint64_t now);
int mr_core_enqueue_request(mr_core *c, int session, uint8_t req_type, const uint8_t *data,
                            uint32_t size, uint64_t tag, uint64_t now);
/* Server side: answer the request identified by (session, generation, req_num), as given
 * by its REQUEST event; the generation tells a reused session number from the one the request
 * came on. status 0 = OK. */
int mr_core_respond(mr_core *c, int session, uint32_t generation, uint64_t req_num,
                    uint8_t status, const uint8_t *data, uint32_t size, uint64_t now);

/* Feed one received datagram from `addr`. Never fails: bad input is dropped and counted. */
void mr_core_rx(mr_core *c, const uint8_t *addr, uint32_t addr_len, const uint8_t *pkt,
                size_t len, uint64_t now);
/* Count a datagram the transport had to truncate (bigger than its buffer). */
void mr_core_rx_oversized(mr_core *c);
/* Run timers due at `now`: retransmissions, handshake retries, session timeouts, release of
 * packets held by fault injection. */
void mr_core_tick(mr_core *c, uint64_t now);
/* Only the "held" notices due at `now` (hold_ack_ns): for a transport that read part of what
 * waits and must not judge a timeout before it has read the rest (a loop that stalled has
 * the answers that keep a session alive still in its socket). */
void mr_core_tick_holds(mr_core *c, uint64_t now);
/* Earliest time at which mr_core_tick has work, or UINT64_MAX. May be early, never late. */
uint64_t mr_core_deadline(const mr_core *c);

/* Transmit queue. Packets stay valid until mr_core_tx_consume. */
uint32_t mr_core_tx_count(const mr_core *c);
const uint8_t *mr_core_tx_packet(const mr_core *c, uint32_t i, uint32_t *len,
                                 const uint8_t **addr, uint32_t *addr_len);
void mr_core_tx_consume(mr_core *c, uint32_t n);

/* Event queue. The caller takes ownership of ev->data (free() it). */
uint32_t mr_core_event_count(const mr_core *c);
mr_event *mr_core_events(mr_core *c);
void mr_core_events_consume(mr_core *c, uint32_t n);

mr_stats *mr_core_stats(mr_core *c);
void mr_core_stats_tx_failed(mr_core *c, uint64_t n);

typedef struct mr_session_info {
    int role;  /* 1 client, 2 server, 0 free */
    int state; /* see MR_SS_* in mr_core.c; exported as a string by the binding */
    uint32_t credits, credits_max, in_flight_max, busy_slots, backlog;
    uint16_t remote_session, local_tag, remote_tag;
    uint64_t srtt_ns, rttvar_ns, rto_ns; /* client: round-trip estimate, timeout in use */
} mr_session_info;
int mr_core_session_info(const mr_core *c, int session, mr_session_info *out);

/* Fault injection on packets this core sends (and, for partitions, receives). addr_len == 0
 * sets the rule used for every peer without a rule of its own. Probabilities in [0, 1]. */
/* The cluster secret (16..64 bytes; len 0: none). With one, every session-management packet
 * this core sends carries an HMAC-SHA-256 of its header and body under the secret, and every
 * one it receives must: a connect request without a valid one is refused (and counted), any
 * other is dropped (and counted). Data packets are not authenticated (docs/rpc.md). */
int mr_core_set_secret(mr_core *c, const uint8_t *key, uint32_t len);

int mr_core_set_fault(mr_core *c, const uint8_t *addr, uint32_t addr_len, double drop,
                      double duplicate, double reorder, uint64_t delay_ns,
                      uint64_t reorder_delay_ns, int partitioned);
void mr_core_clear_faults(mr_core *c);

/* Header codec, exposed for tests and the fuzz target. Returns 0 if `pkt` is long enough
 * and has a known magic, else -1. */
typedef struct mr_hdr {
    uint8_t req_type;
    uint32_t msg_size;
    uint16_t dest_session;
    uint8_t pkt_type;
    uint16_t pkt_num;
    uint64_t req_num;
    uint8_t magic;
    uint16_t session_tag; /* the receiving session's tag; 0 in session-management packets */
} mr_hdr;
int mr_hdr_decode(const uint8_t *pkt, size_t len, mr_hdr *h);
void mr_hdr_encode(uint8_t *out, const mr_hdr *h);

#endif
