/*
 * Self-test of the protocol core in plain C, run by test_rpc_native_selftest.py under
 * AddressSanitizer, UndefinedBehaviorSanitizer and LeakSanitizer (no Python in the process,
 * so a leak report points at the core).
 *
 * Two cores exchange packets through an in-memory queue that drops, duplicates and reorders;
 * garbage packets are mixed in; every request must get exactly one response with the right
 * bytes, then everything is freed. Exit status 0 means pass.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mr_core.h"

#define REQUESTS 300
#define QUEUE_MAX 100000

typedef struct {
    uint8_t *data;
    size_t len;
    int to_server;
} pkt;

static pkt queue[QUEUE_MAX];
static size_t queue_len;
static uint64_t rng = 88172645463325252ull;

static uint64_t next(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static void collect(mr_core *from, int to_server) {
    uint32_t n = mr_core_tx_count(from);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t len, alen;
        const uint8_t *addr;
        const uint8_t *p = mr_core_tx_packet(from, i, &len, &addr, &alen);
        int copies = (next() % 10 == 0) ? 2 : 1; /* 10% duplicated */
        if (next() % 10 == 0) copies = 0;        /* 10% dropped */
        for (int k = 0; k < copies && queue_len < QUEUE_MAX; k++) {
            queue[queue_len].data = malloc(len);
            memcpy(queue[queue_len].data, p, len);
            queue[queue_len].len = len;
            queue[queue_len].to_server = to_server;
            queue_len++;
        }
    }
    mr_core_tx_consume(from, n);
}

int main(void) {
    mr_settings s;
    mr_settings_default(&s);
    s.mtu_bytes = 512;
    s.msg_size_max = 1 << 20;
    s.rx_reassembly_bytes_max = 1 << 22;
    s.rto_ns = 100000;
    s.session_credits = 8;
    s.session_req_window = 4;
    s.seed = 7;
    mr_core *server = mr_core_new(&s);
    s.seed = 8;
    mr_core *client = mr_core_new(&s);
    if (!server || !client) return 2;
    const uint8_t caddr[] = "client", saddr[] = "server";
    int session = mr_core_create_session(client, saddr, 6, 0);
    static uint32_t sizes[REQUESTS];
    static int answers[REQUESTS];
    for (int i = 0; i < REQUESTS; i++) {
        sizes[i] = (uint32_t)(next() % 5 == 0 ? next() % 20000 : next() % 600);
        uint8_t *b = malloc(sizes[i] + 1);
        for (uint32_t k = 0; k < sizes[i]; k++) b[k] = (uint8_t)(i + k);
        if (mr_core_enqueue_request(client, session, 1, b, sizes[i], (uint64_t)i, 0) != 0) return 3;
        free(b);
    }
    uint64_t now = 0;
    int done = 0;
    for (int step = 0; step < 2000000 && done < REQUESTS; step++) {
        now += 1000;
        collect(client, 1);
        collect(server, 0);
        /* Deliver in a shuffled order (reordering), with some garbage. */
        size_t n = queue_len;
        for (size_t i = n; i > 1; i--) {
            size_t j = next() % i;
            pkt t = queue[i - 1];
            queue[i - 1] = queue[j];
            queue[j] = t;
        }
        queue_len = 0;
        static pkt batch[QUEUE_MAX];
        memcpy(batch, queue, n * sizeof(pkt));
        for (size_t i = 0; i < n; i++) {
            if (batch[i].to_server)
                mr_core_rx(server, caddr, 6, batch[i].data, batch[i].len, now);
            else
                mr_core_rx(client, saddr, 6, batch[i].data, batch[i].len, now);
            if (next() % 50 == 0) {
                uint8_t junk[64];
                size_t jl = next() % sizeof junk;
                for (size_t k = 0; k < jl; k++) junk[k] = (uint8_t)next();
                if (jl >= 16 && next() % 2) { /* valid magic, random fields */
                    junk[13] = (junk[13] & 0x0F) | (uint8_t)((MR_MAGIC_DATA & 0xF) << 4);
                    junk[14] = 0;
                    junk[15] = 0;
                }
                mr_core_rx(batch[i].to_server ? server : client,
                           batch[i].to_server ? caddr : saddr, 6, junk, jl, now);
            }
            free(batch[i].data);
        }
        mr_core_tick(client, now);
        mr_core_tick(server, now);
        mr_event *ev = mr_core_events(server);
        uint32_t ne = mr_core_event_count(server);
        for (uint32_t i = 0; i < ne; i++) {
            if (ev[i].kind == MR_EV_REQUEST) {
                /* Answer with the request reversed. */
                uint8_t *r = malloc(ev[i].size + 1);
                for (uint32_t k = 0; k < ev[i].size; k++) r[k] = ev[i].data[ev[i].size - 1 - k];
                mr_core_respond(server, ev[i].session, (uint32_t)ev[i].code, ev[i].id, 0, r,
                                ev[i].size, now);
                free(r);
            }
            free(ev[i].data);
        }
        mr_core_events_consume(server, ne);
        ev = mr_core_events(client);
        ne = mr_core_event_count(client);
        for (uint32_t i = 0; i < ne; i++) {
            if (ev[i].kind == MR_EV_RESPONSE) {
                uint64_t id = ev[i].id;
                if (id >= REQUESTS || answers[id]++ != 0) {
                    fprintf(stderr, "request %llu answered twice\n", (unsigned long long)id);
                    return 4;
                }
                if (ev[i].size != sizes[id]) return 5;
                for (uint32_t k = 0; k < ev[i].size; k++)
                    if (ev[i].data[k] != (uint8_t)(id + ev[i].size - 1 - k)) return 6;
                done++;
            } else if (ev[i].kind == MR_EV_FAILED) {
                fprintf(stderr, "request failed: %d\n", ev[i].code);
                return 7;
            }
            free(ev[i].data);
        }
        mr_core_events_consume(client, ne);
    }
    for (size_t i = 0; i < queue_len; i++) free(queue[i].data);
    if (done != REQUESTS) {
        fprintf(stderr, "only %d of %d requests answered\n", done, REQUESTS);
        return 8;
    }
    /* Leave state behind on purpose (sessions, cached responses): free must release it. */
    mr_core_destroy_session(client, session, now);
    mr_core_free(client);
    mr_core_free(server);
    printf("ok %d requests, %llu server packets\n", done, (unsigned long long)now / 1000);
    return 0;
}
