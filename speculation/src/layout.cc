#include "phos/speculation/layout.h"
