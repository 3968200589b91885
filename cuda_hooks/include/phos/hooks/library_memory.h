// Device memory cuBLAS writes beside the buffers a call names: each
// handle's workspace (cublasSetWorkspace), and the memory cuBLAS allocates
// for itself (inside cublasCreate, cublasLtCreate or any cuBLAS call phos
// stands in for: its default workspace pool, made at the handle's creation
// or at its first use). The GEMM hooks add both to each call's exact set as
// read and written (hooks/cublas.cc): the kernels a library call issues are
// covered by that set, so a split-K GEMM writing its workspace must find it
// there. The library's own memory is taken as written by every cuBLAS call
// on any handle: which handle owns what is cuBLAS's business, and it is
// small. No CUDA here: tested alone.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>

namespace phos::hooks {

class LibraryMemory {
 public:
  struct Range {
    uint64_t address = 0;
    uint64_t bytes = 0;
  };

  // cublasSetWorkspace: the handle's workspace from now on; a null one or
  // one of 0 bytes, none. Called once per GEMM by PyTorch (it sets the
  // workspace each time it hands a handle out): a lock and a map lookup.
  void set_workspace(const void* handle, uint64_t address, uint64_t bytes);
  // cublasDestroy, and cublasCreate (a destroyed handle's value may come
  // back): the handle has no workspace of the program's.
  void forget_handle(const void* handle);
  // An allocation made while a library call was under way on the calling
  // thread (Scope): the library's own.
  void allocated(uint64_t address, uint64_t bytes);
  // Any free of device memory: forgotten where it was the library's. One
  // load while the library holds none.
  void freed(uint64_t address);
  // What a call on `handle` (null: none, as cublasLt's) may write beside its
  // arguments, into out[0..max): the handle's workspace first, then the
  // library's own allocations in address order. Where they do not fit, the
  // closest neighbours are merged into one range (the memory between them
  // taken as written too: more saved, never less); returns how many.
  size_t written(const void* handle, Range* out, size_t max) const;

  // A cuBLAS call under way on this thread, for the whole of its hook:
  // device memory allocated meanwhile is the library's. Nests.
  class Scope {
   public:
    Scope();
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
  };
  static bool inside();

 private:
  mutable std::mutex mu_;
  std::unordered_map<const void*, Range> workspaces_;
  std::map<uint64_t, uint64_t> owned_;  // address -> bytes
  std::atomic<bool> owns_any_{false};   // !owned_.empty(), read without the lock
};

}  // namespace phos::hooks
