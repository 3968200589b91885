#include "phos/support/result.h"  // IWYU pragma: export
