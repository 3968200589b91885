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

// What the header says; kUnrecognized for bytes that are no 64-bit
// little-endian CUDA ELF file.
ImageResult<ElfHeader> read_elf_header(Bytes b) {
  if (!fits(b, 0, kEhdrSize))
    return failure(ImageFault::kMalformed, "ELF: %zu bytes, shorter than an ELF header", b.size());
  if (load_le<uint32_t>(b, 0) != kElfMagic) return failure(ImageFault::kUnrecognized, "ELF: no ELF magic at offset 0");
  if (uint8_t(b[4]) != kElfClass64 || uint8_t(b[5]) != kElfDataLsb)
    return failure(ImageFault::kUnrecognized, "ELF: class %u data %u, not 64-bit little-endian", unsigned(b[4]),
                   unsigned(b[5]));
  if (load_le<uint16_t>(b, 18) != kEmCuda)
    return failure(ImageFault::kUnrecognized, "ELF: e_machine %u, not EM_CUDA", unsigned(load_le<uint16_t>(b, 18)));
  ElfHeader h;
  h.abi_version = uint8_t(b[8]);
  h.phoff = load_le<uint64_t>(b, 32);
  h.shoff = load_le<uint64_t>(b, 40);
  h.flags = load_le<uint32_t>(b, 48);
  h.phentsize = load_le<uint16_t>(b, 54);
  h.phnum = load_le<uint16_t>(b, 56);
  uint16_t shentsize = load_le<uint16_t>(b, 58);
  h.shnum = load_le<uint16_t>(b, 60);
  h.shstrndx = load_le<uint16_t>(b, 62);
  if (h.shoff != 0 && shentsize != kShdrSize)
    return failure(ImageFault::kMalformed, "ELF: section header size %u, not %zu", unsigned(shentsize), kShdrSize);
  return h;
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
struct SectionCounts {
  uint64_t count = 0;
  uint32_t shstrndx = 0;
};

ImageResult<SectionCounts> section_counts(Bytes b, const ElfHeader& h) {
  // No section table at all, whatever e_shnum says (else the ELF header
  // itself would be read as one).
  if (h.shoff == 0) return SectionCounts{};
  SectionCounts c{h.shnum, h.shstrndx};
  if (h.shnum != 0 && h.shstrndx != kShnXindex) return c;
  if (!fits(b, h.shoff, kShdrSize))
    return failure(ImageFault::kMalformed, "ELF: section 0 at offset %#llx lies past the end (%zu bytes)", ull(h.shoff),
                   b.size());
  Section zero = section_at(b, h.shoff);
  if (h.shnum == 0) c.count = zero.size;
  if (h.shstrndx == kShnXindex) c.shstrndx = zero.link;
  return c;
}

Bytes contents(const Elf& elf, const Section& s) {
  if (s.type == kShtNobits) return {};
  return elf.bytes.subspan(s.offset, s.size);  // read_sections checked it
}

ImageResult<void> read_sections(Bytes b, Elf* elf) {
  auto counts = section_counts(b, elf->header);
  if (!counts) return counts.error();
  uint64_t count = counts->count;
  if (count > (b.size() / kShdrSize) || !fits(b, elf->header.shoff, count * kShdrSize))
    return failure(ImageFault::kMalformed, "ELF: %llu section headers at offset %#llx lie past the end (%zu bytes)",
                   ull(count), ull(elf->header.shoff), b.size());
  elf->sections.resize(count);
  for (uint64_t i = 0; i < count; i++) {
    Section& s = elf->sections[i];
    s = section_at(b, elf->header.shoff + i * kShdrSize);
    if (s.type != kShtNobits && !fits(b, s.offset, s.size))
      return failure(ImageFault::kMalformed,
                     "ELF: section %llu (offset %#llx, size %#llx) lies past the end (%zu bytes)", ull(i),
                     ull(s.offset), ull(s.size), b.size());
  }
  if (count == 0) return {};
  if (counts->shstrndx >= count)
    return failure(ImageFault::kMalformed, "ELF: section name table index %u out of range", counts->shstrndx);
  elf->shstrtab = contents(*elf, elf->sections[counts->shstrndx]);
  return {};
}

ImageResult<Elf> open_elf(Bytes b) {
  Elf elf;
  elf.bytes = b;
  auto header = read_elf_header(b);
  if (!header) return header.error();
  elf.header = *header;
  PHOS_TRY(read_sections(b, &elf));
  return elf;
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

ImageResult<std::string_view> section_name(const Elf& elf, size_t index) {
  std::string_view name;
  if (string_at(elf.shstrtab, elf.sections[index].name, &name)) return name;
  return failure(ImageFault::kMalformed, "ELF: section %zu: name offset %#x outside the section name table", index,
                 elf.sections[index].name);
}

// Every kernel's name, in symbol table order.
ImageResult<std::vector<std::string>> kernel_names(const Elf& elf) {
  std::vector<std::string> names;
  for (size_t i = 0; i < elf.sections.size(); i++) {
    const Section& symtab = elf.sections[i];
    if (symtab.type != kShtSymtab) continue;
    if (symtab.entsize != kSymSize)
      return failure(ImageFault::kMalformed, "ELF: symbol table (section %zu) entry size %llu, not %zu", i,
                     ull(symtab.entsize), kSymSize);
    if (symtab.link >= elf.sections.size())
      return failure(ImageFault::kMalformed, "ELF: symbol table (section %zu) links to section %u, out of range", i,
                     symtab.link);
    Bytes syms = contents(elf, symtab), strtab = contents(elf, elf.sections[symtab.link]);
    for (uint64_t at = kSymSize; at + kSymSize <= syms.size(); at += kSymSize) {  // symbol 0 is null
      uint8_t type = uint8_t(syms[at + 4]) & 0xf, other = uint8_t(syms[at + 5]);
      if (type != kSttFunc || !(other & kStoCudaEntry)) continue;
      std::string_view name;
      if (!string_at(strtab, load_le<uint32_t>(syms, at), &name) || name.empty())
        return failure(ImageFault::kMalformed, "ELF: symbol %llu (kernel): bad name offset %#x", ull(at / kSymSize),
                       load_le<uint32_t>(syms, at));
      names.emplace_back(name);
    }
  }
  return names;
}

using InfoSections = std::unordered_map<std::string_view, size_t>;

// .nv.info.<name> sections by kernel name.
ImageResult<InfoSections> info_sections(const Elf& elf) {
  InfoSections out;
  for (size_t i = 0; i < elf.sections.size(); i++) {
    if (elf.sections[i].type != kShtCudaInfo) continue;
    auto name = section_name(elf, i);
    if (!name) return name.error();
    if (name->starts_with(kInfoPrefix)) out.emplace(name->substr(kInfoPrefix.size()), i);
  }
  return out;
}

struct Record {
  uint8_t format = 0, attribute = 0;
  uint16_t value = 0;  // the value (NVAL, BVAL, HVAL) or the size of `bytes` (SVAL)
  Bytes bytes;         // SVAL only
  uint64_t offset = 0;
};

// The record at *at of a .nv.info section; advances *at past it.
ImageResult<Record> next_record(Bytes info, uint64_t* at) {
  Record r;
  r.offset = *at;
  if (!fits(info, *at, 4))
    return failure(ImageFault::kMalformed, "record at offset %#llx: truncated header", ull(*at));
  r.format = uint8_t(info[*at]);
  r.attribute = uint8_t(info[*at + 1]);
  r.value = load_le<uint16_t>(info, *at + 2);
  *at += 4;
  switch (r.format) {
    case kFmtNval:
    case kFmtBval:
    case kFmtHval:
      return r;
    case kFmtSval:
      if (!fits(info, *at, r.value))
        return failure(ImageFault::kMalformed,
                       "record at offset %#llx (attribute %#x): %u value bytes run past the section end",
                       ull(r.offset), r.attribute, r.value);
      r.bytes = info.subspan(*at, r.value);
      *at += r.value;
      return r;
    default:
      return failure(ImageFault::kMalformed, "record at offset %#llx: unknown format %u", ull(r.offset), r.format);
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
ImageResult<CubinParam> read_kparam(const Record& r) {
  if (r.bytes.size() < 12)
    return failure(ImageFault::kMalformed, "parameter record at offset %#llx: %zu bytes, not 12", ull(r.offset),
                   r.bytes.size());
  CubinParam p;
  p.ordinal = load_le<uint16_t>(r.bytes, 4);
  p.offset = load_le<uint16_t>(r.bytes, 6);
  if (r.attribute == kAttrKparamInfo) {
    uint32_t word = load_le<uint32_t>(r.bytes, 8);
    p.size = word >> 18;
    p.log_alignment = word & 0xff;
    set_space(&p, (word >> 8) & 0xf);
  } else {
    p.size = load_le<uint16_t>(r.bytes, 8);
    p.log_alignment = uint8_t(r.bytes[10]);
    set_space(&p, uint8_t(r.bytes[11]) & 0xf);
  }
  return p;
}

// EIATTR_PARAM_CBANK: u32 symbol index of .nv.constant0.<name>, u16 offset of
// the parameters in constant bank 0, u16 their size.
ImageResult<uint32_t> read_param_cbank(const Record& r) {
  if (r.bytes.size() < 8)
    return failure(ImageFault::kMalformed, "EIATTR_PARAM_CBANK at offset %#llx: %zu bytes, not 8", ull(r.offset),
                   r.bytes.size());
  return uint32_t(load_le<uint16_t>(r.bytes, 6));
}

ImageResult<void> read_records(Bytes info, CubinKernel* k) {
  uint32_t cbank_size = 0, param_cbank_size = 0;
  for (uint64_t at = 0; at < info.size();) {
    auto r = next_record(info, &at);
    if (!r) return r.error();
    bool sval = r->format == kFmtSval;
    if (sval && (r->attribute == kAttrKparamInfo || r->attribute == kAttrKparamInfoV2)) {
      auto p = read_kparam(*r);
      if (!p) return p.error();
      k->params.push_back(*p);
    } else if (sval && r->attribute == kAttrParamCbank) {
      auto size = read_param_cbank(*r);
      if (!size) return size.error();
      param_cbank_size = *size;
    } else if (r->format == kFmtHval && r->attribute == kAttrCbankParamSize) {
      cbank_size = r->value;
    }
  }
  k->param_bytes = cbank_size ? cbank_size : param_cbank_size;
  return {};
}

// The records come last ordinal first; each ordinal once, none missing, each
// parameter inside the parameter bank where its size is known.
ImageResult<void> order_params(CubinKernel* k) {
  auto& ps = k->params;
  std::sort(ps.begin(), ps.end(), [](const CubinParam& a, const CubinParam& b) { return a.ordinal < b.ordinal; });
  for (size_t i = 0; i < ps.size(); i++) {
    if (ps[i].ordinal < i) return failure(ImageFault::kMalformed, "parameter ordinal %u appears twice", ps[i].ordinal);
    if (ps[i].ordinal > i) return failure(ImageFault::kMalformed, "parameter ordinal %zu is missing", i);
    if (k->param_bytes && uint64_t(ps[i].offset) + ps[i].size > k->param_bytes)
      return failure(ImageFault::kMalformed, "parameter %zu (offset %u, size %u) ends past the %u parameter bytes", i,
                     ps[i].offset, ps[i].size, k->param_bytes);
  }
  return {};
}

ImageResult<void> read_kernel(const Elf& elf, size_t info_index, CubinKernel* k) {
  auto read = read_records(contents(elf, elf.sections[info_index]), k);
  if (read) read = order_params(k);
  if (read) return read;
  return within(read.error(), format("ELF: kernel %s (section %zu): ", k->name.c_str(), info_index));
}

}  // namespace

ImageResult<std::vector<CubinKernel>> read_cubin_kernels(std::span<const std::byte> bytes) {
  auto elf = open_elf(bytes);
  if (!elf) return elf.error();
  auto names = kernel_names(*elf);
  if (!names) return names.error();
  auto infos = info_sections(*elf);
  if (!infos) return infos.error();
  std::vector<CubinKernel> kernels;
  for (std::string& name : *names) {
    CubinKernel& k = kernels.emplace_back();
    k.name = std::move(name);
    auto it = infos->find(k.name);
    if (it != infos->end()) PHOS_TRY(read_kernel(*elf, it->second, &k));
  }
  return kernels;
}

uint32_t cubin_arch(std::span<const std::byte> elf) {
  auto h = read_elf_header(elf);
  if (!h) return 0;
  return h->abi_version >= kCudaAbiSmInBits8To15 ? (h->flags >> 8) & 0xff : h->flags & 0xff;
}

namespace {

// The end of what an ELF image's headers cover so far.
class ElfEnd {
 public:
  explicit ElfEnd(Bytes bytes) : bytes_(bytes) {}
  uint64_t end() const { return end_; }
  // Covers [offset, offset + length) too; false with *fault where it lies
  // beyond kMaxImageSize (kTooLarge, checked first: an image handed over by
  // pointer has only that bound) or past the bytes (kMalformed).
  bool cover(uint64_t offset, uint64_t length, ImageFault* fault) {
    if (offset > kMaxImageSize || length > kMaxImageSize - offset) return *fault = ImageFault::kTooLarge, false;
    if (!fits(bytes_, offset, length)) return *fault = ImageFault::kMalformed, false;
    end_ = std::max(end_, offset + length);
    return true;
  }
  ImageError error(ImageFault fault, const std::string& what, uint64_t offset, uint64_t length) const {
    if (fault == ImageFault::kTooLarge)
      return failure(fault, "ELF: %s (offset %#llx, size %#llx) beyond the %llu-byte limit", what.c_str(), ull(offset),
                     ull(length), ull(kMaxImageSize));
    return failure(fault, "ELF: %s (offset %#llx, size %#llx) lies past the end (%zu bytes)", what.c_str(),
                   ull(offset), ull(length), bytes_.size());
  }

 private:
  Bytes bytes_;
  uint64_t end_ = kEhdrSize;
};

}  // namespace

namespace detail {

// The size is the furthest end of the header, the two tables and every
// section with contents; each table is read only once its own extent is
// known to lie inside the bytes, so nothing past a valid image's end is
// touched.
ImageResult<uint64_t> elf_extent(Bytes bytes) {
  auto header = read_elf_header(bytes);
  if (!header) return header.error();
  const ElfHeader& h = *header;
  ElfEnd x(bytes);
  ImageFault fault{};
  uint64_t table = uint64_t(h.phnum) * h.phentsize;
  if (h.phnum && !x.cover(h.phoff, table, &fault)) return x.error(fault, "program header table", h.phoff, table);
  if (!h.shoff) return x.end();
  if (!x.cover(h.shoff, kShdrSize, &fault)) return x.error(fault, "section 0", h.shoff, kShdrSize);
  auto counts = section_counts(bytes, h);
  if (!counts) return counts.error();
  if (counts->count > kMaxImageSize / kShdrSize)
    return failure(ImageFault::kTooLarge, "ELF: %llu sections, beyond the %llu-byte limit", ull(counts->count),
                   ull(kMaxImageSize));
  table = counts->count * kShdrSize;
  if (!x.cover(h.shoff, table, &fault)) return x.error(fault, "section header table", h.shoff, table);
  for (uint64_t i = 0; i < counts->count; i++) {
    Section s = section_at(bytes, h.shoff + i * kShdrSize);
    if (s.type != kShtNobits && !x.cover(s.offset, s.size, &fault))
      return x.error(fault, format("section %llu", ull(i)), s.offset, s.size);
  }
  return x.end();
}

}  // namespace detail
}  // namespace phos::speculation
