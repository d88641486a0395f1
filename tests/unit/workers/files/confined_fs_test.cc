// confined_fs and AtomicDir against a real directory tree: symlink escapes (absolute, relative,
// through "..", swapped in after the fact), FIFOs, devices, oversized files, deletion through
// symlinks, for both the openat2 path and the O_NOFOLLOW walk. A sentinel tree outside the root
// must never change. No LibTorch.
#include "workers/files/confined_fs.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "workers/files/atomic_dir.h"

namespace rp::files {
namespace {
namespace fs = std::filesystem;

class ConfinedFs : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    base_ = (fs::temp_directory_path() / ("rp_confined_" + std::to_string(getpid()))).string();
    fs::remove_all(base_);
    root_ = base_ + "/root";
    out_ = base_ + "/outside";
    fs::create_directories(root_ + "/sub");
    fs::create_directories(out_ + "/victim");
    std::ofstream(out_ + "/secret") << "secret";
    std::ofstream(out_ + "/victim/file") << "keep me";
    std::ofstream(root_ + "/sub/ok.txt") << "hello";
    ASSERT_TRUE(ConfineTo({root_}).ok());
    UseOpenat2ForTest(GetParam());
  }
  void TearDown() override {
    EXPECT_EQ(Read(out_ + "/secret"), "secret");
    EXPECT_EQ(Read(out_ + "/victim/file"), "keep me");
    UseOpenat2ForTest(true);
    ASSERT_TRUE(ConfineTo({}).ok());
    fs::remove_all(base_);
  }
  static std::string Read(const std::string& p) {
    std::ifstream in(p);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  std::string base_, root_, out_;
};

TEST_P(ConfinedFs, ReadsStayBeneathTheRoot) {
  auto ok = ReadSmallFile(root_ + "/sub/ok.txt", 100);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(*ok, "hello");
  EXPECT_EQ(ReadSmallFile(out_ + "/secret", 100).status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(ReadSmallFile(root_ + "/../outside/secret", 100).status().code(), absl::StatusCode::kPermissionDenied);
  fs::create_symlink(out_ + "/secret", root_ + "/abs-link");
  fs::create_symlink("../outside/secret", root_ + "/rel-link");
  fs::create_symlink(out_, root_ + "/dir-link");
  for (const char* p : {"/abs-link", "/rel-link", "/dir-link/secret"}) {
    auto r = ReadSmallFile(root_ + p, 100);
    ASSERT_FALSE(r.ok()) << p;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied) << p << ": " << r.status();
    EXPECT_EQ(r.status().message().find("secret\n"), std::string::npos);
  }
  // A relative link that stays inside (Hugging Face cache style) works with openat2.
  fs::create_symlink("sub/ok.txt", root_ + "/inside-link");
  auto inside = ReadSmallFile(root_ + "/inside-link", 100);
  if (GetParam()) {
    ASSERT_TRUE(inside.ok()) << inside.status();
    EXPECT_EQ(*inside, "hello");
  } else {
    EXPECT_EQ(inside.status().code(), absl::StatusCode::kPermissionDenied);  // the walk refuses every link
  }
}

TEST_P(ConfinedFs, OnlyRegularFilesAreReadAndNeverWithoutBound) {
  ASSERT_EQ(mkfifo((root_ + "/fifo").c_str(), 0644), 0);
  auto f = ReadSmallFile(root_ + "/fifo", 100);  // returns at once: O_NONBLOCK, then not regular
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(f.status().message().find("not a regular file"), std::string::npos);
  EXPECT_EQ(ReadSmallFile(root_ + "/sub", 100).status().code(), absl::StatusCode::kInvalidArgument);
  std::ofstream(root_ + "/big") << std::string(1000, 'x');
  EXPECT_EQ(ReadSmallFile(root_ + "/big", 999).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(ReadSmallFile(root_ + "/big", 1000).ok());
  EXPECT_EQ(ReadSmallFile(root_ + "/none", 10).status().code(), absl::StatusCode::kNotFound);
}

TEST_P(ConfinedFs, WritesAndDeletesNeverFollowALinkOut) {
  fs::create_symlink(out_ + "/victim", root_ + "/ckpts");
  EXPECT_FALSE(WriteNewFile(root_ + "/ckpts/new", "x").ok());
  EXPECT_FALSE(MakeDirs(root_ + "/ckpts/step-1").ok());
  EXPECT_FALSE(AtomicDir::Begin(root_ + "/ckpts/step-1").ok());
  // rm -rf of the link removes the link, not the directory it names.
  EXPECT_TRUE(RemoveTree(root_ + "/ckpts").ok());
  EXPECT_EQ(KindOf(root_ + "/ckpts"), FileKind::kMissing);
  // ... and of a path through it refuses.
  fs::create_symlink(out_ + "/victim", root_ + "/ckpts");
  EXPECT_FALSE(RemoveTree(root_ + "/ckpts/file").ok());
  // A tree with a link inside: the link goes, its target stays.
  fs::create_directories(root_ + "/tree/a");
  fs::create_symlink(out_ + "/victim", root_ + "/tree/a/link");
  std::ofstream(root_ + "/tree/a/f") << "f";
  EXPECT_TRUE(RemoveTree(root_ + "/tree").ok());
  EXPECT_FALSE(fs::exists(root_ + "/tree"));
  // WriteNewFile never replaces or follows what exists.
  fs::create_symlink(out_ + "/secret", root_ + "/planted");
  EXPECT_FALSE(WriteNewFile(root_ + "/planted", "overwritten").ok());
  EXPECT_EQ(WriteNewFile(root_ + "/sub/ok.txt", "x").code(), absl::StatusCode::kAlreadyExists);
  // A path component that is a file.
  std::ofstream(root_ + "/afile") << "x";
  EXPECT_EQ(MakeDirs(root_ + "/afile/d").code(), absl::StatusCode::kFailedPrecondition);
}

TEST_P(ConfinedFs, AtomicDirIsCompleteOrAbsentAndNeverReplaces) {
  {
    auto d = AtomicDir::Begin(root_ + "/out/step-1");
    ASSERT_TRUE(d.ok()) << d.status();
    ASSERT_TRUE(d->WriteFile("a", "1").ok());
  }  // abandoned: nothing left behind
  ASSERT_TRUE(fs::exists(root_ + "/out"));
  EXPECT_TRUE(fs::is_empty(root_ + "/out"));
  // A torn temporary from a crash is cleaned by the next write of the same target.
  fs::create_directories(root_ + "/out/.step-1.tmp-deadbeef");
  auto d = AtomicDir::Begin(root_ + "/out/step-1");
  ASSERT_TRUE(d.ok());
  ASSERT_TRUE(d->WriteFile("a", "1").ok());
  ASSERT_TRUE(d->Commit().ok());
  EXPECT_EQ(Read(root_ + "/out/step-1/a"), "1");
  EXPECT_FALSE(fs::exists(root_ + "/out/.step-1.tmp-deadbeef"));
  EXPECT_EQ(AtomicDir::Begin(root_ + "/out/step-1").status().code(), absl::StatusCode::kAlreadyExists);
  // The target appearing meanwhile is an error, not an overwrite.
  auto e = AtomicDir::Begin(root_ + "/out/step-2");
  ASSERT_TRUE(e.ok());
  fs::create_directories(root_ + "/out/step-2/theirs");
  EXPECT_FALSE(e->Commit().ok());
  EXPECT_TRUE(fs::exists(root_ + "/out/step-2/theirs"));
  EXPECT_EQ(AtomicDir::Begin(out_ + "/x").status().code(), absl::StatusCode::kPermissionDenied);
}

INSTANTIATE_TEST_SUITE_P(Resolve, ConfinedFs, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "openat2" : "nofollow_walk"; });

TEST(ConfinedFsUnconfined, PathsAreUsedAsGiven) {
  ASSERT_FALSE(Confined());
  const std::string d = (fs::temp_directory_path() / ("rp_unconfined_" + std::to_string(getpid()))).string();
  ASSERT_TRUE(MakeDirs(d + "/a/b").ok());
  ASSERT_TRUE(WriteNewFile(d + "/a/b/f", "x").ok());
  EXPECT_EQ(*ReadSmallFile(d + "/a/b/f", 10), "x");
  EXPECT_TRUE(RemoveTree(d).ok());
  EXPECT_FALSE(fs::exists(d));
}

}  // namespace
}  // namespace rp::files
