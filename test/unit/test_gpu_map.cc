#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "phos/plugin/gpu_map.h"

using namespace phos;
using namespace phos::plugin;

namespace {

std::array<uint8_t, 16> uuid_of(uint8_t tag) {
  std::array<uint8_t, 16> u{};
  u.fill(tag);
  return u;
}

GpuDevice image_device(uint32_t ordinal, uint8_t tag, std::string name = "NVIDIA H200") {
  GpuDevice d;
  d.ordinal = ordinal;
  d.uuid = uuid_of(tag);
  d.name = std::move(name);
  return d;
}

std::vector<GpuDevice> two_h200() {
  return {{.ordinal = 0, .uuid = uuid_of(0xaa), .name = "NVIDIA H200"},
          {.ordinal = 1, .uuid = uuid_of(0xbb), .name = "NVIDIA H200"}};
}

}  // namespace

TEST_CASE("gpu map: empty spec parses to nothing", "[gpu_map]") {
  auto s = parse_gpu_map("");
  REQUIRE(s);
  CHECK(s->empty());
  CHECK(parse_gpu_map("  ")->empty());
}

TEST_CASE("gpu map: ordinals and uuids parse", "[gpu_map]") {
  auto s = parse_gpu_map("0=1, GPU-bbbbbbbb-bbbb-bbbb-bbbb-bbbbbbbbbbbb = 0");
  REQUIRE(s);
  REQUIRE(s->size() == 2);
  CHECK((*s)[0].from == "0");
  CHECK((*s)[0].to == "1");
  CHECK((*s)[1].from == "GPU-bbbbbbbb-bbbb-bbbb-bbbb-bbbbbbbbbbbb");
}

TEST_CASE("gpu map: malformed entries are refused with the entry named", "[gpu_map]") {
  auto no_eq = parse_gpu_map("0-1");
  REQUIRE_FALSE(no_eq);
  CHECK(no_eq.error().message.find("'0-1': expected OLD=NEW") != std::string::npos);
  auto bad_side = parse_gpu_map("0=gpu1");
  REQUIRE_FALSE(bad_side);
  CHECK(bad_side.error().message.find("'gpu1' is neither an ordinal nor a GPU UUID") != std::string::npos);
}

TEST_CASE("gpu map: uuid formatting matches nvidia-smi's", "[gpu_map]") {
  std::array<uint8_t, 16> u{0xbb, 0x91, 0x9f, 0x8b, 0x05, 0x24, 0x4d, 0x60, 0x22, 0xee, 0x86, 0xdd, 0x49, 0x01, 0xab, 0x6b};
  CHECK(format_gpu_uuid(u) == "GPU-bb919f8b-0524-4d60-22ee-86dd4901ab6b");
}

TEST_CASE("gpu map: without a spec each GPU stays at its ordinal", "[gpu_map]") {
  auto p = place_gpus({}, {image_device(0, 0xaa), image_device(1, 0xbb)}, two_h200(), "m");
  REQUIRE(p);
  REQUIRE(p->size() == 2);
  CHECK((*p)[0].host_ordinal == 0);
  CHECK((*p)[1].host_ordinal == 1);
  CHECK_FALSE((*p)[0].moved());
}

TEST_CASE("gpu map: an ordinal spec moves a GPU onto another", "[gpu_map]") {
  auto p = place_gpus(*parse_gpu_map("0=1"), {image_device(0, 0xaa)}, two_h200(), "m");
  REQUIRE(p);
  CHECK((*p)[0].host_ordinal == 1);
  CHECK((*p)[0].host_uuid == uuid_of(0xbb));
  CHECK((*p)[0].moved());
}

TEST_CASE("gpu map: a swap of two GPUs by uuid", "[gpu_map]") {
  auto spec = parse_gpu_map(format_gpu_uuid(uuid_of(0xaa)) + "=" + format_gpu_uuid(uuid_of(0xbb)) + "," +
                            format_gpu_uuid(uuid_of(0xbb)) + "=" + format_gpu_uuid(uuid_of(0xaa)));
  REQUIRE(spec);
  auto p = place_gpus(*spec, {image_device(0, 0xaa), image_device(1, 0xbb)}, two_h200(), "m");
  REQUIRE(p);
  CHECK((*p)[0].host_ordinal == 1);
  CHECK((*p)[1].host_ordinal == 0);
}

TEST_CASE("gpu map: a device the host lacks is refused", "[gpu_map]") {
  auto p = place_gpus({}, {image_device(2, 0xcc)}, two_h200(), "phos-7-manifest.img");
  REQUIRE_FALSE(p);
  CHECK(p.error().message == "phos-7-manifest.img: device 2 (NVIDIA H200): this host has no GPU 2");
}

TEST_CASE("gpu map: another model is refused with both names", "[gpu_map]") {
  auto p = place_gpus({}, {image_device(0, 0xaa, "NVIDIA A100-SXM4-80GB")}, two_h200(), "m");
  REQUIRE_FALSE(p);
  CHECK(p.error().message.find("a NVIDIA H200; restoring needs the same model") != std::string::npos);
  CHECK(p.error().message.find("NVIDIA A100-SXM4-80GB") != std::string::npos);
}

TEST_CASE("gpu map: two image GPUs onto one host GPU are refused", "[gpu_map]") {
  auto p = place_gpus(*parse_gpu_map("1=0"), {image_device(0, 0xaa), image_device(1, 0xbb)}, two_h200(), "m");
  REQUIRE_FALSE(p);
  CHECK(p.error().message.find("two of the image's GPUs would go to GPU 0") != std::string::npos);
}

TEST_CASE("gpu map: a uuid the image does not have is refused", "[gpu_map]") {
  auto p = place_gpus(*parse_gpu_map(format_gpu_uuid(uuid_of(0x11)) + "=1"), {image_device(0, 0xaa)}, two_h200(), "m");
  REQUIRE_FALSE(p);
  CHECK(p.error().message.find("which the image does not have") != std::string::npos);
}

TEST_CASE("gpu map: no driver pairs when nothing moves", "[gpu_map]") {
  auto p = place_gpus({}, {image_device(0, 0xaa)}, two_h200(), "m");
  CHECK(driver_gpu_pairs(*p, two_h200()).empty());
}

TEST_CASE("gpu map: a move gives pairs for every host GPU, as a permutation", "[gpu_map]") {
  auto p = place_gpus(*parse_gpu_map("0=1"), {image_device(0, 0xaa)}, two_h200(), "m");
  auto pairs = driver_gpu_pairs(*p, two_h200());
  REQUIRE(pairs.size() == 2);
  CHECK(pairs[0] == std::make_pair(uuid_of(0xaa), uuid_of(0xbb)));
  CHECK(pairs[1] == std::make_pair(uuid_of(0xbb), uuid_of(0xaa)));  // takes the GPU the move freed
}

TEST_CASE("gpu map: GPUs a move does not touch keep their place", "[gpu_map]") {
  std::vector<GpuDevice> three = two_h200();
  three.push_back({.ordinal = 2, .uuid = uuid_of(0xcc), .name = "NVIDIA H200"});
  auto p = place_gpus(*parse_gpu_map("0=1,1=0"), {image_device(0, 0xaa), image_device(1, 0xbb)}, three, "m");
  auto pairs = driver_gpu_pairs(*p, three);
  REQUIRE(pairs.size() == 3);
  CHECK(pairs[2] == std::make_pair(uuid_of(0xcc), uuid_of(0xcc)));
}

TEST_CASE("gpu map: without a spec a GPU goes where its UUID is, whatever the process called it", "[gpu_map]") {
  // A process run with CUDA_VISIBLE_DEVICES=1 calls the host's GPU 1 its device 0.
  auto p = place_gpus({}, {image_device(0, 0xbb)}, two_h200(), "m");
  REQUIRE(p);
  CHECK((*p)[0].host_ordinal == 1);
  CHECK_FALSE((*p)[0].moved());
}

TEST_CASE("gpu map: a process's devices are found in criu's numbering by UUID", "[gpu_map]") {
  std::vector<GpuDevice> devices{{.ordinal = 0, .uuid = uuid_of(0xbb)}, {.ordinal = 1, .uuid = uuid_of(0xaa)}};
  auto o = host_ordinals(devices, two_h200());
  REQUIRE(o);
  CHECK(*o == std::map<uint32_t, int>{{0, 1}, {1, 0}});
  auto none = host_ordinals({}, two_h200());  // an agent that names no UUIDs
  REQUIRE(none);
  CHECK(none->empty());
}

TEST_CASE("gpu map: a process's device that criu does not see is refused, UUID named", "[gpu_map]") {
  auto o = host_ordinals({{0, uuid_of(0xcc)}}, two_h200());
  REQUIRE_FALSE(o);
  CHECK(o.error().message.find("the process's device 0 is " + format_gpu_uuid(uuid_of(0xcc)) + ", which criu does not see") == 0);
}

// --- a migration's device map (migrate_to SRC:DST,..., phosctl migrate --gpu-map) ---

namespace {

std::vector<GpuDevice> host_of(size_t n, const std::string& name = "NVIDIA H200") {
  std::vector<GpuDevice> host;
  for (size_t i = 0; i < n; i++) host.push_back({.ordinal = uint32_t(i), .uuid = uuid_of(uint8_t(0xa0 + i)), .name = name});
  return host;
}

std::string targets_error(const std::string& spec, const std::set<int>& sources, const std::vector<GpuDevice>& host) {
  auto t = migration_targets(spec, sources, host);
  REQUIRE_FALSE(t);
  return t.error().message;
}

}  // namespace

TEST_CASE("migration map: SRC:DST entries parse, ordinals and UUIDs", "[gpu_map][migrate]") {
  CHECK(is_migration_map("0:1"));
  CHECK_FALSE(is_migration_map("1"));
  CHECK_FALSE(is_migration_map("GPU-bbbbbbbb-bbbb-bbbb-bbbb-bbbbbbbbbbbb"));
  auto s = parse_migration_map(" 0:1 , 1 : GPU-bbbbbbbb-bbbb-bbbb-bbbb-bbbbbbbbbbbb");
  REQUIRE(s);
  REQUIRE(s->size() == 2);
  CHECK((*s)[0].from == "0");
  CHECK((*s)[0].to == "1");
  CHECK((*s)[1].to == "GPU-bbbbbbbb-bbbb-bbbb-bbbb-bbbbbbbbbbbb");
  CHECK(describe_migration_map(*s) == "0:1,1:GPU-bbbbbbbb-bbbb-bbbb-bbbb-bbbbbbbbbbbb");
  // SRC=DST as gpu_map writes its pairs, the same map.
  CHECK(is_migration_map("0=1,1=0"));
  auto eq = parse_migration_map("0=1,1=0");
  REQUIRE(eq);
  CHECK(describe_migration_map(*eq) == "0:1,1:0");
  auto t = migration_targets("0=1,1=0", {0, 1}, host_of(2));
  REQUIRE(t);
  CHECK(*t == std::map<int, int>{{0, 1}, {1, 0}});
}

TEST_CASE("migration map: malformed maps are refused, the entry named", "[gpu_map][migrate]") {
  auto empty = parse_migration_map(" ");
  REQUIRE_FALSE(empty);
  CHECK_THAT(empty.error().message, Catch::Contains("an empty GPU map"));
  auto no_colon = parse_migration_map("0:1,1");
  REQUIRE_FALSE(no_colon);
  CHECK_THAT(no_colon.error().message, Catch::Contains("'1': expected SRC:DST"));
  auto bad_side = parse_migration_map("0:gpu1");
  REQUIRE_FALSE(bad_side);
  CHECK_THAT(bad_side.error().message, Catch::Contains("'gpu1' is neither an ordinal nor a GPU UUID"));
  auto half = parse_migration_map("0:");
  REQUIRE_FALSE(half);
  CHECK_THAT(half.error().message, Catch::Contains("'0:': '' is neither"));
}

TEST_CASE("migration map: a swap maps each GPU of the process to the other", "[gpu_map][migrate]") {
  auto t = migration_targets("0:1,1:0", {0, 1}, host_of(2));
  REQUIRE(t);
  CHECK(*t == std::map<int, int>{{0, 1}, {1, 0}});
  // By UUID, and an entry for a GPU the process does not use left out.
  auto u = migration_targets("GPU-a1a1a1a1-a1a1-a1a1-a1a1-a1a1a1a1a1a1:2,0:1", {1}, host_of(3));
  REQUIRE(u);
  CHECK(*u == std::map<int, int>{{1, 2}});
}

TEST_CASE("migration map: one GPU, as before maps", "[gpu_map][migrate]") {
  auto t = migration_targets("1", {0}, host_of(2));
  REQUIRE(t);
  CHECK(*t == std::map<int, int>{{0, 1}});
  auto none = migration_targets("1", {}, host_of(2));  // no device memory: nothing to move
  REQUIRE(none);
  CHECK(none->empty());
  CHECK_THAT(targets_error("1", {0, 1}, host_of(2)),
             Catch::Contains("the process uses 2 GPUs: name a target for each") && Catch::Contains("--gpu-map"));
  CHECK_THAT(targets_error("5", {0}, host_of(2)), Catch::Contains("this host has no GPU 5"));
}

TEST_CASE("migration map: refused where it is not one-to-one", "[gpu_map][migrate]") {
  CHECK_THAT(targets_error("0:1,1:1", {0, 1}, host_of(2)),
             Catch::Contains("GPU map entry 1:1: GPU 1 is already the target of 0:1; the map must be one-to-one"));
  CHECK_THAT(targets_error("0:1,0:0", {0, 1}, host_of(2)), Catch::Contains("GPU map entry 0:0: GPU 0 is mapped twice"));
  // The same GPU by ordinal and by UUID is still the same GPU.
  CHECK_THAT(targets_error("0:1,GPU-a0a0a0a0-a0a0-a0a0-a0a0-a0a0a0a0a0a0:0", {0}, host_of(2)),
             Catch::Contains("GPU 0 is mapped twice"));
}

TEST_CASE("migration map: refused where it names a GPU this host lacks", "[gpu_map][migrate]") {
  CHECK_THAT(targets_error("0:1,1:2", {0, 1}, host_of(2)),
             Catch::Contains("GPU map entry 1:2: this host has no GPU 2 (it has 2)"));
  CHECK_THAT(targets_error("3:0", {0}, host_of(2)), Catch::Contains("GPU map entry 3:0: this host has no GPU 3"));
  CHECK_THAT(targets_error("0:GPU-ffffffff-ffff-ffff-ffff-ffffffffffff", {0}, host_of(2)),
             Catch::Contains("this host has no GPU GPU-ffffffff"));
}

TEST_CASE("migration map: refused where one of the process's GPUs is left unmapped", "[gpu_map][migrate]") {
  CHECK_THAT(targets_error("0:1", {0, 1}, host_of(2)),
             Catch::Contains("the process uses GPU 1, which the GPU map 0:1 leaves unmapped"));
  CHECK_THAT(targets_error("2:3", {0}, host_of(4)), Catch::Contains("the process uses GPU 0, which the GPU map 2:3"));
}

TEST_CASE("migration map: refused onto another model", "[gpu_map][migrate]") {
  auto host = host_of(2);
  host[1].name = "NVIDIA H100";
  CHECK_THAT(targets_error("0:1,1:0", {0, 1}, host),
             Catch::Contains("the process's GPU 0 is a NVIDIA H200, GPU 1 a NVIDIA H100; the driver restores onto the "
                             "same model"));
  CHECK_THAT(targets_error("1", {0}, host), Catch::Contains("GPU 1 a NVIDIA H100"));
}

TEST_CASE("gpu map: a process on two GPUs swapped (a migration's targets by UUID) gives the swap's two pairs", "[gpu_map]") {
  // What place_kept asks for after `phosctl migrate --gpu-map 0:1,1:0`:
  // each image device by ordinal to its target's UUID.
  auto spec = parse_gpu_map("0=" + format_gpu_uuid(uuid_of(0xbb)) + ",1=" + format_gpu_uuid(uuid_of(0xaa)));
  REQUIRE(spec);
  auto p = place_gpus(*spec, {image_device(0, 0xaa), image_device(1, 0xbb)}, two_h200(), "m");
  REQUIRE(p);
  auto pairs = driver_gpu_pairs(*p, two_h200());
  REQUIRE(pairs.size() == 2);
  CHECK(pairs[0] == std::make_pair(uuid_of(0xaa), uuid_of(0xbb)));
  CHECK(pairs[1] == std::make_pair(uuid_of(0xbb), uuid_of(0xaa)));
}

TEST_CASE("gpu map: GPUs hidden from criu get pairs onto themselves when a GPU moves", "[gpu_map]") {
  // criu under CUDA_VISIBLE_DEVICES=0,1 on a host of 4: the driver wants all 4.
  std::vector<std::array<uint8_t, 16>> hidden = {uuid_of(0xcc), uuid_of(0xdd)};
  auto p = place_gpus(*parse_gpu_map("0=1,1=0"), {image_device(0, 0xaa), image_device(1, 0xbb)}, two_h200(), "m");
  REQUIRE(p);
  auto pairs = driver_gpu_pairs(*p, two_h200(), hidden);
  REQUIRE(pairs.size() == 4);
  CHECK(pairs[0] == std::make_pair(uuid_of(0xaa), uuid_of(0xbb)));
  CHECK(pairs[1] == std::make_pair(uuid_of(0xbb), uuid_of(0xaa)));
  CHECK(pairs[2] == std::make_pair(uuid_of(0xcc), uuid_of(0xcc)));
  CHECK(pairs[3] == std::make_pair(uuid_of(0xdd), uuid_of(0xdd)));
  // Nothing moves: still no pairs at all (the driver restores in place).
  auto still = place_gpus({}, {image_device(0, 0xaa)}, two_h200(), "m");
  CHECK(driver_gpu_pairs(*still, two_h200(), hidden).empty());
}

TEST_CASE("gpu map: the kernel driver's GPU list is read from its information files", "[gpu_map]") {
  auto dir = std::filesystem::temp_directory_path() / ("phos-gpus-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir / "0000:18:00.0");
  std::filesystem::create_directories(dir / "0000:2a:00.0");
  std::filesystem::create_directories(dir / "0000:3a:00.0");  // no information file: left out
  std::ofstream(dir / "0000:18:00.0" / "information") << "Model: \t\t NVIDIA H200\nIRQ:   \t\t 17\n"
                                                        << "GPU UUID: \t GPU-bbbbbbbb-bbbb-bbbb-bbbb-bbbbbbbbbbbb\n";
  std::ofstream(dir / "0000:2a:00.0" / "information") << "Model: \t\t NVIDIA H200\nGPU UUID: \t GPU-aaaaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaaaa\n";
  auto gpus = kernel_driver_gpus(dir.string());
  std::filesystem::remove_all(dir);
  REQUIRE(gpus.size() == 2);
  CHECK(gpus[0] == uuid_of(0xaa));
  CHECK(gpus[1] == uuid_of(0xbb));
  CHECK(kernel_driver_gpus("/nonexistent/phos").empty());
  CHECK_FALSE(parse_gpu_uuid("GPU-zzzzzzzz-aaaa-aaaa-aaaa-aaaaaaaaaaaa"));
  CHECK_FALSE(parse_gpu_uuid("aaaaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaaaa"));
}

TEST_CASE("gpu map: an image whose GPUs the kernel driver lists stays on them, without CUDA", "[gpu_map][stays]") {
  const auto image = two_h200();
  const std::vector<std::array<uint8_t, 16>> kernel = {uuid_of(0xbb), uuid_of(0xcc), uuid_of(0xaa)};
  CHECK(image_stays_on_its_gpus(image, kernel, false, true));
  // What place_gpus then does on a host that sees those GPUs: none moves,
  // so the driver's restore takes no pairs.
  const std::vector<GpuDevice> host = {{.ordinal = 0, .uuid = uuid_of(0xbb), .name = "NVIDIA H200"},
                                       {.ordinal = 1, .uuid = uuid_of(0xcc), .name = "NVIDIA H200"},
                                       {.ordinal = 2, .uuid = uuid_of(0xaa), .name = "NVIDIA H200"}};
  auto placed = place_gpus({}, image, host, "m");
  REQUIRE(placed.ok());
  for (const auto& p : *placed) CHECK_FALSE(p.moved());
  CHECK(driver_gpu_pairs(*placed, host).empty());
}

TEST_CASE("gpu map: an image that may move waits for criu's CUDA to place it", "[gpu_map][stays]") {
  const auto image = two_h200();
  const std::vector<std::array<uint8_t, 16>> both = {uuid_of(0xaa), uuid_of(0xbb)};
  CHECK_FALSE(image_stays_on_its_gpus(image, {uuid_of(0xaa)}, false, true));  // one GPU not on this host
  CHECK_FALSE(image_stays_on_its_gpus(image, {}, false, true));               // no kernel driver listing
  CHECK_FALSE(image_stays_on_its_gpus(image, both, true, true));              // a GPU map given
  CHECK_FALSE(image_stays_on_its_gpus(image, both, false, false));            // criu sees only some GPUs
  CHECK_FALSE(image_stays_on_its_gpus({}, both, false, true));                // no GPU named
}
