// The kernels of an ELF cubin and their parameters, from the symbol table and
// the per-kernel .nv.info.<name> sections.
//
// What nvcc 13 writes (checked against its output for sm_75 to sm_121):
//   - 64-bit little-endian ELF, e_machine EM_CUDA (190), EI_OSABI 0x41 and
//     EI_ABIVERSION 8; the SM version in e_flags bits 8-15. Older toolkits
//     wrote EI_ABIVERSION 7 with the SM version in the low byte.
//   - kernels are STT_FUNC symbols with STO_CUDA_ENTRY (0x10) in st_other;
//     __device__ functions of relocatable code have .nv.info.<name> sections
//     too, so the flag, not the section, says what is a kernel.
//   - .nv.info.<mangled name> (type SHT_CUDA_INFO, sh_info the kernel's
//     .text section) holds the kernel's records; the global .nv.info holds
//     per-function resource records (registers, stack) keyed by symbol index,
//     nothing about parameters, and is not read.
//   - a record is u8 format, u8 attribute, u16 value; for EIFMT_SVAL the u16
//     is the size of the bytes that follow. No padding between records.
#include <algorithm>
#include <cstring>
#include <string_view>
#include <unordered_map>

#include "binary_reader.h"
#include "phos/speculation/fatbin.h"

namespace phos::speculation {
namespace {

using namespace detail;

constexpr uint16_t kEmCuda = 190;
constexpr uint8_t kElfClass64 = 2, kElfDataLsb = 1;
constexpr uint8_t kCudaAbiSmInBits8To15 = 8;  // ELFABIVERSION_CUDA_V2
constexpr size_t kEhdrSize = 64, kShdrSize = 64, kSymSize = 24;
constexpr uint32_t kShtSymtab = 2, kShtNobits = 8, kShtCudaInfo = 0x70000000;
constexpr uint16_t kShnXindex = 0xffff;
constexpr uint8_t kSttFunc = 2, kStoCudaEntry = 0x10;
constexpr std::string_view kInfoPrefix = ".nv.info.";

// .nv.info record formats and the attributes read here.
constexpr uint8_t kFmtNval = 1, kFmtBval = 2, kFmtHval = 3, kFmtSval = 4;
constexpr uint8_t kAttrParamCbank = 0x0a, kAttrKparamInfo = 0x17, kAttrCbankParamSize = 0x19,
                  kAttrKparamInfoV2 = 0x45;

struct ElfHeader {
  uint8_t abi_version = 0;
  uint32_t flags = 0;
  uint64_t phoff = 0, shoff = 0;
  uint16_t phentsize = 0, phnum = 0, shnum = 0, shstrndx = 0;
};

struct Section {
  uint32_t name = 0, type = 0, link = 0, info = 0;
  uint64_t offset = 0, size = 0, entsize = 0;
};

struct Elf {
  Bytes bytes;
  ElfHeader header;
  std::vector<Section> sections;
  Bytes shstrtab;
};

bool read_elf_header(Bytes b, ElfHeader* h, std::string* error) {
  if (!fits(b, 0, kEhdrSize)) return fail(error, format("ELF: %zu bytes, shorter than an ELF header", b.size()));
  if (load_le<uint32_t>(b, 0) != 0x464c457f) return fail(error, "ELF: no ELF magic at offset 0");
  if (uint8_t(b[4]) != kElfClass64 || uint8_t(b[5]) != kElfDataLsb)
    return fail(error, format("ELF: class %u data %u, not 64-bit little-endian", unsigned(b[4]), unsigned(b[5])));
  if (load_le<uint16_t>(b, 18) != kEmCuda)
    return fail(error, format("ELF: e_machine %u, not EM_CUDA", unsigned(load_le<uint16_t>(b, 18))));
  h->abi_version = uint8_t(b[8]);
  h->phoff = load_le<uint64_t>(b, 32);
  h->shoff = load_le<uint64_t>(b, 40);
  h->flags = load_le<uint32_t>(b, 48);
  h->phentsize = load_le<uint16_t>(b, 54);
  h->phnum = load_le<uint16_t>(b, 56);
  uint16_t shentsize = load_le<uint16_t>(b, 58);
  h->shnum = load_le<uint16_t>(b, 60);
  h->shstrndx = load_le<uint16_t>(b, 62);
  if (h->shoff != 0 && shentsize != kShdrSize)
    return fail(error, format("ELF: section header size %u, not %zu", unsigned(shentsize), kShdrSize));
  return true;
}

Section section_at(Bytes b, uint64_t offset) {
  Section s;
  s.name = load_le<uint32_t>(b, offset);
  s.type = load_le<uint32_t>(b, offset + 4);
  s.offset = load_le<uint64_t>(b, offset + 24);
  s.size = load_le<uint64_t>(b, offset + 32);
  s.link = load_le<uint32_t>(b, offset + 40);
  s.info = load_le<uint32_t>(b, offset + 44);
  s.entsize = load_le<uint64_t>(b, offset + 56);
  return s;
}

// The number of sections and the index of .shstrtab: past 0xff00 sections
// ELF keeps them in section 0 (e_shnum 0, e_shstrndx SHN_XINDEX); cubins of
// large libraries get there.
bool section_counts(Bytes b, const ElfHeader& h, uint64_t* count, uint32_t* shstrndx, std::string* error) {
  *count = h.shnum;
  *shstrndx = h.shstrndx;
  if (h.shnum != 0 && h.shstrndx != kShnXindex) return true;
  if (h.shoff == 0) return true;  // no section table at all
  if (!fits(b, h.shoff, kShdrSize))
    return fail(error, format("ELF: section 0 at offset %#llx lies past the end (%zu bytes)", ull(h.shoff), b.size()));
  Section zero = section_at(b, h.shoff);
  if (h.shnum == 0) *count = zero.size;
  if (h.shstrndx == kShnXindex) *shstrndx = zero.link;
  return true;
}

Bytes contents(const Elf& elf, const Section& s) {
  if (s.type == kShtNobits) return {};
  return elf.bytes.subspan(s.offset, s.size);  // read_sections checked it
}

bool read_sections(Bytes b, Elf* elf, std::string* error) {
  uint64_t count = 0;
  uint32_t shstrndx = 0;
  if (!section_counts(b, elf->header, &count, &shstrndx, error)) return false;
  if (count > (b.size() / kShdrSize) || !fits(b, elf->header.shoff, count * kShdrSize))
    return fail(error, format("ELF: %llu section headers at offset %#llx lie past the end (%zu bytes)",
                              ull(count), ull(elf->header.shoff), b.size()));
  elf->sections.resize(count);
  for (uint64_t i = 0; i < count; i++) {
    Section& s = elf->sections[i];
    s = section_at(b, elf->header.shoff + i * kShdrSize);
    if (s.type != kShtNobits && !fits(b, s.offset, s.size))
      return fail(error, format("ELF: section %llu (offset %#llx, size %#llx) lies past the end (%zu bytes)", ull(i),
                                ull(s.offset), ull(s.size), b.size()));
  }
  if (count == 0) return true;
  if (shstrndx >= count) return fail(error, format("ELF: section name table index %u out of range", shstrndx));
  elf->shstrtab = contents(*elf, elf->sections[shstrndx]);
  return true;
}

bool open_elf(Bytes b, Elf* elf, std::string* error) {
  elf->bytes = b;
  return read_elf_header(b, &elf->header, error) && read_sections(b, elf, error);
}

// The NUL-terminated string at `offset` of a string table; false where it
// does not end inside the table.
bool string_at(Bytes table, uint64_t offset, std::string_view* out) {
  if (offset >= table.size()) return false;
  auto begin = reinterpret_cast<const char*>(table.data()) + offset;
  auto end = static_cast<const char*>(std::memchr(begin, 0, table.size() - offset));
  if (!end) return false;
  *out = std::string_view(begin, size_t(end - begin));
  return true;
}

bool section_name(const Elf& elf, size_t index, std::string_view* name, std::string* error) {
  if (string_at(elf.shstrtab, elf.sections[index].name, name)) return true;
  return fail(error, format("ELF: section %zu: name offset %#x outside the section name table", index,
                            elf.sections[index].name));
}

// Every kernel's name, in symbol table order.
bool kernel_names(const Elf& elf, std::vector<std::string>* names, std::string* error) {
  for (size_t i = 0; i < elf.sections.size(); i++) {
    const Section& symtab = elf.sections[i];
    if (symtab.type != kShtSymtab) continue;
    if (symtab.entsize != kSymSize)
      return fail(error, format("ELF: symbol table (section %zu) entry size %llu, not %zu", i,
                                ull(symtab.entsize), kSymSize));
    if (symtab.link >= elf.sections.size())
      return fail(error, format("ELF: symbol table (section %zu) links to section %u, out of range", i, symtab.link));
    Bytes syms = contents(elf, symtab), strtab = contents(elf, elf.sections[symtab.link]);
    for (uint64_t at = kSymSize; at + kSymSize <= syms.size(); at += kSymSize) {  // symbol 0 is null
      uint8_t type = uint8_t(syms[at + 4]) & 0xf, other = uint8_t(syms[at + 5]);
      if (type != kSttFunc || !(other & kStoCudaEntry)) continue;
      std::string_view name;
      if (!string_at(strtab, load_le<uint32_t>(syms, at), &name) || name.empty())
        return fail(error, format("ELF: symbol %llu (kernel): bad name offset %#x", ull(at / kSymSize),
                                  load_le<uint32_t>(syms, at)));
      names->emplace_back(name);
    }
  }
  return true;
}

// .nv.info.<name> sections by kernel name.
bool info_sections(const Elf& elf, std::unordered_map<std::string_view, size_t>* out, std::string* error) {
  for (size_t i = 0; i < elf.sections.size(); i++) {
    if (elf.sections[i].type != kShtCudaInfo) continue;
    std::string_view name;
    if (!section_name(elf, i, &name, error)) return false;
    if (name.starts_with(kInfoPrefix)) out->emplace(name.substr(kInfoPrefix.size()), i);
  }
  return true;
}

struct Record {
  uint8_t format = 0, attribute = 0;
  uint16_t value = 0;  // the value (NVAL, BVAL, HVAL) or the size of `bytes` (SVAL)
  Bytes bytes;         // SVAL only
  uint64_t offset = 0;
};

// The record at *at of a .nv.info section; advances *at past it.
bool next_record(Bytes info, uint64_t* at, Record* r, std::string* error) {
  r->offset = *at;
  if (!fits(info, *at, 4)) return fail(error, format("record at offset %#llx: truncated header", ull(*at)));
  r->format = uint8_t(info[*at]);
  r->attribute = uint8_t(info[*at + 1]);
  r->value = load_le<uint16_t>(info, *at + 2);
  *at += 4;
  switch (r->format) {
    case kFmtNval:
    case kFmtBval:
    case kFmtHval:
      r->bytes = {};
      return true;
    case kFmtSval:
      if (!fits(info, *at, r->value))
        return fail(error, format("record at offset %#llx (attribute %#x): %u value bytes run past the section end",
                                  ull(r->offset), r->attribute, r->value));
      r->bytes = info.subspan(*at, r->value);
      *at += r->value;
      return true;
    default:
      return fail(error, format("record at offset %#llx: unknown format %u", ull(r->offset), r->format));
  }
}

// "Space" in cuobjdump's words: the state space of the pointee the PTX
// declared with `.ptr` (1 local, 2 shared, 4 global and const, 5 generic),
// 0 where the parameter has no `.ptr`. nvcc 13 writes `.ptr` on pointer
// parameters only for sm_100 and newer; for sm_90 and older a pointer and a
// 64-bit integer are both a plain .u64 (same record, space 0). So space 0
// says nothing (a pointer of an older target, or a struct holding pointers),
// and only a nonzero space is knowledge.
void set_space(CubinParam* p, uint32_t space) {
  p->pointer_known = space != 0;
  p->is_pointer = space != 0;
}

// EIATTR_KPARAM_INFO: u32 index (always 0), u16 ordinal, u16 offset, u32
// word: bits 0-7 the pointee's log2 alignment, 8-11 space, 12-16 cbank, 17
// set for a parameter in shared memory (sm_1x), 18-31 size in bytes.
// EIATTR_KPARAM_INFO_V2, what nvcc 13 writes for large parameter lists (for a
// 5000-byte struct, not for a 4100-byte one): the same up to the offset, then
// u16 size, u8 log2 alignment, u8 space.
bool read_kparam(const Record& r, CubinParam* p, std::string* error) {
  if (r.bytes.size() < 12)
    return fail(error, format("parameter record at offset %#llx: %zu bytes, not 12", ull(r.offset),
                              r.bytes.size()));
  p->ordinal = load_le<uint16_t>(r.bytes, 4);
  p->offset = load_le<uint16_t>(r.bytes, 6);
  if (r.attribute == kAttrKparamInfo) {
    uint32_t word = load_le<uint32_t>(r.bytes, 8);
    p->size = word >> 18;
    p->log_alignment = word & 0xff;
    set_space(p, (word >> 8) & 0xf);
  } else {
    p->size = load_le<uint16_t>(r.bytes, 8);
    p->log_alignment = uint8_t(r.bytes[10]);
    set_space(p, uint8_t(r.bytes[11]) & 0xf);
  }
  return true;
}

// EIATTR_PARAM_CBANK: u32 symbol index of .nv.constant0.<name>, u16 offset of
// the parameters in constant bank 0, u16 their size.
bool read_param_cbank(const Record& r, uint32_t* size, std::string* error) {
  if (r.bytes.size() < 8)
    return fail(error, format("EIATTR_PARAM_CBANK at offset %#llx: %zu bytes, not 8", ull(r.offset),
                              r.bytes.size()));
  *size = load_le<uint16_t>(r.bytes, 6);
  return true;
}

bool read_records(Bytes info, CubinKernel* k, std::string* error) {
  uint32_t cbank_size = 0, param_cbank_size = 0;
  for (uint64_t at = 0; at < info.size();) {
    Record r;
    if (!next_record(info, &at, &r, error)) return false;
    bool sval = r.format == kFmtSval;
    if (sval && (r.attribute == kAttrKparamInfo || r.attribute == kAttrKparamInfoV2)) {
      if (!read_kparam(r, &k->params.emplace_back(), error)) return false;
    } else if (sval && r.attribute == kAttrParamCbank) {
      if (!read_param_cbank(r, &param_cbank_size, error)) return false;
    } else if (r.format == kFmtHval && r.attribute == kAttrCbankParamSize) {
      cbank_size = r.value;
    }
  }
  k->param_bytes = cbank_size ? cbank_size : param_cbank_size;
  return true;
}

// The records come last ordinal first; each ordinal once, none missing, each
// parameter inside the parameter bank where its size is known.
bool order_params(CubinKernel* k, std::string* error) {
  auto& ps = k->params;
  std::sort(ps.begin(), ps.end(), [](const CubinParam& a, const CubinParam& b) { return a.ordinal < b.ordinal; });
  for (size_t i = 0; i < ps.size(); i++) {
    if (ps[i].ordinal < i) return fail(error, format("parameter ordinal %u appears twice", ps[i].ordinal));
    if (ps[i].ordinal > i) return fail(error, format("parameter ordinal %zu is missing", i));
    if (k->param_bytes && uint64_t(ps[i].offset) + ps[i].size > k->param_bytes)
      return fail(error, format("parameter %zu (offset %u, size %u) ends past the %u parameter bytes", i,
                                ps[i].offset, ps[i].size, k->param_bytes));
  }
  return true;
}

bool read_kernel(const Elf& elf, size_t info_index, CubinKernel* k, std::string* error) {
  std::string inner;
  if (read_records(contents(elf, elf.sections[info_index]), k, &inner) && order_params(k, &inner)) return true;
  return fail(error, format("ELF: kernel %s (section %zu): %s", k->name.c_str(), info_index, inner.c_str()));
}

}  // namespace

bool read_cubin_kernels(std::span<const std::byte> bytes, std::vector<CubinKernel>* kernels, std::string* error) {
  kernels->clear();
  Elf elf;
  std::vector<std::string> names;
  std::unordered_map<std::string_view, size_t> infos;
  if (!open_elf(bytes, &elf, error) || !kernel_names(elf, &names, error) || !info_sections(elf, &infos, error))
    return false;
  for (std::string& name : names) {
    CubinKernel& k = kernels->emplace_back();
    k.name = std::move(name);
    auto it = infos.find(k.name);
    if (it != infos.end() && !read_kernel(elf, it->second, &k, error)) {
      kernels->clear();
      return false;
    }
  }
  return true;
}

uint32_t cubin_arch(std::span<const std::byte> elf) {
  ElfHeader h;
  if (!read_elf_header(elf, &h, nullptr)) return 0;
  return h.abi_version >= kCudaAbiSmInBits8To15 ? (h.flags >> 8) & 0xff : h.flags & 0xff;
}

namespace detail {

// The size is the furthest end of the header, the two tables and every
// section with contents; each table is read only once its own extent is
// known, so nothing past a valid image's bytes is touched.
bool elf_image_size(const std::byte* image, uint64_t* size, std::string* error) {
  ElfHeader h;
  if (!read_elf_header(Bytes(image, kEhdrSize), &h, error)) return false;
  uint64_t end = kEhdrSize;
  auto extend = [&end](uint64_t offset, uint64_t length) {
    if (offset > kMaxImageSize || length > kMaxImageSize - offset) return false;
    end = std::max(end, offset + length);
    return true;
  };
  if (h.phnum && !extend(h.phoff, uint64_t(h.phnum) * h.phentsize))
    return fail(error, format("ELF: program header table at %#llx: implausible extent", ull(h.phoff)));
  uint64_t count = 0;
  uint32_t shstrndx = 0;
  if (h.shoff) {
    if (!extend(h.shoff, kShdrSize))
      return fail(error, format("ELF: section table at %#llx: implausible offset", ull(h.shoff)));
    if (!section_counts(Bytes(image, end), h, &count, &shstrndx, error)) return false;
    if (count > kMaxImageSize / kShdrSize || !extend(h.shoff, count * kShdrSize))
      return fail(error, format("ELF: %llu sections: implausible", ull(count)));
  }
  Bytes table(image, end);
  for (uint64_t i = 0; i < count; i++) {
    Section s = section_at(table, h.shoff + i * kShdrSize);
    if (s.type != kShtNobits && !extend(s.offset, s.size))
      return fail(error, format("ELF: section %llu (offset %#llx, size %#llx): implausible extent",
                                ull(i), ull(s.offset), ull(s.size)));
  }
  *size = end;
  return true;
}

}  // namespace detail
}  // namespace phos::speculation
