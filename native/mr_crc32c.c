/* CRC-32C (Castagnoli, polynomial 0x1EDC6F41 reflected: 0x82F63B78), the checksum of the
 * write-ahead log's records (store/node/wal.py). Table-driven, one byte at a time: the log
 * checksums each record once as it is written and once as it is read back. Checked against
 * the standard's check value and RFC 3720's test vectors (tests/node/test_wal.py). */

#include "mr_crc32c.h"

static uint32_t table[256];
static int table_ready;

static void build_table(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1u) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        table[i] = c;
    }
    table_ready = 1;
}

uint32_t mr_crc32c(uint32_t crc, const uint8_t *data, size_t len) {
    if (!table_ready) build_table();
    crc = ~crc;
    for (size_t i = 0; i < len; i++) crc = table[(crc ^ data[i]) & 0xFFu] ^ (crc >> 8);
    return ~crc;
}
