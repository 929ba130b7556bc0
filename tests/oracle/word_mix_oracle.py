"""WordMix64, the device weight digest (comm/src/device_digest.rs), written
independently from its definition with Python's unbounded integers: one hex
buffer per line on stdin, its digest as 16 hex digits per line on stdout."""
import sys

M64 = (1 << 64) - 1
KEY = 0x9E3779B97F4A7C15
LEN_KEY = 0xD6E8FEB86659FD93


def fmix64(x):
    x ^= x >> 33
    x = (x * 0xFF51AFD7ED558CCD) & M64
    x ^= x >> 33
    x = (x * 0xC4CEB9FE1A85EC53) & M64
    return x ^ (x >> 33)


def digest(data):
    total = 0
    for j in range(0, (len(data) + 7) // 8):
        word = int.from_bytes(data[8 * j:8 * j + 8].ljust(8, b"\0"), "little")
        total = (total + fmix64(word ^ (((j + 1) * KEY) & M64))) & M64
    return fmix64(total ^ fmix64(len(data) ^ LEN_KEY))


for line in sys.stdin:
    print(f"{digest(bytes.fromhex(line.strip())):016x}")
