// An export polls its StopCheck before every tensor (a cancelled RPC, a daemon drain): a stop
// ends it with the check's status and leaves neither the target nor a temporary behind, in each
// format (a Hugging Face directory, a PEFT adapter, merged LoRA weights).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "scheduler/runtime/export.h"
#include "workers/store/host_model_store.h"

namespace rp::scheduler::runtime {
namespace {

namespace fs = std::filesystem;

spec::ModelConfig Tiny(int lora_rank) {
  spec::ModelConfig c;
  c.family = "llama";
  c.vocab = 16;
  c.hidden = 8;
  c.intermediate = 16;
  c.num_blocks = 2;
  c.num_heads = 2;
  c.num_kv_heads = 1;
  c.head_dim = 4;
  if (lora_rank > 0) {
    c.lora.rank = lora_rank;
    c.lora.alpha = 16;
    c.lora.targets = {"q_proj", "v_proj"};
  }
  return c;
}

// Everything left in `parent`: the target and any temporary sibling of it.
std::vector<std::string> Entries(const fs::path& parent) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(parent)) out.push_back(e.path().filename().string());
  return out;
}

TEST(ExportStop, AStopBeforeAnyTensorEndsTheExportWithItsStatusAndLeavesNothing) {
  const fs::path root = fs::temp_directory_path() / ("rp_export_stop_" + std::to_string(getpid()));
  fs::remove_all(root);
  fs::create_directories(root);
  struct Case {
    int lora_rank;
    ExportKind kind;
  };
  for (const Case& k :
       {Case{0, ExportKind::kHfModel}, Case{4, ExportKind::kPeftAdapter}, Case{4, ExportKind::kMergedLora}}) {
    const spec::ModelConfig config = Tiny(k.lora_rank);
    workers::HostModelStore store(config, at::kFloat, 1);
    std::vector<ParameterShape> shapes;
    for (int i = 0; i < store.num_params(); ++i) shapes.push_back({store.param(i).name, store.param(i).shape});
    int fetched = 0;
    const TensorFetch fetch = [&](const std::string& n) -> absl::StatusOr<at::Tensor> {
      ++fetched;
      return at::randn(store.param(store.FindParam(n)).shape);
    };
    // Each case stops after 0, 1, 2, ... tensors, until the export no longer reaches the stop.
    for (int allowed = 0;; ++allowed) {
      SCOPED_TRACE("rank " + std::to_string(k.lora_rank) + ", kind " + std::to_string(static_cast<int>(k.kind)) +
                   ", stop after " + std::to_string(allowed) + " tensors");
      int checks = 0;
      fetched = 0;
      const StopCheck stop = [&]() -> absl::Status {
        return checks++ < allowed ? absl::OkStatus() : absl::CancelledError("the client cancelled the export");
      };
      const fs::path dir = root / ("out-" + std::to_string(allowed));
      auto bytes = WriteExport(dir.string(), config, shapes, fetch, at::kFloat, k.kind, stop);
      if (bytes.ok()) {  // finished before its stop: every check came before a tensor
        EXPECT_EQ(fetched, checks);
        EXPECT_TRUE(fs::exists(dir));
        EXPECT_GT(allowed, 0);
        break;
      }
      EXPECT_EQ(bytes.status().code(), absl::StatusCode::kCancelled) << bytes.status();
      EXPECT_NE(bytes.status().message().find("cancelled the export"), std::string::npos) << bytes.status();
      EXPECT_EQ(fetched, allowed);  // no tensor read after the stop
      EXPECT_TRUE(Entries(root).empty()) << "left behind: " << Entries(root).front();
      ASSERT_LT(allowed, 200);
    }
    fs::remove_all(root);
    fs::create_directories(root);
  }
  fs::remove_all(root);
}

}  // namespace
}  // namespace rp::scheduler::runtime
