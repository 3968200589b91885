/* The driver's checkpoint buffer under libphos.so (memory/driver_buffer.h):
 * asks the fake libcuda for one of ARG MiB (as its checkpoint would make
 * it: mmap with MAP_POPULATE, from libcuda's code), makes one of its own
 * the same way, writes and reads back both, and prints for each
 *   NAME rss_kib=R huge_kib=H hg=0|1 tail_hg=0|1 data=ok|bad
 * R from mincore() over the mapping, H and hg (advised MADV_HUGEPAGE) from
 * the /proc/self/smaps entry holding its start (the kernel may merge the
 * two mappings into one when their flags are the same), tail_hg of the one
 * holding its last page. */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

void *fake_cuda_checkpoint_buffer(size_t bytes);

/* AnonHugePages and whether advised huge (hg), of the mapping holding p. */
static void vma_of(const void *p, long *huge, long *hg) {
  FILE *f = fopen("/proc/self/smaps", "r");
  char line[512];
  int in = 0;
  while (f && fgets(line, sizeof(line), f)) {
    unsigned long lo, hi;
    /* A mapping's line starts with its range; its fields' with a name. */
    if ((line[0] < 'A' || line[0] > 'Z') && sscanf(line, "%lx-%lx ", &lo, &hi) == 2) {
      in = lo <= (unsigned long)p && (unsigned long)p < hi;
      continue;
    }
    if (!in) continue;
    sscanf(line, "AnonHugePages: %ld kB", huge);
    if (!strncmp(line, "VmFlags:", 8)) *hg = strstr(line, " hg") != NULL;
  }
  if (f) fclose(f);
}

static void report(const char *name, void *p, size_t bytes) {
  long rss = -1, huge = -1, hg = -1;
  /* Resident before anything is written: populated by the mmap. */
  size_t pages = bytes / 4096;
  unsigned char *resident = malloc(pages);
  if (resident && mincore(p, bytes, resident) == 0) {
    rss = 0;
    for (size_t i = 0; i < pages; i++) rss += (resident[i] & 1) * 4;
  }
  free(resident);
  unsigned long *words = p;
  size_t n = bytes / sizeof(*words);
  for (size_t i = 0; i < n; i += 512) words[i] = i * 2654435761u;
  int ok = 1;
  for (size_t i = 0; i < n; i += 512) ok &= words[i] == i * 2654435761u;
  vma_of(p, &huge, &hg);
  long tail_hg = -1, tail_huge = -1;
  vma_of((char *)p + bytes - 4096, &tail_huge, &tail_hg);
  printf("%s rss_kib=%ld huge_kib=%ld hg=%ld tail_hg=%ld data=%s\n", name, rss, huge, hg, tail_hg, ok ? "ok" : "bad");
}

int main(int argc, char **argv) {
  size_t bytes = (size_t)atol(argc > 1 ? argv[1] : "64") << 20;
  if (cuInit(0) != CUDA_SUCCESS) return 2;
  void *driver = fake_cuda_checkpoint_buffer(bytes);
  void *own = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (!driver || own == MAP_FAILED) return 3;
  report("driver", driver, bytes);
  report("own", own, bytes);
  return 0;
}
