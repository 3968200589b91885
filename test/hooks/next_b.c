int phos_next_probe(void) { return 2; }
int phos_next_b_loaded(void) { return 1; }
