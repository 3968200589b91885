// The driver's checkpoint buffer in huge pages (issue 30, part 2).
//
// cuCheckpointProcessCheckpoint copies the device state the driver keeps for
// a process (its contexts' memory once phos's is released: 265 MiB for a
// bare context on an H200, 360 MiB for a torch process, 526 MiB for a DDP
// rank) into one new anonymous mapping, made by libcuda with MAP_POPULATE.
// Populating it 4 KiB at a time is about half of the checkpoint: measured
// on an H200 host, 81-113 ms of a 193-230 ms checkpoint (265 MiB), 216-239
// of 377-447 ms (529 MiB), 640 of 990 ms (1553 MiB); the same mapping
// populated in huge pages took 41-50, 98-109 and 242-303 ms.
//
// So libphos.so stands in for mmap: a private anonymous writable mapping of
// at least kDriverBufferMinBytes that libcuda's own code asks to populate
// is made without MAP_POPULATE, advised MADV_HUGEPAGE and then populated
// (MADV_POPULATE_WRITE; written page by page where the kernel lacks it,
// before Linux 5.14). Every other mmap goes to libc's as it came (to the
// system call itself before libphos's constructor has found libc's). The
// mapping holds the same zeroed, populated memory either way; only the page
// size differs, where the kernel's transparent huge pages allow (`never`
// leaves it 4 KiB). PHOS_DRIVER_BUFFER_HUGE=0 (or off) turns it off.
#pragma once

namespace phos::hooks {

// libcuda's code, as loaded: recorded once the driver is resolved (on a
// program thread: it walks the loaded objects under the loader's lock),
// from the address of any function of it.
void note_driver_code(const void* driver_function);

}  // namespace phos::hooks
