// The data-file digest a cluster job's nodes compare (server/file_digest.h): SHA-256 against
// FIPS 180-2's test vectors (one short, one over several read chunks), and no file but a regular
// one is read (a FIFO without a writer would block a reader forever).
#include "server/file_digest.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "tests/support/temp_dir.h"

namespace rp::server {
namespace {

TEST(FileDigest, Sha256MatchesTheStandardsVectorsAndReadsRegularFilesOnly) {
  const std::filesystem::path dir = rp::testing::FreshTempDir("server_test", "digest");
  std::ofstream(dir / "abc") << "abc";
  EXPECT_EQ(*Sha256OfFile((dir / "abc").string()), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  {
    std::ofstream million(dir / "million");
    million << std::string(1000000, 'a');  // FIPS 180-2's long message: 1,000,000 x 'a'
  }
  EXPECT_EQ(*Sha256OfFile((dir / "million").string()),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  {
    std::ofstream big(dir / "big");
    for (int i = 0; i < 10; ++i) big << std::string(1000000, 'a');  // 10 MB: three 4 MiB reads
  }
  auto big = Sha256OfFile((dir / "big").string());
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_NE(*big, *Sha256OfFile((dir / "million").string()));
  EXPECT_EQ(Sha256OfFile((dir / "big").string(), [] { return true; }).status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(Sha256OfFile((dir / "missing").string()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Sha256OfFile(dir.string()).status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_EQ(::mkfifo((dir / "fifo").c_str(), 0600), 0);
  EXPECT_EQ(Sha256OfFile((dir / "fifo").string()).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace rp::server
