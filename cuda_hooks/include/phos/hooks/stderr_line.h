// libphos's messages on the process's stderr, written with write(2), not
// through stdio: stdio's lock on stderr may be held by a program thread that
// a checkpoint keeps stopped (frozen in the middle of an fprintf, inside a
// library's constructor), and the agent's thread, the only one running
// then, must not wait for it.
#pragma once

namespace phos::hooks {

// printf-style; one write of at most 4 KiB (a longer text is cut, ending in
// "...\n").
void stderr_line(const char* format, ...) __attribute__((format(printf, 1, 2)));

}  // namespace phos::hooks
