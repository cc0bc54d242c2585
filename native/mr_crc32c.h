/* CRC-32C of the write-ahead log (mr_crc32c.c). */
#ifndef MR_CRC32C_H
#define MR_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* The CRC-32C of data, continuing from crc (0 to start). */
uint32_t mr_crc32c(uint32_t crc, const uint8_t *data, size_t len);

#endif
