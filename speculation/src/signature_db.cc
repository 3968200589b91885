// placeholder: filled by the speculation issue
#include "phos/speculation/signature_db.h"
