// The token-file dataset the runner reads (.bin / .npy windows, labels, epochs, bad files).
#include "scheduler/runtime/token_dataset.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "tests/support/temp_dir.h"

namespace rp::scheduler::runtime {
namespace {
namespace fs = std::filesystem;

fs::path TempDir(const std::string& name) { return rp::testing::FreshTempDir("token_dataset_test", name); }

TEST(TokenDataset, BinWindowsShiftLabelsAndDropTheRemainder) {
  const fs::path d = TempDir("bin");
  std::ofstream out(d / "t.bin", std::ios::binary);
  for (uint16_t i = 0; i < 1000; ++i) out.write(reinterpret_cast<const char*>(&i), 2);
  out.close();
  auto ds = TokenDataset::Open((d / "t.bin").string(), TokenFileFormat::kAuto, 4, 10);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ((*ds)->num_tokens(), 1000);
  EXPECT_EQ((*ds)->batches_per_epoch(), 999 / 10 / 4);  // 24
  auto [t, l] = (*ds)->Batch(1);
  ASSERT_EQ(t.sizes(), (std::vector<int64_t>{4, 10}));
  EXPECT_EQ(t[0][0].item<int64_t>(), 40);  // batch 1 starts at window 4
  EXPECT_EQ(l[0][0].item<int64_t>(), 41);
  EXPECT_EQ(t[3][9].item<int64_t>(), 79);
  EXPECT_EQ(l[3][9].item<int64_t>(), 80);
  auto [t0, l0] = (*ds)->Batch((*ds)->batches_per_epoch());  // wraps to the next epoch
  EXPECT_EQ(t0[0][0].item<int64_t>(), 0);
  // Odd byte count for uint16, too small a file, a missing file.
  std::ofstream(d / "odd.bin") << "abc";
  auto odd = TokenDataset::Open((d / "odd.bin").string(), TokenFileFormat::kBinUint16, 1, 1);
  ASSERT_FALSE(odd.ok());
  EXPECT_NE(odd.status().message().find("whole number"), std::string::npos);
  EXPECT_FALSE(TokenDataset::Open((d / "t.bin").string(), TokenFileFormat::kAuto, 200, 10).ok());
  EXPECT_EQ(TokenDataset::Open((d / "none.bin").string(), TokenFileFormat::kAuto, 1, 1).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(TokenDataset, NpyHeaderIsParsedAndCheckedAgainstTheFileSize) {
  const fs::path d = TempDir("npy");
  auto write_npy = [&](const std::string& name, const std::string& descr, const std::string& shape, int count,
                       int bytes) {
    std::string header = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
    while ((10 + header.size() + 1) % 64 != 0) header += ' ';
    header += '\n';
    std::ofstream out(d / name, std::ios::binary);
    out.write("\x93NUMPY\x01\x00", 8);
    const uint16_t len = static_cast<uint16_t>(header.size());
    out.write(reinterpret_cast<const char*>(&len), 2);
    out << header;
    for (int i = 0; i < count; ++i) {
      const int64_t v = i % 7;
      out.write(reinterpret_cast<const char*>(&v), bytes);
    }
  };
  write_npy("u4.npy", "<u4", "(300,)", 300, 4);
  auto ds = TokenDataset::Open((d / "u4.npy").string(), TokenFileFormat::kAuto, 2, 8);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ((*ds)->num_tokens(), 300);
  auto [t, l] = (*ds)->Batch(0);
  EXPECT_EQ(t[1][0].item<int64_t>(), 8 % 7);
  write_npy("i8.npy", "<i8", "(10, 30)", 300, 8);
  EXPECT_TRUE(TokenDataset::Open((d / "i8.npy").string(), TokenFileFormat::kAuto, 2, 8).ok());
  write_npy("short.npy", "<u2", "(5000,)", 300, 2);
  auto s = TokenDataset::Open((d / "short.npy").string(), TokenFileFormat::kAuto, 2, 8);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("more data than the file holds"), std::string::npos) << s.status();
  write_npy("f4.npy", "<f4", "(300,)", 300, 4);
  EXPECT_FALSE(TokenDataset::Open((d / "f4.npy").string(), TokenFileFormat::kAuto, 2, 8).ok());
  std::ofstream(d / "junk.npy") << "not numpy at all";
  EXPECT_FALSE(TokenDataset::Open((d / "junk.npy").string(), TokenFileFormat::kAuto, 2, 8).ok());
}

}  // namespace
}  // namespace rp::scheduler::runtime
