#include "phos/speculation/kernel_layout.h"

#include "phos/speculation/known_structs.h"

namespace phos::speculation {
namespace {

void add_note(KernelLayout& layout, const std::string& what) {
  if (!layout.note.empty()) layout.note += "; ";
  layout.note += what;
}

std::vector<ParamSlot> cubin_slots(const CubinKernel& k) {
  std::vector<ParamSlot> slots;
  for (const CubinParam& p : k.params) slots.push_back({p.offset, p.size});
  return slots;
}

bool same_slots(const std::vector<ParamSlot>& a, const std::vector<ParamSlot>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); i++)
    if (a[i].offset != b[i].offset || a[i].size != b[i].size) return false;
  return true;
}

// Kinds from the signature database, if it describes as many parameters of
// the same sizes.
bool apply_signature(KernelLayout& layout, const KernelSignature& sig) {
  if (sig.params.size() != layout.params.size()) {
    add_note(layout, "signature database has " + std::to_string(sig.params.size()) + " parameters, the kernel " +
                         std::to_string(layout.params.size()));
    return false;
  }
  for (size_t i = 0; i < sig.params.size(); i++) {
    if (layout.slots_known && sig.params[i].size != layout.params[i].size) {
      add_note(layout, "signature database: parameter " + std::to_string(i) + " has size " +
                           std::to_string(sig.params[i].size) + ", the kernel " + std::to_string(layout.params[i].size));
      return false;
    }
  }
  for (size_t i = 0; i < sig.params.size(); i++) {
    ParamLayout& p = layout.params[i];
    const ParamLayout& s = sig.params[i];
    if (!layout.slots_known) {
      p.offset = s.offset;
      p.size = s.size;
    }
    p.kind = s.kind;
    p.fields_known = s.fields_known;
    p.pointer_fields = s.pointer_fields;
  }
  // The database's slots alone are not trusted for reading kernelParams: it
  // matches by name only, and a name that means another kernel (extern "C"
  // names collide across libraries) would make a launch read past the
  // program's array. Without the driver's or the cubin's slots the layout
  // serves packed arguments only (speculate_kernel then scans them whole).
  layout.types = TypeSource::kSignatureDb;
  return true;
}

bool apply_name_kinds(KernelLayout& layout, const std::vector<ParamKind>& kinds) {
  if (kinds.size() != layout.params.size()) {
    add_note(layout, "mangled name has " + std::to_string(kinds.size()) + " parameters, the kernel " +
                         std::to_string(layout.params.size()));
    return false;
  }
  for (size_t i = 0; i < kinds.size(); i++) {
    // A pointer can only be 8 bytes; anything else named a pointer is a
    // disagreement between name and layout.
    if ((kinds[i] == ParamKind::kPointer || kinds[i] == ParamKind::kConstPointer) && layout.params[i].size != 8) {
      add_note(layout, "mangled name says parameter " + std::to_string(i) + " is a pointer, its size is " +
                           std::to_string(layout.params[i].size));
      return false;
    }
  }
  for (size_t i = 0; i < kinds.size(); i++) layout.params[i].kind = kinds[i];
  layout.types = TypeSource::kName;
  return true;
}

// The aggregates whose type a rule of known_structs.h knows get its fields.
void apply_known_structs(KernelLayout& layout, const std::vector<std::string>& types) {
  if (types.size() != layout.params.size()) return;
  for (size_t i = 0; i < types.size(); i++) {
    ParamLayout& p = layout.params[i];
    if (p.kind != ParamKind::kAggregate || p.fields_known) continue;
    if (auto known = known_struct(types[i], p.size)) {
      p.fields_known = true;
      p.pointer_fields = std::move(known->fields);
      p.checks = std::move(known->checks);
    }
  }
}

void apply_cubin_pointers(KernelLayout& layout, const CubinKernel& k) {
  if (k.params.size() != layout.params.size()) return;
  for (const CubinParam& p : k.params)
    if (!p.pointer_known) return;
  for (size_t i = 0; i < k.params.size(); i++)
    layout.params[i].kind = k.params[i].is_pointer ? ParamKind::kPointer : ParamKind::kAggregate;
  layout.types = TypeSource::kCubin;
}

}  // namespace

const char* type_source_name(TypeSource s) {
  switch (s) {
    case TypeSource::kNone: return "none";
    case TypeSource::kSignatureDb: return "sigdb";
    case TypeSource::kName: return "name";
    case TypeSource::kCubin: return "cubin";
  }
  return "?";
}

KernelLayout build_layout(const LayoutSources& sources) {
  KernelLayout layout;
  std::vector<ParamSlot> slots;
  if (sources.driver) {
    slots = *sources.driver;
    layout.slots_known = true;
    if (sources.cubin) {
      layout.cubin_checked = true;
      if (!same_slots(slots, cubin_slots(*sources.cubin))) add_note(layout, "cubin parameter offsets differ from the driver's");
    }
  } else if (sources.cubin) {
    slots = cubin_slots(*sources.cubin);
    layout.slots_known = true;
  } else if (sources.signature) {
    for (const ParamLayout& p : sources.signature->params) slots.push_back({p.offset, p.size});
  }
  for (const ParamSlot& s : slots) layout.params.push_back(ParamLayout{s.offset, s.size, ParamKind::kUnknown, false, {}, {}});

  if (sources.signature && apply_signature(layout, *sources.signature)) return layout;
  if (sources.name_kinds && layout.slots_known && apply_name_kinds(layout, *sources.name_kinds)) {
    if (sources.name_types) apply_known_structs(layout, *sources.name_types);
    return layout;
  }
  if (sources.cubin && layout.slots_known) apply_cubin_pointers(layout, *sources.cubin);
  return layout;
}

}  // namespace phos::speculation
