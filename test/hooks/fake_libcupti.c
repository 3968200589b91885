/* Stands for CUPTI loaded in a process: libphos.so must report it, since
 * the driver's checkpoint refuses such a process. */
int phos_fake_cupti(void) { return 1; }
