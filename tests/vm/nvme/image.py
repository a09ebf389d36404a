#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The NVMe test image of the VM harness: made fresh for every run, checked after it.

  image.py make   IMAGE SIZE_MIB          write the patterned image
  image.py verify IMAGE [WRITES_FILE]     exit 1 unless IMAGE holds the pattern, except where
                                          WRITES_FILE says the guest wrote, which must hold
                                          the written pattern

The pattern, which suites compute themselves to check what they read:
  unwritten: the 64-bit little-endian word at byte offset o is PATTERN_TAG | o
  written:   a guest write of seed s puts WRITE_MUL * s + o (mod 2**64) at byte offset o
WRITES_FILE has one line per write that must still be on the disk: "<offset> <length> <seed>"
(byte offset and length multiples of 8; a later line wins where two overlap).
"""
import array
import sys

PATTERN_TAG = 0xA5 << 56
WRITE_MUL = 0x9E3779B97F4A7C15
MASK = (1 << 64) - 1


def pattern_words(start, count):
    return array.array("Q", (PATTERN_TAG | (start + 8 * i) for i in range(count)))


def written_words(seed, start, count):
    base = (WRITE_MUL * seed) & MASK
    return array.array("Q", (((base + start + 8 * i) & MASK) for i in range(count)))


def make(path, size_mib):
    size = size_mib << 20
    chunk = 1 << 20
    with open(path, "wb") as f:
        for off in range(0, size, chunk):
            f.write(pattern_words(off, chunk // 8).tobytes())


def verify(path, writes_path=None):
    data = array.array("Q")
    with open(path, "rb") as f:
        data.frombytes(f.read())
    expect = pattern_words(0, len(data))
    writes = []
    if writes_path:
        with open(writes_path) as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                off, length, seed = (int(x, 0) for x in line.split())
                if off % 8 or length % 8 or off + length > 8 * len(data):
                    sys.exit(f"{writes_path}:{n}: bad write record {line.strip()!r}")
                writes.append((off, length, seed))
    for off, length, seed in writes:
        expect[off // 8:(off + length) // 8] = written_words(seed, off, length // 8)
    if data == expect:
        print(f"nvme image: {8 * len(data)} bytes as expected ({len(writes)} guest writes)")
        return
    bad = [i for i in range(len(data)) if data[i] != expect[i]]
    first = bad[0]
    sys.exit(f"nvme image: {len(bad)} words differ; first at byte {8 * first}: "
             f"{data[first]:#018x}, expected {expect[first]:#018x}")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "make":
        make(sys.argv[2], int(sys.argv[3]))
    elif len(sys.argv) in (3, 4) and sys.argv[1] == "verify":
        verify(sys.argv[2], sys.argv[3] if len(sys.argv) == 4 else None)
    else:
        sys.exit(__doc__)
