// UniqueFd lives in support/ (the network code there owns fds too); this
// name stays for the code that includes it from here.
#pragma once

#include "phos/support/unique_fd.h"
