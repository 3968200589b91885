// phos-ptx-twin IN.ptx OUT.ptx [--stores] [--loads] [--with-original]
//               [--suffix S] [--sites] [--verify]
// Writes the twins of IN's kernels (twin.h) to OUT: store-checking twins by
// default, load-checking ones with --loads, both with --loads --stores.
// Prints one line per kernel: name, twin, parameters, the table's offset,
// checks, complete or why not, module variables; --sites adds one line per
// checked instruction. --verify reads OUT back and checks that every twin
// is there, a kernel, with the original's parameters and the table pointer
// last. Exit 1 on a bad command line, 2 when IN cannot be read or
// rewritten, 3 when --verify finds a fault.
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "phos/ptx/reader.h"
#include "phos/ptx/twin.h"

namespace {

int usage() {
  std::cerr << "usage: phos-ptx-twin IN.ptx OUT.ptx [--stores] [--loads] [--with-original] [--suffix S] [--sites] "
               "[--verify]\n";
  return 1;
}

// Faults of OUT's twins, one per line; empty when there are none.
std::string verify(const phos::ptx::TwinResult& r) {
  phos::Result<phos::ptx::Module> read = phos::ptx::read_module(r.ptx);
  if (!read) return "the output cannot be read: " + read.error().message + "\n";
  const phos::ptx::Module& m = *read;
  std::string faults;
  for (const phos::ptx::TwinKernel& k : r.kernels) {
    int64_t fi = m.find_function(k.twin_name);
    if (fi < 0 || !m.functions[fi].entry || !m.functions[fi].defined) {
      faults += k.twin_name + ": no such kernel in the output\n";
      continue;
    }
    const phos::ptx::Function& f = m.functions[fi];
    if (f.params.size() != k.params + 1) {
      faults += k.twin_name + ": " + std::to_string(f.params.size()) + " parameters, not " +
                std::to_string(k.params + 1) + "\n";
      continue;
    }
    const phos::ptx::Param& last = f.params.back();
    if (last.name != r.table_param || last.last - last.first != 3 || m.str(last.first) != ".param" ||
        m.str(last.first + 1) != ".u64") {
      faults += k.twin_name + ": the last parameter is not .param .u64 " + r.table_param + "\n";
    }
  }
  return faults;
}

}  // namespace

int main(int argc, char** argv) {
  phos::ptx::TwinOptions options;
  bool stores = false;
  bool loads = false;
  bool sites = false;
  bool check = false;
  std::string in_path;
  std::string out_path;
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    if (a == "--loads") {
      loads = true;
    } else if (a == "--stores") {
      stores = true;
    } else if (a == "--with-original") {
      options.include_original = true;
    } else if (a == "--sites") {
      sites = true;
    } else if (a == "--verify") {
      check = true;
    } else if (a == "--suffix" && i + 1 < argc) {
      options.suffix = argv[++i];
    } else if (a.starts_with("--")) {
      return usage();
    } else if (in_path.empty()) {
      in_path = a;
    } else if (out_path.empty()) {
      out_path = a;
    } else {
      return usage();
    }
  }
  if (out_path.empty()) return usage();
  options.loads = loads;
  options.stores = stores || !loads;
  std::ifstream in(in_path, std::ios::binary);
  if (!in) {
    std::cerr << "phos-ptx-twin: cannot read " << in_path << "\n";
    return 2;
  }
  std::stringstream text;
  text << in.rdbuf();
  std::string ptx = text.str();
  phos::Result<phos::ptx::TwinResult> twins = phos::ptx::make_twins(ptx, options);
  if (!twins) {
    std::cerr << "phos-ptx-twin: " << in_path << ": " << twins.error().message << "\n";
    return 2;
  }
  const phos::ptx::TwinResult& result = *twins;
  std::ofstream out(out_path, std::ios::binary | std::ios::trunc);
  out << result.ptx;
  if (!out.flush()) {
    std::cerr << "phos-ptx-twin: cannot write " << out_path << "\n";
    return 2;
  }
  for (const phos::ptx::TwinKernel& k : result.kernels) {
    std::cout << "kernel " << k.name << " twin " << k.twin_name << " params " << k.params << " table_offset "
              << k.table_offset << " checks " << k.checks << (k.complete ? " complete" : " incomplete: " + k.reason);
    if (!k.module_variables.empty()) {
      std::cout << " variables";
      for (const std::string& v : k.module_variables) std::cout << " " << v;
    }
    std::cout << "\n";
  }
  if (sites) {
    for (const phos::ptx::CheckSite& s : result.sites) {
      std::cout << "site " << s.ordinal << " " << s.function << ":" << s.line << " "
                << phos::ptx::access_kind_name(s.kind) << " " << phos::ptx::space_name(s.space) << " width "
                << s.width << " | " << s.instruction << "\n";
    }
  }
  if (check) {
    std::string faults = verify(result);
    if (!faults.empty()) {
      std::cerr << "phos-ptx-twin: " << in_path << ": " << faults;
      return 3;
    }
  }
  return 0;
}
