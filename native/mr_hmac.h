/* HMAC-SHA-256 for the RPC core's session authentication (mr_hmac.c). */
#ifndef MR_HMAC_H
#define MR_HMAC_H

#include <stddef.h>
#include <stdint.h>

#define MR_HMAC_BYTES 32u

/* HMAC-SHA-256 of the concatenation a || b under key (either part may be empty). */
void mr_hmac_sha256(const uint8_t *key, size_t key_len, const uint8_t *a, size_t a_len,
                    const uint8_t *b, size_t b_len, uint8_t out[MR_HMAC_BYTES]);

/* 1 if the two MACs are equal, compared in constant time. */
int mr_mac_equal(const uint8_t *x, const uint8_t *y, size_t len);

#endif
