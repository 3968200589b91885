// placeholder: filled by the speculation issue
#include "phos/speculation/fatbin.h"
