// Validation by checksum, the engine's decisions (plugin/src/engine/
// sum_check.h): a copy checked against the freeze, recopy's final pass
// planned from fingerprints whatever the dirty marks say, and what a refused
// image says.
#include <catch2/catch.hpp>
#include <chrono>

#include "phos/plugin/sum_check.h"
#include "phos/images/copy_state.h"

using namespace phos;
using namespace phos::plugin::sum_check;
using namespace std::chrono_literals;
using copystate::CopyState;

namespace {

constexpr uint64_t kChunk = 4096;

CopyState recopy_table(uint64_t chunks) {
  auto s = CopyState::create(CopyProtocol::kSoftRecopy, kChunk,
                             std::vector<copystate::Region>{{.id = 1, .address = 0x100000, .size = chunks * kChunk}}, 0);
  REQUIRE(s.ok());
  return std::move(s.value());
}

Result<void> no_save(uint64_t, uint64_t, uint32_t) { return make_error("no save expected"); }

// The first pass: every chunk copied, each copy's fingerprint its index.
ChunkSums first_pass(CopyState& table) {
  ChunkSums image(table.chunk_count());
  while (auto c = table.claim_next()) {
    image.set(c->chunk, 1000 + c->chunk);
    table.copied(*c);
  }
  return image;
}

ChunkSums unchanged(uint64_t chunks) {
  ChunkSums now(chunks);
  for (uint64_t c = 0; c < chunks; c++) now.set(c, 1000 + c);
  return now;
}

}  // namespace

TEST_CASE("chunk sums: a zero flag only where the chunk's fingerprint was taken all zero", "[sum_check]") {
  ChunkSums sums(4);
  sums.set(0, 11, true);
  sums.set(1, 12);
  sums.set(2, 13, false);
  CHECK(sums.zero(0));
  CHECK_FALSE(sums.zero(1));
  CHECK_FALSE(sums.zero(2));
  CHECK_FALSE(sums.zero(3));  // never taken
  CHECK_FALSE(sums.zero(9));  // outside the table
  CHECK(sums.get(0) == std::optional<uint64_t>(11));  // a zero chunk's fingerprint is kept
  sums.set(0, 21);  // taken again with data: no longer zero
  CHECK_FALSE(sums.zero(0));
  CHECK(sums.get(0) == std::optional<uint64_t>(21));
}

TEST_CASE("sum check: a copy matches only the fingerprint of its own chunk", "[sum_check]") {
  ChunkSums t0(4);
  t0.set(0, 11);
  t0.set(2, 33);
  CHECK(matches(t0, 0, 11));
  CHECK_FALSE(matches(t0, 0, 12));
  CHECK_FALSE(matches(t0, 2, 11));
  CHECK_FALSE(matches(t0, 1, 0));   // no fingerprint taken: cannot be shown equal
  CHECK_FALSE(matches(t0, 9, 11));  // past the table
  t0.set(9, 5);                     // ignored
  CHECK_FALSE(t0.get(9));
  CHECK(t0.get(2) == 33u);
  CHECK(ChunkSums().empty());
}

TEST_CASE("sum check: nothing changed, nothing dirty: the final pass copies nothing", "[sum_check][recopy]") {
  CopyState table = recopy_table(8);
  ChunkSums image = first_pass(table);
  FinalPass plan = plan_final_pass(table, image, unchanged(8));
  CHECK(plan.copy.empty());
  CHECK(plan.not_copied == 0);
  CHECK(plan.changed == 0);
  CHECK(plan.missed == 0);
  CHECK(plan.unchanged_dirty == 0);
}

TEST_CASE("sum check: a chunk changed without a dirty mark is copied again and counted missed",
          "[sum_check][recopy]") {
  CopyState table = recopy_table(8);
  ChunkSums image = first_pass(table);
  ChunkSums now = unchanged(8);
  now.set(5, 7);  // a write speculation did not see
  FinalPass plan = plan_final_pass(table, image, now);
  CHECK(plan.copy == std::vector<uint64_t>{5});
  CHECK(plan.changed == 1);
  CHECK(plan.missed == 1);
}

TEST_CASE("sum check: a dead chunk is neither copied again nor counted, whatever changed",
          "[sum_check][recopy][dead]") {
  CopyState table = recopy_table(8);
  ChunkSums image = first_pass(table);
  ChunkSums now = unchanged(8);
  now.set(5, 7);  // changed: scratch the program wrote, free at the final closing
  now.set(6, 8);  // changed, and live
  FinalPass plan = plan_final_pass(table, image, now, [](uint64_t c) { return c == 5; });
  CHECK(plan.copy == std::vector<uint64_t>{6});
  CHECK(plan.changed == 1);
  CHECK(plan.missed == 1);
}

TEST_CASE("sum check: a dirty chunk that did not change keeps its copy", "[sum_check][recopy]") {
  CopyState table = recopy_table(8);
  ChunkSums image = first_pass(table);
  REQUIRE(table.before_write(0x100000 + 2 * kChunk, 16, no_save, 100ms).ok());  // marked, wrote the same bytes
  REQUIRE(table.before_write(0x100000 + 3 * kChunk, 16, no_save, 100ms).ok());  // marked, and changed
  ChunkSums now = unchanged(8);
  now.set(3, 99);
  FinalPass plan = plan_final_pass(table, image, now);
  CHECK(plan.copy == std::vector<uint64_t>{3});
  CHECK(plan.changed == 1);
  CHECK(plan.missed == 0);
  CHECK(plan.unchanged_dirty == 1);
}

TEST_CASE("sum check: chunks the first pass did not copy are all copied, dirty or not", "[sum_check][recopy]") {
  CopyState table = recopy_table(6);
  ChunkSums image(6);
  // The first pass took chunks 0 and 1, then stopped (its time limit); the
  // process dirtied chunk 4, so a pass would have skipped it anyway.
  for (int i = 0; i < 2; i++) {
    auto c = table.claim_next();
    REQUIRE(c);
    image.set(c->chunk, 1000 + c->chunk);
    table.copied(*c);
  }
  REQUIRE(table.before_write(0x100000 + 4 * kChunk, 8, no_save, 100ms).ok());
  FinalPass plan = plan_final_pass(table, image, unchanged(6));
  CHECK(plan.copy == std::vector<uint64_t>{2, 3, 4, 5});
  CHECK(plan.not_copied == 4);
  CHECK(plan.changed == 0);
}

TEST_CASE("sum check: a copy without its fingerprint is copied again, but is no miss", "[sum_check][recopy]") {
  CopyState table = recopy_table(3);
  ChunkSums image = first_pass(table);
  ChunkSums partial(3);  // T1 missing for chunk 1, the copy's for chunk 2
  partial.set(0, 1000);
  partial.set(2, 1002);
  ChunkSums image_partial(3);
  image_partial.set(0, 1000);
  image_partial.set(1, 1001);
  FinalPass plan = plan_final_pass(table, image_partial, partial);
  CHECK(plan.copy == std::vector<uint64_t>{1, 2});
  CHECK(plan.changed == 2);
  CHECK(plan.missed == 0);
  (void)image;
}

TEST_CASE("sum check: a final pass carried out leaves the table whole", "[sum_check][recopy]") {
  CopyState table = recopy_table(8);
  ChunkSums image = first_pass(table);
  table.mark_all_dirty();  // a call the hooks could not read, before checksum trust
  ChunkSums now = unchanged(8);
  now.set(6, 1);
  FinalPass plan = plan_final_pass(table, image, now);
  CHECK(plan.copy == std::vector<uint64_t>{6});
  CHECK(plan.unchanged_dirty == 7);
  // What the engine does with it: the changed claimed again, the rest kept.
  for (uint64_t c : plan.copy) {
    auto claim = table.claim_again(c);
    REQUIRE(claim);
    table.copied(*claim);
  }
  for (uint64_t c = 0; c < table.chunk_count(); c++) table.clear_dirty(c);
  CHECK(table.all_copied());
}

TEST_CASE("sum check: a refused chunk is named with its allocation, offset and source", "[sum_check][refusal]") {
  ChunkPlace p{.chunk = 913, .allocation_id = 17, .address = 0x7f2a40000000ull, .offset = 52ull << 20};
  CHECK(describe_place(p) ==
        "chunk 913 (allocation #17 at 0x7f2a40000000, offset 52 MiB, from the process's memory)");
  p.from_pool = true;
  p.offset = 64 << 10;
  CHECK(describe_place(p) == "chunk 913 (allocation #17 at 0x7f2a40000000, offset 64 KiB, from its pool slot)");
  p.offset = 0;
  CHECK(describe_place(p).find("offset 0 bytes") != std::string::npos);
}

TEST_CASE("sum check: one miss and many misses read differently; all are counted", "[sum_check][refusal]") {
  Misses one;
  one.add({.chunk = 3, .allocation_id = 2, .address = 0x1000, .offset = 4 << 20});
  CHECK(describe_misses(one, Against::kFreeze) ==
        "chunk 3 (allocation #2 at 0x1000, offset 4 MiB, from the process's memory) differs from its content at "
        "the freeze: a write that speculation missed reached it before its copy");
  Misses many;
  for (uint64_t c = 0; c < 40; c++) many.add({.chunk = c, .allocation_id = 1});
  CHECK(many.count() == 40);
  CHECK(many.named().size() == Misses::kNamed);
  CHECK(describe_misses(many, Against::kFreeze).rfind("40 chunks differ from their content at the freeze, first chunk 0", 0) == 0);
  CHECK(describe_misses(one, Against::kFinalPass).find("changed while the process was stopped") != std::string::npos);
  CHECK(describe_misses(Misses{}, Against::kFreeze) == "no chunk differed");
}

TEST_CASE("sum check: the refusal names the kernels trusted on speculation, most launched first",
          "[sum_check][refusal]") {
  std::vector<agent::KernelLaunches> kernels{{"fused_adamw", 212}, {"my_scatter", 40}};
  const std::string r = refusal("chunk 913 (...) differs from its content at the freeze", kernels, 2,
                                {{"my_scatter", 40}});
  CHECK(r ==
        "chunk 913 (...) differs from its content at the freeze; launches that pointed into the changed chunk's "
        "buffer without it in their speculated write set (the likely writers): my_scatter (40 launches); kernels "
        "trusted on speculation in the window: fused_adamw (212 launches), my_scatter (40); the image is refused "
        "(no completion marker); the process runs on; its next dumps copy while it is stopped");
  CHECK(describe_kernels(kernels, 30).find("my_scatter (40) and 28 more") != std::string::npos);
  CHECK(describe_kernels({{"k", 1}}, 1) == "kernels trusted on speculation in the window: k (1 launch)");
  CHECK(describe_kernels({}, 0).find("no kernel ran on a trusted speculated set") == 0);
}
