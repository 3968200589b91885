#!/usr/bin/env python3
"""fatbin_ptx.py LIBRARY ARCH COUNT MIN_BYTES MAX_BYTES OUT_PREFIX

Writes up to COUNT PTX entries for compute_ARCH found in the fatbins of
LIBRARY (an ELF shared library such as libcublas.so), those whose text is
MIN_BYTES to MAX_BYTES long, to OUT_PREFIX<n>.ptx, and prints their paths.
The test uses it to get PTX from a real library without cuobjdump (not in
every toolkit install). Reads the fatbin container directly: header
(magic 0xBA55ED50, version 1, header size 16, payload size) and entries
(kind 1 = PTX); entries compressed with ZSTD (flag 0x8000) are inflated
with the zstd command; LZ4-compressed entries (flag 0x2000, raw blocks the
lz4 command cannot read) are skipped.
"""
import mmap
import struct
import subprocess
import sys

FATBIN_MAGIC = b"\x50\xed\x55\xba"
ENTRY = struct.Struct("<HHIQIIHHIIIQQQ")
PTX = 1
ZSTD = 0x8000
LZ4 = 0x2000


def entries(m):
    pos = 0
    while True:
        pos = m.find(FATBIN_MAGIC, pos)
        if pos < 0:
            return
        _, version, header, size = struct.unpack_from("<IHHQ", m, pos)
        if version != 1 or header != 16 or pos + header + size > len(m):
            pos += 4
            continue
        e, end = pos + header, pos + header + size
        while e + ENTRY.size <= end:
            (kind, _, ehead, esize, csize, _, _, _, arch, _, _, flags, _, dsize) = ENTRY.unpack_from(m, e)
            if ehead == 0 or e + ehead + esize > end:
                break
            yield kind, arch, flags, dsize, bytes(m[e + ehead:e + ehead + (csize or esize)])
            e += ehead + esize
        pos = end


def main():
    lib, arch, count, low, high, prefix = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), \
        int(sys.argv[5]), sys.argv[6]
    with open(lib, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        n = 0
        for kind, earch, flags, dsize, data in entries(m):
            if n == count:
                break
            if kind != PTX or earch != arch or flags & LZ4:
                continue
            if flags & ZSTD:
                if not low <= dsize <= high:
                    continue
                data = subprocess.run(["zstd", "-q", "-d", "-c"], input=data, capture_output=True, check=True).stdout
            text = data.split(b"\0", 1)[0]
            if not low <= len(text) <= high:
                continue
            path = "%s%d.ptx" % (prefix, n)
            with open(path, "wb") as out:
                out.write(text)
            print(path)
            n += 1


if __name__ == "__main__":
    main()
