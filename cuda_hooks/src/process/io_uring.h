// io_uring refused under libphos.so (io_uring.cc says why).
#pragma once

namespace phos::hooks {

// How many io_uring_setup calls this process was refused (the agent's
// status counter io_uring_setups_refused).
unsigned long io_uring_setups_refused();

}  // namespace phos::hooks
