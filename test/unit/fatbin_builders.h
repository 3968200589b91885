// Synthetic fatbins and ELF cubins, laid out as nvcc 13 lays them out
// (speculation/src/fatbin.cc and cubin.cc describe the formats), for the
// tests that need no nvcc: broken inputs, records nvcc writes only in cases
// too slow to compile here, and the fuzzer's seeds.
#pragma once

#include <lz4.h>
#include <zstd.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace phos::test {

using ByteVec = std::vector<std::byte>;

// Appends little-endian values.
struct ByteWriter {
  ByteVec out;
  void le(uint64_t v, int n) {
    for (int i = 0; i < n; i++) out.push_back(std::byte(v >> (8 * i)));
  }
  void u8(uint8_t v) { le(v, 1); }
  void u16(uint16_t v) { le(v, 2); }
  void u32(uint32_t v) { le(v, 4); }
  void u64(uint64_t v) { le(v, 8); }
  void bytes(const void* p, size_t n) {
    auto b = static_cast<const std::byte*>(p);
    out.insert(out.end(), b, b + n);
  }
  void bytes(const ByteVec& b) { out.insert(out.end(), b.begin(), b.end()); }
  void pad(size_t alignment) {
    while (out.size() % alignment) out.push_back(std::byte{0});
  }
};

inline void patch_le(ByteVec* b, size_t offset, uint64_t v, int n) {
  for (int i = 0; i < n; i++) (*b)[offset + i] = std::byte(v >> (8 * i));
}

inline ByteVec to_bytes(const std::string& s) {
  return ByteVec(reinterpret_cast<const std::byte*>(s.data()), reinterpret_cast<const std::byte*>(s.data()) + s.size());
}

// ---- fatbins

constexpr uint16_t kTestKindPtx = 1, kTestKindElf = 2;
constexpr uint64_t kTestFlags = 0x11, kTestFlagLz4 = 0x2000, kTestFlagZstd = 0x8000;

struct TestEntry {
  uint16_t kind = kTestKindElf;
  uint32_t arch = 90;
  uint64_t flags = kTestFlags;
  ByteVec payload;                 // as stored (compressed where the flags say)
  uint32_t compressed_size = 0;    // 0 where not compressed
  uint64_t uncompressed_size = 0;  // 0 where not compressed
  std::string identifier;          // in a header extension, as -G writes it
};

inline TestEntry plain_entry(uint16_t kind, uint32_t arch, const ByteVec& contents) {
  TestEntry e;
  e.kind = kind;
  e.arch = arch;
  e.payload = contents;
  return e;
}

// `compress(contents, out)` writes into *out (sized to the bound) and says
// how much it wrote.
template <class Compress>
TestEntry compressed_entry(uint16_t kind, uint32_t arch, uint64_t flag, const ByteVec& contents, size_t bound,
                           Compress compress) {
  TestEntry e = plain_entry(kind, arch, ByteVec(bound));
  e.flags |= flag;
  e.payload.resize(compress(contents, &e.payload));
  e.compressed_size = uint32_t(e.payload.size());
  e.uncompressed_size = contents.size();
  return e;
}

inline TestEntry lz4_entry(uint16_t kind, uint32_t arch, const ByteVec& contents) {
  return compressed_entry(kind, arch, kTestFlagLz4, contents, size_t(LZ4_compressBound(int(contents.size()))),
                          [](const ByteVec& in, ByteVec* out) {
                            return size_t(LZ4_compress_default(reinterpret_cast<const char*>(in.data()),
                                                               reinterpret_cast<char*>(out->data()), int(in.size()),
                                                               int(out->size())));
                          });
}

inline TestEntry zstd_entry(uint16_t kind, uint32_t arch, const ByteVec& contents) {
  return compressed_entry(kind, arch, kTestFlagZstd, contents, ZSTD_compressBound(contents.size()),
                          [](const ByteVec& in, ByteVec* out) {
                            return ZSTD_compress(out->data(), out->size(), in.data(), in.size(), 3);
                          });
}

// Offsets of an entry header's fields, for tests that break them.
constexpr size_t kFatbinHeaderBytes = 16, kEntrySizeField = 0x08, kEntryCompressedField = 0x10,
                 kEntryIdentifierField = 0x20, kEntryUncompressedField = 0x38;

inline ByteVec make_fatbin(const std::vector<TestEntry>& entries) {
  ByteWriter w;
  w.u32(0xBA55ED50);
  w.u16(1);
  w.u16(kFatbinHeaderBytes);
  w.u64(0);  // patched below
  for (const TestEntry& e : entries) {
    size_t id_size = e.identifier.empty() ? 0 : (e.identifier.size() + 8) / 8 * 8;
    size_t padded = (e.payload.size() + 7) / 8 * 8;
    w.u16(e.kind);
    w.u16(0x0101);
    w.u32(uint32_t(0x40 + id_size));
    w.u64(padded);
    w.u32(e.compressed_size);
    w.u32(e.kind == kTestKindElf ? 0 : 0x40);
    w.u16(e.kind == kTestKindElf ? 8 : 0);  // minor: ELF 1.8, PTX 9.0
    w.u16(e.kind == kTestKindElf ? 1 : 9);
    w.u32(e.arch);
    w.u32(id_size ? 0x40 : 0);
    w.u32(uint32_t(e.identifier.size()));
    w.u64(e.flags);
    w.u64(0);
    w.u64(e.uncompressed_size);
    w.bytes(e.identifier.data(), e.identifier.size());
    w.out.resize(w.out.size() + id_size - e.identifier.size());
    w.bytes(e.payload);
    w.pad(8);
  }
  patch_le(&w.out, 8, w.out.size() - kFatbinHeaderBytes, 8);
  return w.out;
}

// ---- ELF cubins

struct TestParam {
  uint16_t ordinal = 0, offset = 0;
  uint32_t size = 0;
  uint8_t log_alignment = 0, space = 0;
  bool v2 = false;  // EIATTR_KPARAM_INFO_V2 rather than EIATTR_KPARAM_INFO
};

struct TestKernel {
  std::string name;
  std::vector<TestParam> params;  // written last ordinal first, as nvcc does
  uint16_t cbank_param_size = 0;  // EIATTR_CBANK_PARAM_SIZE, none where 0
  uint16_t param_cbank_size = 0;  // EIATTR_PARAM_CBANK, none where 0
  bool entry = true;              // STO_CUDA_ENTRY: a kernel, not a __device__ function
  ByteVec extra_records;          // appended to its .nv.info section
};

inline ByteVec kparam_record(const TestParam& p) {
  ByteWriter w;
  w.u8(4);
  w.u8(p.v2 ? 0x45 : 0x17);
  w.u16(12);
  w.u32(0);
  w.u16(p.ordinal);
  w.u16(p.offset);
  if (p.v2) {
    w.u16(uint16_t(p.size));
    w.u8(p.log_alignment);
    w.u8(p.space);
  } else {
    w.u32(p.size << 18 | 0x1f << 12 | uint32_t(p.space) << 8 | p.log_alignment);
  }
  return w.out;
}

inline ByteVec nv_info(const TestKernel& k) {
  ByteWriter w;
  w.u8(4), w.u8(0x37), w.u16(4), w.u32(0x82);  // EIATTR_CUDA_API_VERSION, as nvcc writes first
  for (auto p = k.params.rbegin(); p != k.params.rend(); ++p) w.bytes(kparam_record(*p));
  w.u8(3), w.u8(0x1b), w.u16(0xff);  // EIATTR_MAXREG_COUNT (HVAL)
  w.u8(2), w.u8(0x4a), w.u16(0);     // a BVAL record, as sm_100+ cubins have
  w.u8(1), w.u8(0x35), w.u16(0);     // an NVAL record (EIATTR_SW2861232_WAR)
  if (k.cbank_param_size) w.u8(3), w.u8(0x19), w.u16(k.cbank_param_size);
  if (k.param_cbank_size) w.u8(4), w.u8(0x0a), w.u16(8), w.u32(0), w.u16(0x210), w.u16(k.param_cbank_size);
  w.bytes(k.extra_records);
  return w.out;
}

// Offsets into a make_cubin() result, for tests that break it.
struct CubinLayout {
  size_t first_info_section_header = 0;  // of kernels[0]'s .nv.info section
  size_t first_info_contents = 0;
  size_t symtab_contents = 0;
};

constexpr uint32_t kTestElfFlagsSm90 = 0x06005a04;  // EI_ABIVERSION 8: the SM in bits 8-15

// Sections: null, .shstrtab, .strtab, .symtab, then one .nv.info.<name> per
// kernel; the section headers last, as nvcc places them.
inline ByteVec make_cubin(const std::vector<TestKernel>& kernels, uint32_t e_flags = kTestElfFlagsSm90,
                          uint8_t abi_version = 8, CubinLayout* layout = nullptr) {
  std::string shstrtab(1, '\0'), strtab(1, '\0');
  auto add = [](std::string* table, const std::string& s) {
    uint32_t at = uint32_t(table->size());
    *table += s + '\0';
    return at;
  };
  struct Sh {
    uint32_t name, type, link, info;
    uint64_t offset, size, entsize;
  };
  std::vector<Sh> sh(1, Sh{});
  ByteWriter body;
  body.out.resize(64);
  auto place = [&](const ByteVec& contents) {
    body.pad(8);
    uint64_t at = body.out.size();
    body.bytes(contents);
    return at;
  };
  uint32_t shstrtab_name = add(&shstrtab, ".shstrtab"), strtab_name = add(&shstrtab, ".strtab"),
           symtab_name = add(&shstrtab, ".symtab");
  std::vector<uint32_t> info_names, sym_names;
  for (const TestKernel& k : kernels) {
    info_names.push_back(add(&shstrtab, ".nv.info." + k.name));
    sym_names.push_back(add(&strtab, k.name));
  }
  ByteWriter syms;
  syms.out.resize(24);  // the null symbol
  for (size_t i = 0; i < kernels.size(); i++) {
    syms.u32(sym_names[i]);
    syms.u8(0x12);                          // STB_GLOBAL, STT_FUNC
    syms.u8(kernels[i].entry ? 0x10 : 0);  // STO_CUDA_ENTRY
    syms.u16(0);
    syms.u64(0), syms.u64(0);
  }
  sh.push_back({shstrtab_name, 3, 0, 0, place(to_bytes(shstrtab)), shstrtab.size(), 0});
  sh.push_back({strtab_name, 3, 0, 0, place(to_bytes(strtab)), strtab.size(), 0});
  sh.push_back({symtab_name, 2, 2, 1, place(syms.out), syms.out.size(), 24});
  if (layout) layout->symtab_contents = sh.back().offset;
  for (size_t i = 0; i < kernels.size(); i++) {
    ByteVec info = nv_info(kernels[i]);
    sh.push_back({info_names[i], 0x70000000, 3, 0, place(info), info.size(), 0});
    if (layout && i == 0) layout->first_info_contents = sh.back().offset;
  }
  body.pad(8);
  uint64_t shoff = body.out.size();
  for (const Sh& s : sh) {
    body.u32(s.name), body.u32(s.type), body.u64(0), body.u64(0);
    body.u64(s.offset), body.u64(s.size), body.u32(s.link), body.u32(s.info), body.u64(4), body.u64(s.entsize);
  }
  if (layout) layout->first_info_section_header = shoff + 4 * 64;
  ByteWriter h;
  h.bytes("\x7f" "ELF\x02\x01\x01\x41", 8);
  h.u8(abi_version);
  h.out.resize(16);
  h.u16(2), h.u16(190), h.u32(1);    // ET_EXEC, EM_CUDA, version
  h.u64(0), h.u64(0), h.u64(shoff);  // entry, phoff, shoff
  h.u32(e_flags);
  h.u16(64), h.u16(56), h.u16(0), h.u16(64), h.u16(uint16_t(sh.size())), h.u16(1);
  std::copy(h.out.begin(), h.out.end(), body.out.begin());
  return body.out;
}

}  // namespace phos::test
