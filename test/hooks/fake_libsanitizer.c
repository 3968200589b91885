/* A fake libsanitizer-public.so for libphos.so's SASS-level validator
 * (sass_validation.h), without a GPU: it keeps which modules are patched,
 * with which patch functions, and the callback data set per function, and
 * the fake libcuda's launch of a patched kernel runs "the patch" on the
 * kernel's writes with that data (fake_libcuda_module.c). Like driver 580's,
 * it refuses patches (INVALID_PARAMETER) when it subscribed after cuInit. */
#include <cuda.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* FAKE_SANITIZER_LOG=FILE: each patch, unpatch and callback-data call, a
 * line each (handles print as the fake libcuda's names). */
static void note(const char *what, const void *handle, const char *detail) {
  const char *path = getenv("FAKE_SANITIZER_LOG");
  FILE *f = path && *path ? fopen(path, "a") : NULL;
  if (!f) return;
  fprintf(f, "%s %s%s%s\n", what, handle ? (const char *)handle : "-", detail ? " " : "", detail ? detail : "");
  fclose(f);
}

enum { kSuccess = 0, kInvalidParameter = 1, kMaxLimitReached = 10 };
#define MAX_ENTRIES 64

static int subscribed, subscribed_late, patches_added;
static struct { CUmodule module; int patched, instructions; } modules[MAX_ENTRIES];
static struct { CUfunction f; const void *data; } callback_data[MAX_ENTRIES];

int sanitizerGetResultString(int r, const char **s) {
  *s = r == kSuccess ? "No error" : "One or more of the parameters is invalid";
  return kSuccess;
}

int sanitizerSubscribe(void **handle, void *callback, void *userdata) {
  (void)callback; (void)userdata;
  if (subscribed) return kMaxLimitReached;
  int *initialized = (int *)dlsym(RTLD_DEFAULT, "fake_cuda_initialized");
  subscribed_late = initialized && *initialized;
  subscribed = 1;
  *handle = &subscribed;
  return kSuccess;
}

int sanitizerAddPatches(const void *image, CUcontext ctx) {
  (void)ctx;
  const uint32_t fatbin_magic = 0xBA55ED50u;
  if (subscribed_late || !image || memcmp(image, &fatbin_magic, 4) != 0) return kInvalidParameter;
  patches_added++;
  return kSuccess;
}

static int module_slot(CUmodule m) {
  for (int i = 0; i < MAX_ENTRIES; i++)
    if (modules[i].module == m) return i;
  for (int i = 0; i < MAX_ENTRIES; i++)
    if (!modules[i].module) return modules[i].module = m, i;
  return -1;
}

int sanitizerPatchInstructions(int instruction, CUmodule m, const char *callback) {
  int known = (instruction == 3 && !strcmp(callback, "phos_sass_global_access")) ||
              ((instruction == 35 || instruction == 37) && !strcmp(callback, "phos_sass_bulk_to_global"));
  int i = module_slot(m);
  if (!patches_added || !known || i < 0) return kInvalidParameter;
  modules[i].instructions++;
  return kSuccess;
}

int sanitizerPatchModule(CUmodule m) {
  int i = module_slot(m);
  if (i < 0 || !modules[i].instructions) return kInvalidParameter;
  modules[i].patched++;
  note("patch", m, NULL);
  return kSuccess;
}

int sanitizerUnpatchModule(CUmodule m) {
  int i = module_slot(m);
  if (i < 0) return kInvalidParameter;
  modules[i].patched = modules[i].instructions = 0;
  note("unpatch", m, NULL);
  return kSuccess;
}

int sanitizerSetCallbackData(CUfunction f, const void *data) {
  for (int i = 0; i < MAX_ENTRIES; i++)
    if (callback_data[i].f == f || !callback_data[i].f) {
      callback_data[i].f = f;
      callback_data[i].data = data;
      note("data", f, data ? "set" : "clear");
      return kSuccess;
    }
  return kInvalidParameter;
}

/* For the fake libcuda: whether `m` is patched (how many times), and the
 * table f's next launch passes. */
int fake_sanitizer_patched(CUmodule m) {
  for (int i = 0; i < MAX_ENTRIES; i++)
    if (modules[i].module == m) return modules[i].patched;
  return 0;
}
const void *fake_sanitizer_data(CUfunction f) {
  for (int i = 0; i < MAX_ENTRIES; i++)
    if (callback_data[i].f == f) return callback_data[i].data;
  return NULL;
}
