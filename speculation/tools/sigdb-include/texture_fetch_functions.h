// phos-sigdb's stand-in for a header that clang 14's CUDA wrapper
// (__clang_cuda_runtime_wrapper.h) includes and CUDA 12.x/13 no longer ship.
// Empty: the texture fetch functions it declared went with the texture<>
// references, and a kernel's signature does not depend on them. phos-sigdb
// searches this folder last (-idirafter), so a toolkit that has the header
// still uses its own.
#pragma once
