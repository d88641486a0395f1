#include "tests/support/bf16_model_dir.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "workers/io/hf_export.h"
#include "workers/models/layers.h"

namespace rp::testing {

int64_t WriteBf16ModelDir(const std::string& dir, const spec::ModelConfig& c, bool sparse) {
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << workers::io::HfConfigJson(c, at::kBFloat16);
  nlohmann::json header = nlohmann::json::object();
  std::vector<workers::models::ParamSpec> params;
  uint64_t offset = 0;
  for (const auto& p : workers::models::ModelParams(c)) {
    if (p.lora != 0) continue;
    uint64_t n = 2;
    for (int64_t d : p.shape) n *= static_cast<uint64_t>(d);
    header[p.name] = {{"dtype", "BF16"}, {"shape", p.shape}, {"data_offsets", {offset, offset + n}}};
    offset += n;
    params.push_back(p);
  }
  std::string h = header.dump();
  h.resize((h.size() + 7) / 8 * 8, ' ');  // 8-byte aligned data, as the safetensors library writes
  std::ofstream out(dir + "/model.safetensors", std::ios::binary);
  const uint64_t hn = h.size();
  out.write(reinterpret_cast<const char*>(&hn), 8);
  out.write(h.data(), static_cast<std::streamsize>(h.size()));
  if (sparse) {
    out.close();
    std::filesystem::resize_file(dir + "/model.safetensors", 8 + h.size() + offset);
    return static_cast<int64_t>(offset);
  }
  std::vector<uint16_t> buf(1 << 19);
  uint64_t state = 0x9e3779b97f4a7c15ull;
  for (const auto& p : params) {
    uint64_t left = 1;
    for (int64_t d : p.shape) left *= static_cast<uint64_t>(d);
    while (left > 0) {
      const size_t k = static_cast<size_t>(std::min<uint64_t>(left, buf.size()));
      for (size_t i = 0; i < k; ++i) {
        state ^= state << 13, state ^= state >> 7, state ^= state << 17;
        const float f = p.is_norm ? 1.0f : (static_cast<float>(state >> 40) / 16777216.0f - 0.5f) * 0.06f;
        uint32_t bits;
        std::memcpy(&bits, &f, 4);
        buf[i] = static_cast<uint16_t>(bits >> 16);
      }
      out.write(reinterpret_cast<const char*>(buf.data()), static_cast<std::streamsize>(2 * k));
      left -= k;
    }
  }
  return static_cast<int64_t>(offset);
}

}  // namespace rp::testing
