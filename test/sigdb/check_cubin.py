#!/usr/bin/env python3
"""Checks a phos-sigdb database against the cubins nvcc compiled from the
same sources: every kernel of the database is a kernel of a cubin, with the
parameters' offsets and sizes nvcc gave them (EIATTR_KPARAM_INFO in
.nv.info.<kernel>), and every kernel of the cubins is in the database but for
those nvcc names after a hash of the file (anonymous namespaces).

  check_cubin.py DATABASE CUBIN...
"""
import re
import struct
import sys

STT_FUNC = 2
STO_CUDA_ENTRY = 0x10
EIFMT_SVAL = 4
EIATTR_KPARAM_INFO = 0x17


def sections(data):
    """{name: (type, bytes)} of an ELF64 little-endian file."""
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise ValueError("not an ELF64 file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names = headers[shstrndx]

    def name(off):
        start = names[4] + off
        return data[start:data.index(b"\0", start)].decode()

    return {name(h[0]): (h[1], data[h[4]:h[4] + h[5]]) for h in headers}


def kernels(path):
    """{kernel name: [(offset, size) by ordinal]} of a cubin."""
    data = open(path, "rb").read()
    secs = sections(data)
    symtab, strtab = secs[".symtab"][1], secs[".strtab"][1]
    out = {}
    for i in range(0, len(symtab), 24):
        st_name, st_info, st_other, _, _, _ = struct.unpack_from("<IBBHQQ", symtab, i)
        if st_info & 0xF == STT_FUNC and st_other & STO_CUDA_ENTRY:
            name = strtab[st_name:strtab.index(b"\0", st_name)].decode()
            out[name] = []
    for name in out:
        info = secs.get(".nv.info." + name, (0, b""))[1]
        params = {}
        i = 0
        while i + 4 <= len(info):
            fmt, attr, value = struct.unpack_from("<BBH", info, i)
            i += 4
            if fmt != EIFMT_SVAL:
                continue
            if attr == EIATTR_KPARAM_INFO:
                _, ordinal, offset, flags = struct.unpack_from("<IHHI", info, i)
                params[ordinal] = (offset, (flags >> 18) & 0x3FFF)
            i += value
        out[name] = [params[k] for k in sorted(params)]
    return out


def database(path):
    """{kernel name: [(offset, size)]} of a phos-sigdb file."""
    out = {}
    for line in open(path):
        line = line.split("#", 1)[0].split()
        if not line or line == ["phos-sigdb", "1"]:
            continue
        out[line[0]] = [(int(m[2]), int(m[1])) for m in (re.match(r"\w+:(\d+)@(\d+)", p) for p in line[1:])]
    return out


def main():
    db = database(sys.argv[1])
    nvcc = {}
    for cubin in sys.argv[2:]:
        nvcc.update(kernels(cubin))
    errors = []
    for name, params in db.items():
        if name not in nvcc:
            errors.append(f"{name}: not a kernel of nvcc's cubins")
        elif params != nvcc[name]:
            errors.append(f"{name}: (offset, size) {params}, nvcc {nvcc[name]}")
    for name in nvcc:
        if name not in db and "_GLOBAL__N_" not in name:
            errors.append(f"{name}: nvcc's kernel is not in the database")
    for e in errors:
        print(f"[sigdb] {e}")
    print(f"[sigdb] {len(db)} kernels checked against {len(nvcc)} in nvcc's cubins: {len(errors)} errors")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
