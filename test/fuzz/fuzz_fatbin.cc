// libFuzzer target: the module image reader (fatbins, cubins, and how far a
// module image goes), which reads other people's binaries. The input is read
// as a fatbin (every entry's contents, and the kernels of every ELF entry),
// as a cubin, and as a module image of unknown kind. Nothing may crash, hang,
// leak or read outside the input; what is read must hold together.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "phos/speculation/fatbin.h"

using namespace phos::speculation;

static void read_kernels(std::span<const std::byte> elf) {
  auto kernels = read_cubin_kernels(elf);
  if (!kernels) return;
  for (const CubinKernel& k : *kernels)
    for (size_t i = 0; i < k.params.size(); i++)
      if (k.params[i].ordinal != i) __builtin_trap();
}

// The extent lies inside the input, and a cubin's covers all that the
// kernel reader reads of it.
static void read_extent(std::span<const std::byte> bytes) {
  auto extent = image_extent(bytes);
  if (!extent) return;
  if (extent->bytes.data() != bytes.data() || extent->bytes.size() > bytes.size()) __builtin_trap();
  if (extent->kind == ModuleKind::kFatbin) (void)read_fatbin(extent->bytes);
  if (extent->kind != ModuleKind::kCubin) return;
  auto whole = read_cubin_kernels(bytes), cut = read_cubin_kernels(extent->bytes);
  if (whole.ok() != cut.ok() || (whole.ok() && whole->size() != cut->size())) __builtin_trap();
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto bytes = std::span(reinterpret_cast<const std::byte*>(data), size);
  if (auto entries = read_fatbin(bytes)) {
    for (const FatbinEntry& e : *entries) {
      if (e.offset > size || e.payload.size() > size - e.offset || e.payload.data() != bytes.data() + e.offset)
        __builtin_trap();
      auto contents = entry_contents(e);
      if (contents && e.kind == FatbinEntryKind::kElf) read_kernels(*contents);
    }
  }
  (void)cubin_arch(bytes);
  read_kernels(bytes);
  read_extent(bytes);
  return 0;
}
